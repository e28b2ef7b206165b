"""The SMUID layout, shared by the gateways (which number publishes) and the job (receipts).

A Snowflake-style number: 41 bits of milliseconds since 2025-01-01, 10 bits
of node id, 12 bits of sequence.  Gateways use node ids ``0 ..
MAX_GATEWAY_NODE_ID``; :data:`JOB_NODE_ID` is the streaming job's own, for
the messages it publishes itself (receipts), so no two ever collide.
"""

from __future__ import annotations

EPOCH_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z
NODE_BITS = 10
SEQUENCE_BITS = 12
MAX_SEQUENCE = (1 << SEQUENCE_BITS) - 1
JOB_NODE_ID = (1 << NODE_BITS) - 1
MAX_GATEWAY_NODE_ID = JOB_NODE_ID - 1


def compose(ms_since_epoch: int, node_id: int, sequence: int) -> int:
    """The SMUID of (milliseconds since :data:`EPOCH_MS`, node, sequence)."""
    return (ms_since_epoch << (NODE_BITS + SEQUENCE_BITS)) | (node_id << SEQUENCE_BITS) | sequence
