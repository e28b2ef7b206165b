"""A batch's SUBSCRIBEs and UNSUBSCRIBEs, routed on the driver: the intervals each subscription is
open in, the ``subscriptions`` rows they leave, and what a late subscriber gets.

Why: a batch with a SUBSCRIBE went through the routing query, whose planning alone costs 2.5-3.5 s
idle and 10-25 s on a host the load keeps busy, whatever the batch holds: one subscriber's
SUBSCRIBE at 1,000 msg/s held everything the job does for ~24 s
(``bench-results/subscribe-under-load-2026-11-29.md``).  Each function here is the Python form of
one transform of :mod:`streaming.routing`, named in its docstring; ``tests/streaming/test_simple_batch.py``
proves the outputs equal by property test.  What a SUBSCRIBE's SINCE clears is
:mod:`streaming.simple_clearing`'s.

Positions (``seq``) are (timestamp, partition, offset) tuples, None for a subscription older than the
batch; times are microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

import pyarrow as pa

from schemas.topics import admits, candidate_patterns, covers, may_receive

Position = tuple


def position(event: dict) -> Position:
    """Where ``event`` (a decoded record) stands in the log, the order the routing query sorts by."""
    seq = event["seq"]
    return seq["timestamp"], seq["partition"], seq["offset"]


@dataclass(frozen=True)
class Interval:
    """A stretch of the batch in which ``account`` is subscribed to ``pattern``: from ``from_seq``
    (None: before the batch) to ``to_seq`` (None: still open) (:data:`streaming.routing.INTERVALS`)."""

    account: str
    pattern: str
    guid: str | None
    subscribed_at: int | None
    from_seq: Position | None
    since: int | None
    until: int | None
    to_seq: Position | None = None
    unsubscribed_at: int | None = None
    redefines: bool = False  # a SUBSCRIBE while subscribed: it only redefines SINCE/UNTIL

    def holds(self, at: Position) -> bool:
        """Whether the subscription is open at position ``at``: ``from_seq < at < to_seq``."""
        return (self.from_seq is None or self.from_seq < at) and (self.to_seq is None or at < self.to_seq)


def _ends(closing: dict, interval: Interval) -> bool:
    """Whether the (UN)SUBSCRIBE ``closing`` ends ``interval``: a later one of its account, on its
    pattern, or an UNSUBSCRIBE that covers it (:func:`schemas.topics.covers`)."""
    ends = (covers(closing["pattern"], interval.pattern) if closing["type"] == "unsubscribe"
            else closing["pattern"] == interval.pattern)
    return (closing["account"] == interval.account and ends
            and (interval.from_seq is None or position(closing) > interval.from_seq))


def _micros(table: pa.Table, name: str) -> list:
    return table.column(name).cast(pa.int64()).to_pylist()


def _opens(current: pa.Table, changes: list[dict]) -> list[Interval]:
    """Where intervals start: the active subscriptions before the batch, then each SUBSCRIBE."""
    stored = zip(current.column("account").to_pylist(), current.column("pattern").to_pylist(),
                 current.column("guid").to_pylist(), _micros(current, "subscribed_at"),
                 _micros(current, "since"), _micros(current, "until"))
    return ([Interval(account, pattern, guid, at, None, since, until)
             for account, pattern, guid, at, since, until in stored]
            + [Interval(e["account"], e["pattern"], e["guid"], e["accepted_at"], position(e), e["since"], e["until"])
               for e in changes if e["type"] == "subscribe"])


def _ended(interval: Interval, changes: list[dict]) -> Interval:
    """``interval`` with its end: the first later change (``changes`` in log order) that ends it."""
    for closing in changes:
        if _ends(closing, interval):
            return replace(interval, to_seq=position(closing),
                           unsubscribed_at=closing["accepted_at"] if closing["type"] == "unsubscribe" else None)
    return interval


def intervals(current: pa.Table, changes: list[dict]) -> list[Interval]:
    """The active subscriptions before the batch (``current``: ``SUBSCRIPTIONS_TABLE`` rows) and its
    SUBSCRIBEs and UNSUBSCRIBEs (``changes``, valid decoded records) → every interval, each keeping the
    guid and time of the SUBSCRIBE that started its subscription
    (:func:`streaming.routing.subscriptions.subscription_intervals`)."""
    changes = sorted(changes, key=position)
    if not changes:  # the common batch: every stored subscription open throughout
        return _opens(current, changes)
    by_pair: dict[tuple[str, str], list[Interval]] = {}
    for interval in _opens(current, changes):
        by_pair.setdefault((interval.account, interval.pattern), []).append(_ended(interval, changes))
    out = []
    for pair in by_pair.values():
        pair.sort(key=lambda i: (i.from_seq is not None, i.from_seq or ()))
        start = None
        for previous, interval in zip([None, *pair], pair):
            redefines = previous is not None and previous.to_seq is not None and previous.to_seq == interval.from_seq
            if not redefines:
                start = interval
            out.append(replace(interval, guid=start.guid, subscribed_at=start.subscribed_at, redefines=redefines))
    return out


def subscription_rows(spans: list[Interval], batch_id: int) -> list[dict]:
    """The ``subscriptions`` rows the batch leaves: for each (account, pattern) it touched, its last
    interval (:func:`streaming.routing.subscriptions.subscription_state`)."""
    last: dict[tuple[str, str], Interval] = {}
    for interval in spans:
        if interval.from_seq is None and interval.to_seq is None:
            continue  # untouched
        key = (interval.account, interval.pattern)
        kept = last.get(key)
        if kept is None or kept.from_seq is None or (interval.from_seq is not None and interval.from_seq > kept.from_seq):
            last[key] = interval
    return [{"account": i.account, "pattern": i.pattern, "guid": i.guid, "active": i.to_seq is None,
             "subscribed_at": i.subscribed_at, "unsubscribed_at": i.unsubscribed_at, "since": i.since,
             "until": i.until, "batch_id": batch_id} for i in last.values()]


def subscribers_at(spans: list[Interval]) -> Callable[[str, Position], Iterable[tuple[str, int | None, int | None]]]:
    """``(pattern, at)`` → the (account, since, until) subscribed to ``pattern`` at position ``at``: the
    lookup :func:`schemas.topics.recipients` routes a publish of the batch by."""
    by_pattern: dict[str, list[Interval]] = {}
    for interval in spans:
        by_pattern.setdefault(interval.pattern, []).append(interval)
    # a pattern no change of the batch touched: the same subscribers at every position, looked up once
    always = {pattern: [(i.account, i.since, i.until) for i in group] for pattern, group in by_pattern.items()
              if all(i.from_seq is None and i.to_seq is None for i in group)}

    def subscribed(pattern: str, at: Position):
        if pattern in always:
            return always[pattern]
        return [(i.account, i.since, i.until) for i in by_pattern.get(pattern, ()) if i.holds(at)]
    return subscribed


def _opened(spans: list[Interval]) -> list[Interval]:
    """The intervals the batch's SUBSCRIBEs opened that start a subscription and are still open."""
    return [i for i in spans if i.from_seq is not None and i.to_seq is None and not i.redefines]


