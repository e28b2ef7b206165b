"""SUBSCRIBE with SINCE on the driver: what it clears (spec 4.1.9.1).

The Python form of :func:`streaming.routing.withheld` and :func:`streaming.routing.cleared`, for
:func:`streaming.simple_batch.route`.  Why: a SUBSCRIBE whose SINCE clears sent its batch through the
routing query, seconds of planning on this host where the driver routes a batch in well under a
second, and on a loaded host it held everything the job does (DELIVERY ONE, expiry, receipts)
that long.  The query stays the definition: ``tests/streaming/test_simple_batch.py`` proves the two
equal.

Positions are (timestamp, partition, offset) tuples and times microseconds, as in
:mod:`streaming.simple_subscriptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Container

import pyarrow as pa

from schemas.topics import candidate_patterns
from streaming.simple_subscriptions import Interval, Position, position


@dataclass(frozen=True)
class Clearing:
    """A SUBSCRIBE of the batch with SINCE: ``account``'s messages accepted before ``since`` on the
    topics ``pattern`` matches are cleared, as of position ``at``."""

    account: str
    pattern: str
    since: int
    at: Position


def clearings(events: list[dict]) -> list[Clearing]:
    """The batch's SUBSCRIBEs with SINCE (``events``: valid decoded records)."""
    return [Clearing(e["account"], e["pattern"], e["since"], position(e))
            for e in events if e["type"] == "subscribe" and e["since"] is not None]


def withholds(clearing: list[Clearing], account: str, topic: str, accepted_at: int | None, at: Position) -> bool:
    """Whether a delivery the batch routes to ``account`` at position ``at`` (a message on ``topic``
    accepted at ``accepted_at``) is cleared by a later SUBSCRIBE of the same batch: it is pending for
    the subscriber before SINCE, so it is never sent (:func:`streaming.routing.clearing.withheld_sql`)."""
    if accepted_at is None or not clearing:  # SQL: a null time compares to nothing
        return False
    patterns = candidate_patterns(topic)
    return any(c.account == account and c.at > at and accepted_at < c.since and c.pattern in patterns
               for c in clearing)


def cleared(spans: list[Interval], clearable: pa.Table | None,
            settled: Container[tuple[str, int]]) -> list[tuple[str, int, Position]]:
    """The stored pending deliveries a SUBSCRIBE with SINCE clears, each with that SUBSCRIBE's position
    (the first by position when several do; :func:`streaming.routing.clearing.cleared_sql`):
    ``clearable`` the stored pending deliveries of the accounts that SUBSCRIBE with SINCE, with their
    message's acceptance time (:data:`streaming.routing.CLEARABLE`); ``spans`` the batch's intervals;
    ``settled`` the (account, smuid) the batch acknowledges, expires, retries or hands on (that wins)."""
    opened = [i for i in spans if i.from_seq is not None and i.since is not None]
    if clearable is None or not clearable.num_rows or not opened:
        return []
    first: dict[tuple[str, int], Position] = {}
    for account, smuid, topic, accepted_at in zip(
            clearable.column("account").to_pylist(), clearable.column("smuid").to_pylist(),
            clearable.column("topic").to_pylist(), clearable.column("accepted_at").cast(pa.int64()).to_pylist()):
        if accepted_at is None or topic is None:
            continue
        patterns = candidate_patterns(topic)
        for interval in opened:
            if (interval.account == account and interval.pattern in patterns and accepted_at < interval.since
                    and ((account, smuid) not in first or interval.from_seq < first[(account, smuid)])):
                first[(account, smuid)] = interval.from_seq
    return [(account, smuid, at) for (account, smuid), at in first.items() if (account, smuid) not in settled]
