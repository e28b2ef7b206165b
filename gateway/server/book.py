"""What each account, and each login of it, still has to be notified of.

Plain data, no I/O.  Fed by the deliveries topic (``Deliver``, ``Acked``,
``Progress`` from the job) and by this gateway's own durable ACKs.

* :class:`DeliveryBook` — per account, the deliveries nobody has
  acknowledged yet: what a login gets when it starts (Property 5).
* :class:`NotifyQueue` — per login, what that login still has to be sent.
  Spec section 3: an account logged in several times receives every message
  at each login, so each login has its own queue; the first ``310 ACK``
  settles the message for the account, the other logins still get their copy.

Why acknowledged-but-unconfirmed smuids are remembered: the job emits
``Deliver`` before its Delta commit, so a job restart may replay a batch and
emit a delivery that is already acknowledged.  Until the job's ``Acked`` for
it arrives (always after any replay, on the same partition), such a delivery
is ignored — this is what keeps Property 3 (never notified again after the
two-phase ACK) across job restarts.

The gateway also routes DELIVERY ALL messages itself, from the commands log it
folds, to NOTIFY without waiting for the job (``Gateway._route_early``).  Such a
delivery enters the book through :meth:`DeliveryBook.speculate`; the job's own
``Deliver`` of it then finds it pending (or acknowledged) and is ignored.  An
ACK is remembered even when its delivery is not pending here: the job may not
have routed the message yet, and its ``Deliver`` must not bring it back.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, defaultdict
from typing import Callable

from schemas.events import Acked, Deliver, Progress

#: How many deliveries the job confirmed (``Acked``) the book keeps in mind, so that routing a message
#: early from a fold lagging behind the job cannot bring back what the job settled a moment ago.
CONFIRMED_MEMORY = 16384


def _order(deliver: Deliver) -> tuple[int, int]:
    """Higher priority first (2002 revision), then FIFO by smuid (acceptance order)."""
    return -deliver.priority, deliver.smuid


class NotifyQueue:
    """One login's pending NOTIFYs, each smuid at most once."""

    def __init__(self, delivers=()) -> None:
        self._heap: list[tuple[tuple[int, int], Deliver]] = []
        self._seen: set[int] = set()
        for deliver in delivers:
            self.push(deliver)

    def push(self, deliver: Deliver) -> None:
        if deliver.smuid not in self._seen:
            self._seen.add(deliver.smuid)
            heapq.heappush(self._heap, (_order(deliver), deliver))

    def pop(self, skip: Callable[[Deliver], bool] | None = None) -> Deliver | None:
        """The first delivery in order that ``skip`` does not hold back (SET NOTIFY SUSPEND);
        without ``skip`` (nothing suspended, as a rule) simply the first one."""
        if skip is None:
            return heapq.heappop(self._heap)[1] if self._heap else None
        held = []
        found = None
        while self._heap:
            entry = heapq.heappop(self._heap)
            if not skip(entry[1]):
                found = entry[1]
                break
            held.append(entry)
        for entry in held:
            heapq.heappush(self._heap, entry)
        return found

    def discard(self, smuid: int) -> None:
        """Withdraw a delivery that died (expired, out of retries) or went to another subscriber
        (DELIVERY ONE) before it was sent; should it come back, it is queued again."""
        self._seen.discard(smuid)
        if any(entry[1].smuid == smuid for entry in self._heap):
            self._heap = [entry for entry in self._heap if entry[1].smuid != smuid]
            heapq.heapify(self._heap)

    def requeue(self, deliver: Deliver) -> None:
        """Put back a delivery that was popped but not acknowledged."""
        heapq.heappush(self._heap, (_order(deliver), deliver))

    def __len__(self) -> int:
        return len(self._heap)


class QueueSizes:
    """Per topic, the distinct messages still pending for some account and their data bytes,
    kept up to date in O(1) per change (PUBLISH checks a topic's queue limits against it)."""

    def __init__(self) -> None:
        self._holders: dict[int, int] = {}  # smuid -> accounts it is pending for
        self._totals: dict[str, tuple[int, int]] = {}  # topic -> (messages, data bytes)

    def added(self, deliver: Deliver) -> None:
        holders = self._holders.get(deliver.smuid, 0)
        self._holders[deliver.smuid] = holders + 1
        if not holders:
            self._change(deliver, +1)

    def removed(self, deliver: Deliver) -> None:
        holders = self._holders.pop(deliver.smuid, 0) - 1
        if holders > 0:
            self._holders[deliver.smuid] = holders
        elif holders == 0:
            self._change(deliver, -1)

    def _change(self, deliver: Deliver, sign: int) -> None:
        messages, size = self._totals.get(deliver.topic, (0, 0))
        messages, size = messages + sign, size + sign * sum(len(s.data) for s in deliver.sections)
        if messages:
            self._totals[deliver.topic] = (messages, size)
        else:
            self._totals.pop(deliver.topic, None)

    def of(self, topic: str) -> tuple[int, int]:
        """(messages, data bytes) waiting in ``topic``'s queue."""
        return self._totals.get(topic, (0, 0))


