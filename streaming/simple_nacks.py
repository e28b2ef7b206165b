"""NACKs on the driver: retry counts, deliveries out of retries, and DELIVERY ONE messages handed on.

The Python form of :func:`streaming.routing.retried` and :func:`streaming.routing.released`, for
:func:`streaming.simple_batch.route`.  Why: a NACK sent its batch through the routing query, 2.8-3.3 s
a batch (p50, ``deploy.sink_bench --nack``) where the driver takes 84-105 ms
(``bench-results/nacks-on-driver-2026-11-29``); and a subscriber that stops acknowledging, or a
login that ends holding DELIVERY ONE messages, NACKs in many batches.  The query
stays the definition: ``tests/streaming/test_simple_batch.py`` proves the two equal.

Keys are (account, smuid); positions (``seq``) are the decoded records' dicts, ordered as
:func:`streaming.simple_subscriptions.position` orders them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Container, Iterable, Mapping

import pyarrow as pa

from schemas.topics import admits, candidate_patterns, may_receive
from streaming.simple_subscriptions import Interval, position

Key = tuple[str, int]


@dataclass(frozen=True)
class Retried:
    """A NACKed delivery's new retry count; ``dead`` once it passed ``max_retries`` (:data:`routing.RETRIED`)."""

    account: str
    smuid: int
    retries: int
    dead: bool
    seq: dict


@dataclass(frozen=True)
class Released:
    """A NACKed DELIVERY ONE delivery of ``account`` handed on ``to`` another subscriber
    (:data:`routing.RELEASED`); ``seq`` the last NACK's."""

    account: str
    smuid: int
    to: str
    seq: dict


@dataclass(frozen=True)
class Nacked:
    """The NACKs of one delivery in the batch: how many, the ``max_retries`` the last one carries, its ``seq``."""

    count: int
    max_retries: int | None
    seq: dict


def nacked(events: Iterable[dict]) -> dict[Key, Nacked]:
    """The batch's valid NACK records, counted per delivery (every one counts, repeats too)."""
    counted: dict[Key, Nacked] = {}
    for event in sorted((e for e in events if e["type"] == "nack"), key=position):
        key = (event["account"], event["smuid"])
        count = counted[key].count + 1 if key in counted else 1
        counted[key] = Nacked(count, event["max_retries"], event["seq"])
    return counted


def stored_rows(retrying: pa.Table) -> list[tuple[str, int, str, int | None, str]]:
    """The stored deliveries of the NACKed messages (:data:`routing.RETRYING`) as
    (account, smuid, status, retries, delivery)."""
    return list(zip(*(retrying.column(name).to_pylist()
                      for name in ("account", "smuid", "status", "retries", "delivery"))))


def released(nacks: Mapping[Key, Nacked], stored: list[tuple], settled: Container[Key], gone: Container[str],
             spans: list[Interval], messages: Mapping[int, dict], pick_order: Callable[[int, str], tuple],
             peers: Mapping[str, str]) -> list[Released]:
    """The NACKed DELIVERY ONE deliveries handed on, and to whom (:func:`streaming.routing.released`):
    a pending one of ``stored`` (:func:`stored_rows`) the batch neither acknowledges nor expires
    (``settled``) goes to a subscriber whose subscription is open at the batch's end and covers it
    (``spans``; SINCE/UNTIL and federation as routing has them), not the one releasing it, not one of
    ``gone`` (a ``disconnect`` NACK in the batch), preferring one that never held it, then by
    ``pick_order``.  ``messages``: smuid → its first message, as a decoded publish."""
    held_before = {(account, smuid) for account, smuid, *_ in stored}
    holding = [(account, smuid, nacks[(account, smuid)].seq) for account, smuid, status, _, delivery in stored
               if (account, smuid) in nacks and status == "pending" and delivery == "one"
               and (account, smuid) not in settled]
    open_at_end: dict[str, list[Interval]] = {}
    for interval in spans:
        if interval.to_seq is None:
            open_at_end.setdefault(interval.pattern, []).append(interval)
    chosen: dict[int, tuple[tuple, Released]] = {}
    for account, smuid, seq in holding:
        message = messages.get(smuid)
        if message is None:
            continue
        for pattern in candidate_patterns(message["topic"]):
            for s in open_at_end.get(pattern, ()):
                if (s.account != account and s.account not in gone
                        and admits(s.since, s.until, message["accepted_at"])
                        and may_receive(s.account, message["depth"] or 0, message["hops"] or (), peers)):
                    order = ((s.account, smuid) in held_before, *pick_order(smuid, s.account))
                    if smuid not in chosen or order < chosen[smuid][0]:
                        chosen[smuid] = (order, Released(account, smuid, s.account, seq))
    return [release for _, release in chosen.values()]


def retried(nacks: Mapping[Key, Nacked], retrying: Iterable[tuple], settled: Container[Key],
            released: Iterable[Released]) -> list[Retried]:
    """Each NACK of a pending delivery counts one retry (:func:`streaming.routing.retried`): of
    ``retrying`` (the stored rows, :func:`stored_rows`, and the batch's DELIVERY ALL deliveries as
    pending ones: a gateway routing early may have seen one time out), those the batch neither
    acknowledges nor expires (``settled``) nor hands on (``released``).  ``dead`` once the count
    passes the ``max_retries`` of the last NACK (a null one never does, as in SQL)."""
    handed_on = {(release.account, release.smuid) for release in released}
    out = []
    for account, smuid, status, retries, _ in retrying:
        key = (account, smuid)
        if key in nacks and status == "pending" and key not in settled and key not in handed_on:
            nack = nacks[key]
            count = (retries or 0) + nack.count
            out.append(Retried(account, smuid, count, nack.max_retries is not None and count > nack.max_retries,
                               nack.seq))
    return out
