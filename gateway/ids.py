"""Server-side identifiers: SMUIDs and login GUIDs.

An SMUID must be unique across every gateway and restart, never reused, and
sort in acceptance order (DESIGN "Spec decisions").  We use a Snowflake-style
number (:mod:`schemas.smuid`): 41 bits of milliseconds since 2025-01-01, 10
bits of gateway node id (configured, unique per gateway of a farm; the last
id is the streaming job's, for receipts), 12 bits of sequence.  It is
known before the Kafka append, so the event carries it; it stays a plain
number, so ``LIST MESSAGE`` can print ranges.
"""

from __future__ import annotations

import time
import uuid
from typing import Callable

from schemas.smuid import EPOCH_MS, MAX_GATEWAY_NODE_ID, MAX_SEQUENCE, compose


class SmuidFactory:
    """Monotonic SMUIDs for one gateway; robust to the clock stepping back."""

    def __init__(self, node_id: int, now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000):
        if not 0 <= node_id <= MAX_GATEWAY_NODE_ID:  # the last one is the streaming job's
            raise ValueError(f"gateway node_id must be 0..{MAX_GATEWAY_NODE_ID}, got {node_id}")
        self._node_id = node_id
        self._now_ms = now_ms
        self._last_ms = 0
        self._sequence = 0

    def __call__(self) -> int:
        now = self._now_ms() - EPOCH_MS
        if now > self._last_ms:
            self._last_ms, self._sequence = now, 0
        elif self._sequence < MAX_SEQUENCE:
            self._sequence += 1
        else:  # 4096 ids in one millisecond, or the clock went back: borrow the next millisecond
            self._last_ms, self._sequence = self._last_ms + 1, 0
        return compose(self._last_ms, self._node_id, self._sequence)


def new_guid(account: str) -> str:
    """A login GUID: the account name plus 12 random hex digits (spec section 3)."""
    return f"{account}{uuid.uuid4().hex[:12]}"