#: How many messages delivered lately :class:`SeenMessages` keeps in mind for PUB REPLY's check.
SEEN_MEMORY = 16384


class SeenMessages:
    """The messages this gateway saw routed lately (the job's ``Deliver`` or its own early routing),
    by the ``Cmuid`` a NOTIFY shows (``publisher/guid/cmuid``): (topic, ``Reply-Topic`` or None).

    PUB REPLY must name a message that exists on its topic.  The one replied to was just NOTIFYed,
    most often, and the job may not have committed it to the ``messages`` table yet (or may be
    down), so this memory answers first; what it has forgotten, or never saw (another gateway's
    subscribers only), is looked up in the table.  The latest message of a Cmuid wins: a Cmuid
    used twice falls back to the table."""

    def __init__(self, limit: int = SEEN_MEMORY) -> None:
        self._limit = limit
        self._seen: OrderedDict[str, tuple[str, str | None]] = OrderedDict()

    def add(self, deliver: Deliver) -> None:
        key = f"{deliver.publisher}/{deliver.publisher_guid}/{deliver.cmuid}"
        reply_topic = next((v for n, v in deliver.headers if n.lower() == "reply-topic"), None)
        self._seen[key] = (deliver.topic, reply_topic)
        self._seen.move_to_end(key)
        if len(self._seen) > self._limit:
            self._seen.popitem(last=False)

    def get(self, cmuid: str) -> tuple[str, str | None] | None:
        """(topic, Reply-Topic) of the message last seen with the NOTIFY ``Cmuid`` ``cmuid``."""
        return self._seen.get(cmuid)


class DeliveryBook:
    """Per account: deliveries routed by the job and not yet acknowledged by any login."""

    def __init__(self) -> None:
        self.seen = SeenMessages()
        self._pending: dict[str, dict[int, Deliver]] = defaultdict(dict)
        self._acked_unconfirmed: set[tuple[str, int]] = set()
        self._confirmed: OrderedDict[tuple[str, int], None] = OrderedDict()  # the latest Acked keys, oldest first
        self.commands_offsets: dict[str, int] = {}
        self.sizes = QueueSizes()

    def apply(self, event) -> Deliver | None:
        """Apply one deliveries-topic event; returns a delivery that is new to this book."""
        if isinstance(event, Deliver):
            key = (event.account, event.smuid)
            pending = self._pending[event.account]
            if key in self._acked_unconfirmed or event.smuid in pending:
                return None
            pending[event.smuid] = event
            self.sizes.added(event)
            self.seen.add(event)
            return event
        if isinstance(event, Acked):
            self._settled(self._pending[event.account].pop(event.smuid, None))
            self._acked_unconfirmed.discard((event.account, event.smuid))
            self._confirmed[(event.account, event.smuid)] = None
            if len(self._confirmed) > CONFIRMED_MEMORY:
                self._confirmed.popitem(last=False)
        elif isinstance(event, Progress):
            self.commands_offsets.update(event.commands_offsets)
        return None

    def knows(self, account: str, smuid: int) -> bool:
        """Whether a ``Deliver`` of ``smuid`` to ``account`` would be ignored (:meth:`apply`): it is
        pending, or acknowledged and not yet confirmed — checked before decoding one."""
        return (account, smuid) in self._acked_unconfirmed or smuid in self._pending.get(account, ())

    def speculate(self, deliver: Deliver) -> Deliver | None:
        """A delivery this gateway routed itself, ahead of the job: new to the book unless the job's
        ``Deliver`` came first, it was acknowledged, or the job confirmed it lately."""
        if (deliver.account, deliver.smuid) in self._confirmed:
            return None
        return self.apply(deliver)

    def acknowledged(self, account: str, smuid: int) -> None:
        """A login's 310 ACK is durable in Kafka: logins that start from now on skip it.

        Remembered until the job's ``Acked`` arrives (the job answers every ACK with one), even
        when the delivery is not pending here: settled already by another login, or routed early
        by a gateway before the job's ``Deliver`` of it came.
        """
        self._settled(self._pending[account].pop(smuid, None))
        self._acked_unconfirmed.add((account, smuid))

    def _settled(self, deliver: Deliver | None) -> None:
        if deliver is not None:
            self.sizes.removed(deliver)

    def queue_for_login(self, account: str) -> NotifyQueue:
        """A new login's queue: everything the account has not acknowledged yet."""
        return NotifyQueue(self._pending.get(account, {}).values())

    def locked_to(self, account: str) -> list[Deliver]:
        """The DELIVERY ONE messages locked to ``account`` and not acknowledged yet."""
        return [d for d in self._pending.get(account, {}).values() if d.delivery == "one"]

    def accounts(self) -> list[str]:
        """The accounts with deliveries pending."""
        return [account for account, pending in self._pending.items() if pending]

    def pending_count(self, account: str) -> int:
        return len(self._pending.get(account, ()))

    def pending_for_topic(self, topic: str) -> int:
        """Deliveries of ``topic``'s messages not acknowledged yet (REMOVE TOPIC's reply)."""
        return sum(1 for pending in self._pending.values() for d in pending.values() if d.topic == topic)
