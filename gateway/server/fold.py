"""The registry fold: every gateway applies commands partition 0 (the control log) to its registry."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime, timezone

from gateway.server.feeds import RawPublish
from gateway.protocol.headers import to_micros
from gateway.protocol.rendering import render_server_timeout_notify, render_subscribers_notify, render_topic_notify
from gateway.registry import SUBSCRIBERS_WATCH, SubscribersChanged, TOPIC_WATCH, TopicChanged
from schemas.events import Deliver, PlannedShutdown, Publish, Subscribe, Sync, decode
from schemas.timefmt import now_micros

log = logging.getLogger("smqp.gateway")


#: The longest a gateway's UNTIL timer waits before it looks at the next UNTIL again (seconds).
UNTIL_RECHECK_S = 3600.0
#: Own publishes remembered between their append and their fold, at most (past it: forgotten, decoded).
OWN_PUBLISHES_MAX = 100_000


def _topics_named(change: TopicChanged | SubscribersChanged) -> list[str]:
    """The topics a NOTIFY TOPIC / SUB of ``change`` reveals (a rename: both names).  A watcher is
    told only when it may read each (spec 4.1.3: what LIST hides, no notification reveals)."""
    if isinstance(change, TopicChanged) and change.action.startswith("RENAME "):
        return [change.topic, change.action[len("RENAME "):]]
    return [change.topic]


def early_delivery(account: str, publish: Publish) -> Deliver:
    """The delivery of ``publish`` to ``account`` a gateway routes early: what the job's ``Deliver``
    of it will say."""
    return Deliver(account, publish.smuid, publish.topic, publish.cmuid, publish.account, publish.guid,
                   publish.accepted_at, publish.priority, publish.headers, publish.sections,
                   expires_at=publish.expires_at, depth=publish.depth, hops=list(publish.hops),
                   origin=publish.origin, origin_topic=publish.origin_topic)


class RegistryFold:
    """The fold of the control log into the registry, and what follows from each change: early
    routing of DELIVERY ALL publishes, NOTIFY TOPIC / SUBSCRIBERS, and the end of UNTIL subscriptions.

    A mixin of :class:`gateway.server.gateway.Gateway`: it uses the gateway's registry, book, sessions
    and Kafka clients, set up in :mod:`gateway.server.gateway`.
    """

    def _on_control(self, records: list) -> None:
        """Fold partition-0 records; tell watchers connected here (live changes only, not the replay)."""
        live = self.control.ready.is_set()
        for offset, event in records:
            if isinstance(event, RawPublish):
                self.registry.apply(None, offset)
                own = self._own_publishes.pop(event.value, None) if self._own_publishes else None
                self._after_fold(offset, self._route_early, offset, event, own)
                continue
            changes = self.registry.apply(event, offset)
            self._after_fold(offset, self._on_folded, event, changes, live)
        applied = self.registry.applied
        waiting = []
        for offset, future in self._fold_waiters:
            if offset <= applied:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((offset, future))
        self._fold_waiters = waiting
        self._arm_until()

    def _on_folded(self, event, changes: list, live: bool) -> None:
        """What a folded control event sets off here: NOTIFY TOPIC / SUB and a planned shutdown
        (``live``: not while replaying), presence, hand-ons."""
        if live:
            for change in changes:
                self._announce(change)
            if isinstance(event, PlannedShutdown) and event.node == self.config.gateway.node_id:
                self._admin_bye(event)
        for moved in self.presence.apply(event):
            self._presence_changed(moved)
        if isinstance(event, Subscribe) and self.sessions.get(event.account):
            # a login here subscribed: it may take what is locked to accounts logged in nowhere
            self._hand_on_locked(self.book.accounts(), takers=[event.account])

    @staticmethod
    def _after_fold(offset: int, react, *args) -> None:
        """``react(*args)``, the part of folding record ``offset`` that reaches connections: an
        error there is logged and the fold goes on, so the records after it are still folded and
        the commands waiting on them answered (one raised once, and the rest of its batch went
        unfolded: a CREATE's client then waited for a reply that never came)."""
        try:
            react(*args)
        except Exception:  # noqa: BLE001 - logged with its traceback; the fold must go on
            log.exception("control record %d folded, but reacting to it failed", offset)

    async def folded(self, offset: int) -> None:
        """Wait until the registry has folded partition 0 up to ``offset``."""
        if self.registry.applied >= offset:
            return
        future = asyncio.get_running_loop().create_future()
        self._fold_waiters.append((offset, future))
        limit = self.config.kafka.delivery_timeout_ms / 1000
        try:
            await asyncio.wait_for(future, limit)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the registry had folded commands partition 0 up to offset {self.registry.applied}, "
                               f"not yet {offset}, after {limit:g} s") from None

    async def sync(self) -> None:
        """A read barrier: append a ``Sync`` and wait for its fold, so the registry has
        seen every control event any gateway had appended before."""
        metadata = await self.log.append(b"", Sync(uuid.uuid4().hex).to_bytes(), partition=0)
        await self.folded(metadata.offset)

    def _arm_until(self) -> None:
        """Wake when the next subscription's UNTIL passes (spec 4.1.9.1); the registry decides, from
        its fold and this gateway's clock, what ends then (:meth:`Registry.end_subscriptions`: every
        gateway of the farm ends it at the same UNTIL by its own clock, no event is appended).  A far
        UNTIL is looked at again every :data:`UNTIL_RECHECK_S`, so a timer never waits for days."""
        until = self.registry.next_until()
        if until == self._until_due:
            return
        if self._until_timer is not None:
            self._until_timer.cancel()
        self._until_timer, self._until_due = None, until
        if until is not None:
            delay = min(max(0.0, (until - now_micros()) / 1e6), UNTIL_RECHECK_S)
            self._until_timer = asyncio.get_running_loop().call_later(delay, self._until_passed)

    def _until_passed(self) -> None:
        """End the subscriptions whose UNTIL passed; their topics' watchers get NOTIFY SUBSCRIBERS."""
        self._until_timer, self._until_due = None, None
        for change in self.registry.end_subscriptions(now_micros()):
            self._announce(change)
        self._arm_until()

    def _announce(self, change) -> None:
        if isinstance(change, TopicChanged):
            frame, accounts = (render_topic_notify(change.topic, change.action),
                               self.registry.watchers(TOPIC_WATCH, change.topic))
        elif isinstance(change, SubscribersChanged):
            frame, accounts = (render_subscribers_notify(change.topic, change.count),
                               self.registry.watchers(SUBSCRIBERS_WATCH, change.topic))
        else:
            frame = render_server_timeout_notify(change.timeout)
            for connection in self.connections:
                if connection.session.watches_server_timeout:
                    connection.notify(frame)
            return
        named = _topics_named(change)
        for account in accounts:
            for connection in self.sessions.get(account, ()):
                if all(connection.session.may_read(topic) for topic in named):
                    connection.notify(frame)

    def remember_own(self, record: bytes, publish: Publish, appended: asyncio.Future) -> None:
        """Keep ``publish``, which a client of this gateway sent and whose ``record`` is being
        appended, for the fold to route early without decoding the record back (~25 µs of the
        ~410 a message published and delivered alone costs the gateway).  Only a DELIVERY ALL
        publish the gateway may route early, to a topic someone may get it from now (a publish
        nobody subscribed to costs nothing more); forgotten if its append fails."""
        if not self.routes_early or publish.delivery != "all" or not self.registry.may_reach(publish.topic):
            return
        if len(self._own_publishes) >= OWN_PUBLISHES_MAX:
            self._own_publishes.clear()
        self._own_publishes[record] = publish
        appended.add_done_callback(lambda done: done.cancelled() or done.exception() is None
                                   or self._own_publishes.pop(record, None))

    def _route_early(self, offset: int, raw: RawPublish, own: Publish | None = None) -> None:
        """NOTIFY a DELIVERY ALL message as soon as its publish is folded, ahead of the job.

        The fold has then seen exactly the subscriptions that precede the publish in the log,
        the order the job routes by, so :meth:`Registry.recipients` names the accounts the job
        will route it to; the job's ``Deliver`` of it then finds it in the book and is ignored.
        Only once the book is complete (``handing_on``), only for publishes the job has not
        committed (past its progress), and only with one commands partition, which keeps each
        ACK after its publish in the job's input.  Messages already expired, and DELIVERY ONE
        (the job picks the subscriber), are left to the job.  Another farm's link (an account of
        ``[federation] peers``) is a recipient only when the message's Depth and Hops let it go
        there (:func:`schemas.topics.forwards`, the job's rule too).  ``own``: the publish itself,
        when a client of this gateway sent it (:meth:`remember_own`)."""
        if (not (self.routes_early and self.handing_on) or offset < self.book.commands_offsets.get("0", 0)
                or not self.registry.may_reach(raw.topic)):  # most publishes: decoded by nobody here
            return
        try:
            publish = own or decode(raw.value)  # own: this gateway's, the very event its record encodes
        except (ValueError, TypeError, KeyError):
            return  # the job skips it too
        if publish.delivery != "all" or (publish.expires_at is not None and publish.expires_at <= to_micros(
                datetime.now(timezone.utc))):
            return
        for account in self.registry.recipients(publish.topic, publish.accepted_at, publish.depth, publish.hops,
                                                self.config.federation.peers):
            deliver = self.book.speculate(early_delivery(account, publish))
            if deliver is not None:
                self.metrics.routed_early.inc()
                self._offer(deliver)

    def _offer(self, deliver: Deliver) -> None:
        """Queue a delivery new to the book at every login of its account here."""
        for connection in self.sessions.get(deliver.account, ()):
            connection.queue.push(deliver)
            connection.send_next()
