"""DELIVERY ONE's in-flight limit: who holds each DELIVERY ONE message, decided after routing.

XEP-0254 ``queue_requests`` and OpenQueue's transaction size: a subscriber of
a work queue holds at most ``max_in_flight`` of its messages unacknowledged
(the topic's queue parameter, :class:`schemas.queue_params.QueueParameters`);
the rest wait for a subscriber with room, which spreads the load over them.

The routing query (:mod:`streaming.routing`) picks one subscriber per DELIVERY
ONE message by a hash, without counting what anyone already holds.  This
module takes those picks (:class:`Offer` with ``picked``) and the messages
still waiting from earlier batches (``picked`` None) and decides each one's
holder: the pick while it has room, else the eligible subscriber with the
most room, else nobody yet (the message waits).  It is plain Python over a
few rows, not a Spark transform: a greedy walk that counts as it assigns has
no cheap relational form, and every reference added to the routing query
costs planning time on every micro-batch.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

from schemas.topics import TopicPattern, may_receive


@dataclass(frozen=True)
class Offer:
    """A DELIVERY ONE message that needs a holder in this batch."""

    smuid: int
    topic: str
    priority: int
    accepted_at: int  # microseconds
    picked: str | None = None  # the routing query's choice; None: waiting since an earlier batch
    depth: int = 0  # the message's Depth and Hops: another farm's link may hold it only as they allow
    hops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Subscriber:
    """An active subscription at the end of the batch (SINCE/UNTIL in microseconds, None: open)."""

    account: str
    pattern: str
    since: int | None = None
    until: int | None = None

    def takes(self, offer: Offer) -> bool:
        """Whether this subscription admits ``offer``: its (canonical) pattern covers the topic and
        SINCE/UNTIL admit its acceptance time."""
        covered = TopicPattern(self.pattern, wildcard=self.pattern.endswith("/*")).matches(offer.topic)
        return (covered and (self.since is None or self.since <= offer.accepted_at)
                and (self.until is None or offer.accepted_at < self.until))


@dataclass(frozen=True)
class Holdings:
    """What the subscribers hold when the batch's own settlements are done."""

    in_flight: Counter = field(default_factory=Counter)  # (account, topic) → unacknowledged ONE deliveries
    released: frozenset[tuple[str, int]] = frozenset()  # (account, smuid): it handed that message on before
    gone: frozenset[str] = frozenset()  # accounts whose login ended in this batch (a ``disconnect`` NACK)


def _spread(smuid: int, account: str) -> int:
    """A stable tie-break between equally free subscribers (the same on every replay)."""
    return zlib.crc32(f"{smuid}:{account}".encode())


def assign(offers: Iterable[Offer], subscribers: list[Subscriber], holdings: Holdings,
           limit: Callable[[str], int], peers: Mapping[str, str] = MappingProxyType({})) -> dict[int, str | None]:
    """Each offer's holder (an account), or None when it must wait.

    Offers go in queue order: higher priority first, then by acceptance, so a
    slot freed by an ACK goes to the oldest waiting message, not the newest.
    An offer keeps its ``picked`` subscriber while that one holds fewer than
    ``limit(topic)`` ONE messages of the topic; otherwise it goes to the eligible
    subscriber (:meth:`Subscriber.takes`) with the most room, leaving out those
    whose login just ended and, while anyone else is eligible, those that
    handed this message on before (no ping-pong); ties go by a hash.  Every
    assignment counts against its holder for the offers after it.  An account of ``peers``
    (``[federation] peers``, another farm's link) is eligible only when :func:`schemas.topics.forwards`
    allows the offer's Depth and Hops, as routing decides (:func:`schemas.topics.recipients`).
    """
    load = Counter(holdings.in_flight)
    holders: dict[int, str | None] = {}
    for offer in sorted(offers, key=lambda o: (-o.priority, o.accepted_at, o.smuid)):
        room = limit(offer.topic)

        def free(account: str) -> int:
            return room - load[(account, offer.topic)]

        if offer.picked is not None and free(offer.picked) > 0:
            holder = offer.picked
        else:
            everyone = sorted({s.account for s in subscribers if s.takes(offer)
                               and may_receive(s.account, offer.depth, offer.hops, peers)} - holdings.gone)
            never_held = [a for a in everyone if (a, offer.smuid) not in holdings.released]
            options = [a for a in (never_held or everyone) if free(a) > 0]
            holder = max(options, key=lambda a: (free(a), _spread(offer.smuid, a))) if options else None
        if holder is not None:
            load[(holder, offer.topic)] += 1
        holders[offer.smuid] = holder
    return holders