@dataclass(frozen=True)
class Late:
    """A message a late subscriber gets: ``message`` as a publish's decoded record, ``seq`` the SUBSCRIBE's."""

    account: str
    message: dict
    seq: dict


def late(spans: list[Interval], candidates: list[dict], skip: set[tuple[str, int]],
         pick_order: Callable[[int, str], tuple], peers: Mapping[str, str]) -> list[Late]:
    """What the subscriptions the batch starts get of the messages published before them
    (:func:`streaming.routing.late.late`): of ``candidates``, publishes of the batch and stored messages
    (``seq`` None) as decoded publish records that may still go to somebody (the caller leaves out the
    expired ones and the DELIVERY ONE ones somebody got), those within the SUBSCRIBE's SINCE/UNTIL,
    but not to an (account, smuid) of ``skip`` (held, or routed in the batch).  A DELIVERY ONE message
    goes to one new subscriber, the first by ``pick_order``."""
    opened = _opened(spans)
    if not opened:
        return []
    by_pattern: dict[str, list[Interval]] = {}
    for interval in opened:
        by_pattern.setdefault(interval.pattern, []).append(interval)
    chosen: dict[tuple[str, int], tuple[Position, Interval, dict]] = {}
    for message in candidates:
        at = None if message["seq"] is None else position(message)
        for pattern in candidate_patterns(message["topic"]):
            for s in by_pattern.get(pattern, ()):
                key = (s.account, message["smuid"])
                if ((at is None or at < s.from_seq) and admits(s.since, s.until, message["accepted_at"])
                        and may_receive(s.account, message["depth"] or 0, message["hops"] or (), peers)
                        and key not in skip
                        and (key not in chosen or s.from_seq < chosen[key][0])):
                    chosen[key] = (s.from_seq, s, message)
    picked: dict[int, str] = {}
    for (account, smuid), (_, _, message) in chosen.items():
        if message["delivery"] == "one" and (smuid not in picked or pick_order(smuid, account) <
                                             pick_order(smuid, picked[smuid])):
            picked[smuid] = account
    return [Late(account, message, as_seq(s.from_seq)) for (account, smuid), (_, s, message) in chosen.items()
            if message["delivery"] != "one" or picked[smuid] == account]


def as_seq(at: Position) -> dict:
    """A position as a record's ``seq`` struct."""
    return {"timestamp": at[0], "partition": at[1], "offset": at[2]}


def stored_publishes(stored: pa.Table, batch_smuids: set[int]) -> list[dict]:
    """The stored messages a late subscriber may get (``STORED`` rows, the first stored row of each
    smuid) but those the batch publishes again, as decoded publish records of no position."""
    rows = stored.select([name for name in stored.column_names if name not in ("accepted_at", "expires_at")])
    first: dict[int, dict] = {}
    for row, accepted_at, expires_at in sorted(zip(rows.to_pylist(), _micros(stored, "accepted_at"),
                                                   _micros(stored, "expires_at")), key=lambda r: r[0]["batch_id"]):
        if row["smuid"] not in batch_smuids and row["smuid"] not in first:
            first[row["smuid"]] = {**row, "account": row["publisher"], "guid": row["publisher_guid"],
                                   "accepted_at": accepted_at, "expires_at": expires_at, "seq": None}
    return list(first.values())
