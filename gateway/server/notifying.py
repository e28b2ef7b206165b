"""NOTIFY MESSAGE on a connection: one in flight (or a window of them), the 310 ACK, and retries."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas.events import Deliver
from schemas.timefmt import now_micros

if TYPE_CHECKING:  # annotations only: that module imports this one
    from gateway.server.notify_channel import NotifyChannel


def _dead(deliver: Deliver) -> bool:
    """Whether ``deliver``'s message has expired by now (this gateway's clock): it is never NOTIFYed
    from then on, nor sent again, whether or not the job has yet said so (its ``Acked`` expired)."""
    return deliver.expires_at is not None and deliver.expired(now_micros())


class Notice(bytes):
    """A NOTIFY MESSAGE frame in the outbox: with a notify window it may be written ahead of the
    replies to ACKs still being made durable (:meth:`Connection._write_notices`)."""

    __slots__ = ()


@dataclass(eq=False)
class InFlight:
    """A guaranteed NOTIFY sent on a connection and not yet acknowledged for good."""

    deliver: Deliver
    notified_at: float  # when it was first sent (monotonic), for the ACK latency histogram
    due: float | None = None  # when its retry timeout passes (loop time); None: not armed
    retries: int = 0  # NACKs of it this connection sent
    acking: bool = False  # the client's 310 ACK of it is being made durable

    def disarm(self) -> None:
        self.due = None  # the connection's retry timer finds nothing due for it


class Notifying:
    """A connection's NOTIFY MESSAGEs: sending the next one due, ACKs, and retries (spec 5.1).

    A mixin of :class:`gateway.server.connection.Connection`: it uses the connection's session, queue
    and writer.
    """

    def notify(self, frame: bytes) -> None:
        """An informational NOTIFY (TOPIC / SUBSCRIBERS / SERVER): on the notification port if set.
        One that would take a client already holding unread bytes past ``max_buffered_bytes``
        closes it instead: unsolicited frames are not throttled by reading less."""
        if self.channel:
            self.channel.write(frame)
        elif not self.closing:
            if self.buffered and self.buffered + len(frame) > self.gateway.config.gateway.max_buffered_bytes:
                self.drop("overflow", f"would pass max_buffered_bytes with {self.buffered} bytes unread")
                return
            self.send(frame)

    def send_next(self) -> None:
        """Send NOTIFY MESSAGEs of topics not suspended while fewer than the session's window
        (1: the spec's two-phase commit) await their ACK.

        The read right is enforced here, where the data reaches the client: the job and the
        early routing deliver by subscription alone, and a subscription made through a virtual
        topic is one to its target, so a message of a topic this login may not read now
        (:meth:`Session.may_read`: the UAL of today, not of the SUBSCRIBE) is dropped from its
        queue unsent.  It stays pending for the account and expires as an unacknowledged message.

        Nothing goes once the core has ended the login: a registration (or a wake) carried out
        in order behind a reply that waited on Kafka may find the session already past a QUIT
        or a LOGIN that failed, pipelined behind it."""
        if self.closing or not self.session.logged_in:
            return
        window = self.session.notify_window
        skip = (lambda d: self.session.suspended(d.topic)) if self.session.suspends else None
        while len(self.in_flight) - self.acking < window and (deliver := self.queue.pop(skip)) is not None:
            if _dead(deliver) or not self.session.may_read(deliver.topic):  # expired, or no longer readable
                continue
            frame = self.session.notify(deliver, self.gateway.rendered.get(deliver.smuid))
            if type(frame) is not Notice:  # rendered just now
                frame = Notice(frame)
                self.gateway.remember_rendered(deliver.smuid, frame)
            if self.session.awaits(deliver.smuid):  # guaranteed: it awaits its two-phase ACK
                entry = self.in_flight[deliver.smuid] = InFlight(deliver, time.monotonic())
                self._arm(entry)
            self.notify(frame)

    # -- retries (spec 5.1: retry timeout, maximum retries per message per client)

    def _arm(self, entry: InFlight) -> None:
        """Start ``entry``'s retry timeout (its topic's ``retry_timeout_s``).  One timer per
        connection, at the earliest retry due in flight, rather than one per NOTIFY."""
        loop = asyncio.get_running_loop()
        entry.due = loop.time() + self.gateway.queue_params(entry.deliver.topic).retry_timeout_s
        self._retry_at(entry.due)

    def _retry_at(self, due: float) -> None:
        timer = self._retry_timer
        if timer is None or timer.when() > due:
            if timer is not None:
                timer.cancel()
            self._retry_timer = asyncio.get_running_loop().call_at(due, self._retries_due)

    def _retries_due(self) -> None:
        """The earliest retry timeout came: retry every NOTIFY now due, then wait for the next."""
        self._retry_timer = None
        now = asyncio.get_running_loop().time() + 0.001  # a timer may fire a hair before its time
        for entry in [e for e in self.in_flight.values() if e.due is not None and e.due <= now]:
            entry.due = None
            self._retry_due(entry)
        upcoming = [e.due for e in self.in_flight.values() if e.due is not None]
        if upcoming and not self.closing:
            self._retry_at(min(upcoming))

    def _retry_due(self, entry: InFlight) -> None:
        """No ``310 ACK`` of this NOTIFY within the retry timeout: tell the job (a NACK, which it
        counts) and send it (only it) again, up to the topic's ``max_retries``; past them, wait for
        the job to withdraw it into the Trash (an ``Acked`` with reason max_retries)."""
        deliver = entry.deliver
        if self.closing or self.in_flight.get(deliver.smuid) is not entry or entry.acking:
            return
        if _dead(deliver):  # expired since it was sent: never sent again, and it no longer holds the window
            self._abandon(entry)
            self.send_next()
            return
        entry.retries += 1
        self.gateway.nack(self.session.account, self.session.guid, deliver)
        if entry.retries <= self.gateway.queue_params(deliver.topic).max_retries:
            self.notify(self.session.notify_again(deliver))
            self._arm(entry)

    def _abandon(self, entry: InFlight) -> None:
        """``entry`` no longer awaits a ``310 ACK`` here (the ACK of it is not being made durable)."""
        entry.disarm()
        del self.in_flight[entry.deliver.smuid]
        self.session.notify_abandoned(entry.deliver.smuid)

    def withdraw(self, smuid: int) -> None:
        """The job settled ``smuid`` unacknowledged (expired, out of retries): never NOTIFY it
        (again) here; a NOTIFY of it in flight no longer awaits a ``310 ACK``."""
        self.queue.discard(smuid)
        entry = self.in_flight.get(smuid)
        if entry is not None and not entry.acking:
            self._abandon(entry)
            self.send_next()

    def channel_lost(self, channel: NotifyChannel) -> None:
        """The notification port closed: its NOTIFYs in flight go back to the queue, notifications
        come in-band again."""
        if self.channel is not channel:
            return
        self.channel = None
        for entry in [e for e in self.in_flight.values() if not e.acking]:
            self._abandon(entry)
            self.queue.requeue(entry.deliver)
        self.send_next()
