"""The asyncio SMQP gateway: sockets, timers and Kafka around the sans-I/O core.

Each connection owns a :class:`gateway.protocol.session.Session`.  Bytes read go
into the session; the actions it returns are carried out here, in order:
``Send`` is written, ``Durable`` is appended to Kafka and its reply written
only once Kafka acknowledged it (Property 1), ``Control`` is appended to
commands partition 0 and answered with the outcome this gateway's registry
fold recorded for it, ``Consult`` / ``ReadMessages`` answer from the
registry / the Delta messages table, ``LoggedIn`` registers the connection
for notifications, ``Close`` ends it.  Replies to pipelined commands leave in
command order.

Notifications come from the deliveries topic through a
:class:`gateway.book.DeliveryBook`; each login has its own
:class:`gateway.book.NotifyQueue` (spec section 3: every login of an account
receives the messages), with one NOTIFY in flight, the next only after the
server's ``310 ACK`` (spec 4.1.11.1) — or, after the client's SET NOTIFY
WINDOW <n> (our extension), up to n in flight, each with its own retry
timeout.  NOTIFY TOPIC / SUBSCRIBERS / SERVER TIMEOUT come from the registry
fold, to the logins connected here.

DELIVERY ONE messages routed to an account logged in at no gateway are handed
on (NACKed, reason ``disconnect``) by the gateways where a login that could
take them is connected, from a farm-wide presence map every gateway folds
from partition 0 (:mod:`gateway.presence`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import itertools
import logging
import math
import secrets
import signal
import ssl
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from gateway.accounts import DEFAULT_ITERATIONS, Accounts, hash_password, new_salt, stored_hash
from gateway.book import DeliveryBook, NotifyQueue
from gateway.feeds import (RawDeliver, RawPublish, control_tail, deliveries_tail, open_commands_log,
                           read_acks_since)
from gateway.ids import SmuidFactory, new_guid
from gateway.message_store import MessageStore
from gateway.metrics import CONTENT_TYPE, GatewayMetrics, Response, serve_http
from gateway.presence import Arrived, Left, PresenceMap
from gateway.protocol.actions import (Close, ConnectNotify, Consult, Control, Durable, LoggedIn, ReadMessages, Send,
                                      Wake)
from gateway.protocol.headers import to_micros
from gateway.protocol.rendering import render_server_timeout_notify, render_subscribers_notify, render_topic_notify
from gateway.protocol.session import Session
from gateway.registry import SUBSCRIBERS_WATCH, TOPIC_WATCH, Registry, SubscribersChanged, TopicChanged
from gateway.replies import NOT_FOUND, REQUEST_TIMEOUT, SERVICE_UNAVAILABLE, Reply
from gateway.ual import AccessList
from kafka_edge import Cluster, DurableLog, Tail
from schemas.config import GatewayConfig, SMQPConfig, load_config
from schemas.events import (Ack, Acked, AckedBatch, Deliver, Nack, NodeReset, PlannedShutdown, Presence, Subscribe,
                            Sync, decode)
from schemas.queue_params import TopicSettings
from schemas.timefmt import format_timeout, parse_timeout

log = logging.getLogger("smqp.gateway")

#: Bytes of one client taken per turn of the event loop (about ten 200-byte PUBs), after which the
#: connection yields: the other connections, Kafka's answers and the appends they free take their
#: turn, so the replies to eight pipelining publishers stream back while their next commands are
#: read, instead of everyone's window being read in one turn and answered in the next
#: (64 KiB per turn measured 13.4-14.9k acknowledged publishes/s, 4 KiB 16.6-20.8k: README).
READ_SIZE = 4096
MAX_UNGUARANTEED = 10_000  # non-guaranteed PUBs awaiting Kafka per gateway; beyond, they are dropped
MAX_PIPELINED = 1000  # durable appends one connection may have outstanding before we stop reading it
RENDERED_MEMORY = 4096  # NOTIFY frames kept for the other logins the same message goes to
#: The gateway process's cyclic garbage collector thresholds (Python's default: 700, 10, 10).  A busy
#: gateway allocates a few objects per frame and holds a book of pending deliveries that grows with
#: every backlog; at the default, a full collection walked those ~300k objects 31 times in a short
#: benchmark (fan-out and drain windows): 3.2 s of the gateway's CPU, 2.5 s of it in full collections
#: of ~80 ms each, which also stall every connection.  Collecting the young generation every 10,000
#: allocations instead of 700 lets most of them die first; full collections still come, ~14x rarer.
GC_THRESHOLDS = (10_000, 10, 10)
#: The longest a gateway's UNTIL timer waits before it looks at the next UNTIL again (seconds).
UNTIL_RECHECK_S = 3600.0


class Connection:
    """One client connection: reads, runs the session's actions in order, writes in order."""

    def __init__(self, gateway: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.gateway = gateway
        self.reader = reader
        self.writer = writer
        self.tls = writer.get_extra_info("ssl_object") is not None  # SMQPS: its SET NOTIFY PORT is TLS too
        self.session = gateway.new_session(peer_host(writer), tls=self.tls)
        # bytes to write, a _PendingReply to await then write, a callable to run, or None to finish;
        # carried out in order by _flush, which writes what it can at once in one transport write
        self.outbox: deque = deque()
        self._flushing = False  # a _flush is scheduled, or waits for the Kafka future at the front
        self.written = asyncio.Event()  # the outbox reached its end (None), or writing gave up
        self.actions: deque = deque()  # actions not carried out yet, in command order
        self.blocker: asyncio.Task | None = None  # a Consult/read/connect the next actions wait for
        self.unsettled = 0  # durable appends not yet answered
        self.pipelines = False  # it has sent a durable command before the last one's reply: see _make_durable
        self.settled = asyncio.Event()
        self.unfolded = 0  # Control events appended but not yet folded by the registry
        self.folded = asyncio.Event()
        self.queue = NotifyQueue()  # filled at LOGIN from the account's pending deliveries
        # the guaranteed NOTIFYs sent and not yet acknowledged for good, by SMUID, oldest first:
        # at most the session's notify_window (1 unless the client asked for more)
        self.in_flight: dict[int, _InFlight] = {}
        self.acking = 0  # of which the client has acknowledged, the ACK not yet durable (out of the window)
        self._held_by_ack = False  # the outbox waits for an ACK's durability, NOTIFYs may pass it
        self._notices_due = False  # a _write_held_notices is scheduled
        self.channel: NotifyChannel | None = None  # SET NOTIFY PORT's connection, if any
        self.closing = False
        self.queued_bytes = 0  # bytes in the outbox, not yet handed to the transport
        self.drained = asyncio.Event()  # set whenever the buffer is at or below the pause mark
        self._stall: asyncio.TimerHandle | None = None  # closes the client if it stays over the mark
        self._draining: asyncio.Task | None = None  # waits for the transport to drain while over the mark
        self._retry_timer: asyncio.TimerHandle | None = None  # at the earliest retry timeout in flight

    async def run(self) -> None:
        try:
            if len(self.gateway.connections) > self.gateway.config.gateway.max_connections:
                self.send(self.session.greeting(available=False))  # and close
                self.closing = True
                return
            self.send(self.session.greeting())
            await self._read_loop()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closing = True
            for entry in self.in_flight.values():
                entry.disarm()
            if self._retry_timer:
                self._retry_timer.cancel()
            self.put(None)
            if self._stall:
                self._stall.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.written.wait(), 10)
                await self._drain()
            if self._draining:
                self._draining.cancel()
            if self.blocker:
                self.blocker.cancel()
            if self.channel:
                self.channel.close()
            self.gateway.unregister(self)
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _read_loop(self) -> None:
        """Read and feed the core.  ``frame_timeout_s`` runs from the read that began the unfinished
        frame, not from the last one: a client trickling a byte at a time is not kept open by each."""
        timeout = self.gateway.config.gateway.frame_timeout_s
        frame_began = None  # monotonic time of the read that began the unfinished frame
        while not self.closing:
            while self.unsettled + len(self.actions) >= MAX_PIPELINED:  # back-pressure on this client
                self.settled.clear()
                await self.settled.wait()
            while self.buffered > self.gateway.pause_at and not self.closing:  # it does not read its replies
                self.drained.clear()
                await self.drained.wait()
            if self.closing:
                return
            left = max(0.0, frame_began + timeout - time.monotonic()) if frame_began is not None else None
            try:
                data = await asyncio.wait_for(self.reader.read(READ_SIZE), left)
            except asyncio.TimeoutError:
                self._perform(self.session.frame_timeout())
                continue
            actions = self.session.receive_data(data)
            if not self.session.in_frame:
                frame_began = None
            elif frame_began is None or actions:  # a frame began, or one ended and the next began
                frame_began = time.monotonic()
            self._perform(actions)
            if not data:
                return
            await asyncio.sleep(0)  # the others' turn (see READ_SIZE), even when more is buffered

    # -- carrying out actions, in order

    def _perform(self, actions) -> None:
        self.actions.extend(actions)
        self._pump()

    def _pump(self) -> None:
        """Carry out queued actions until one must wait (a Consult that has to sync, a read)."""
        while self.actions and self.blocker is None:
            action = self.actions.popleft()
            if isinstance(action, Send):
                self.send(action.data)
            elif isinstance(action, Durable) and not action.reply:
                self.gateway.fire_and_forget(action)
            elif isinstance(action, Durable):
                pending = self._make_durable(action)
                self.put(pending)
                if pending.ack is not None and self.session.notify_window > 1:
                    self.send_next()  # the ACKed NOTIFY left the window: the next may go, ahead of its reply
            elif isinstance(action, Control):
                self.put(self._make_control(action))
            elif isinstance(action, Consult) and not self.unfolded:
                answer = action.decide(False)  # fast path: nothing of ours is waiting to be folded
                if answer is None:
                    self._block(self._consult(action))
                else:
                    self.actions.extendleft(reversed(answer))
            elif isinstance(action, Consult):
                self._block(self._consult(action))
            elif isinstance(action, ReadMessages):
                self._block(self._read_messages(action))
            elif isinstance(action, ConnectNotify):
                self._block(self._connect_notify(action))
            elif isinstance(action, LoggedIn):  # after the 200 reply is written, not before
                self.put(lambda: self.gateway.register(self))
            elif isinstance(action, Wake):
                self.put(self.send_next)
            elif isinstance(action, Close):
                self.closing = True
                self.put(None)
        self.settled.set()

    def _block(self, work) -> None:
        """Run ``work`` (a coroutine returning actions); the queued actions wait for it."""
        async def run() -> None:
            try:
                answer = await work
            except Exception as error:  # Kafka or Delta unreachable: say so, lose nothing
                log.warning("could not answer a command: %s", error)
                answer = [Send(_unavailable())]
            self.actions.extendleft(reversed(answer))
            self.blocker = None
            self._pump()
        self.blocker = asyncio.create_task(run())

    async def _consult(self, action: Consult) -> list:
        while self.unfolded:  # read this connection's own writes
            self.folded.clear()
            await self.folded.wait()
        answer = action.decide(False)
        if answer is None:
            await self.gateway.sync()
            answer = action.decide(True)
        return answer

    async def _read_messages(self, action: ReadMessages) -> list:
        read = self.gateway.messages.smuids if action.smuids_only else self.gateway.messages.messages
        found = await asyncio.to_thread(lambda: [m for t in action.topics for m in read(t, action.now)])
        return action.render(found)

    async def _connect_notify(self, action: ConnectNotify) -> list:
        host = action.host or peer_host(self.writer)
        tls = self.gateway.notify_tls_context() if self.tls else None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, action.port, ssl=tls), 5)
        except asyncio.TimeoutError:
            return [Send(Reply.error(REQUEST_TIMEOUT, f"no answer from {host}:{action.port}").to_bytes())]
        except OSError as error:  # ssl.SSLError too: a TLS session's listener must speak TLS
            return [Send(Reply.error(NOT_FOUND, f"port {action.port} on {host}: {error.strerror or error}").to_bytes())]
        if self.channel:
            self.channel.close()
        self.channel = NotifyChannel(self, reader, writer)
        return [Send(Reply.ok().to_bytes())]

    def _make_durable(self, action: Durable, *, awaited_alone: bool = False) -> _PendingReply:
        """Start the Kafka append now, in command order; the writer awaits it in order.
        ``awaited_alone``: nothing else proceeds until it is durable (the notification port
        settles its ACKs one after another), so it never lingers."""
        ack = action.event if isinstance(action.event, Ack) else None
        if ack is not None and (entry := self.in_flight.get(ack.smuid)) is not None:
            entry.acking = True
            self.acking += 1
        # the client waits on this append alone unless it pipelines (once seen, for good: its replies
        # come back in bursts, so a moment with none outstanding says nothing) or acknowledges within a
        # window whose next NOTIFY goes out before this reply: only then may it linger for company
        self.pipelines = self.pipelines or self.unsettled > 0
        linger = not awaited_alone and (self.pipelines or (ack is not None and self.session.notify_window > 1))
        self.unsettled += 1
        future = self.gateway.log.append(action.key, action.event.to_bytes(), linger=linger)
        return _PendingReply(future, action.reply, ack)

    def _make_control(self, action: Control) -> _PendingReply:
        """Append to partition 0 now; the reply is the registry's outcome once folded."""
        self.unsettled += 1
        self.unfolded += 1
        task = asyncio.ensure_future(self._control_outcome(action.event))
        task.add_done_callback(lambda _: self._folded())
        return _PendingReply(task, b"")

    def _folded(self) -> None:
        self.unfolded -= 1
        self.folded.set()

    async def _control_outcome(self, event) -> bytes:
        registry = self.gateway.registry
        registry.expect(event.request)
        try:
            metadata = await self.gateway.log.append(b"", event.to_bytes(), partition=0)
            await self.gateway.folded(metadata.offset)
        except BaseException:
            registry.forget(event.request)
            raise
        return registry.outcome(event.request).to_bytes()

    async def _settle(self, pending: _PendingReply) -> bytes:
        with contextlib.suppress(Exception):
            await pending.future
        return self._reply_of(pending)

    def _reply_of(self, pending: _PendingReply) -> bytes:
        """The reply to write for a settled append: its own, or 503 if it is not durable."""
        self.unsettled -= 1
        self.settled.set()
        error = pending.future.exception()
        if error is not None:  # not durable: the client must not believe it is
            log.warning("Kafka append failed: %s", error)
            if pending.ack and (entry := self.in_flight.get(pending.ack.smuid)) is not None and entry.acking:
                entry.acking = False
                self.acking -= 1
            return _unavailable()
        return pending.reply or pending.future.result()

    def _ack_written(self, entry: _InFlight) -> None:
        """Both phases done: forget the message for good, then offer the next one."""
        entry.disarm()
        del self.in_flight[entry.deliver.smuid]
        self.acking -= 1
        self.gateway.metrics.ack_latency.observe(time.monotonic() - entry.notified_at)
        self.gateway.book.acknowledged(self.session.account, entry.deliver.smuid)
        self.send_next()

    def put(self, item) -> None:
        """Add to the outbox; it is carried out once the loop has run what it is running now, so
        the replies and NOTIFYs of one read (or one Kafka answer) leave in one write."""
        self.outbox.append(item)
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)
        elif self._held_by_ack and type(item) is _Notice and not self._notices_due:
            self._notices_due = True  # once per tick: the NOTIFYs queued meanwhile go in one write
            asyncio.get_running_loop().call_soon(self._write_held_notices)

    def _write_held_notices(self) -> None:
        self._notices_due = False
        if self._held_by_ack:
            self._write_notices()

    def _write_notices(self) -> None:
        """With a notify window, NOTIFY MESSAGEs need not wait behind the replies to ACKs still
        being made durable (they are the window's own traffic): write those queued past the
        pending ACK replies at the front of the outbox, up to anything else."""
        if self.written.is_set() or not self.outbox or not self._ack_pending(self.outbox[0]):
            return
        notices, kept = [], deque()
        for position, item in enumerate(self.outbox):
            if type(item) is _Notice:
                notices.append(item)
            elif not self._ack_pending(item):
                kept.extend(itertools.islice(self.outbox, position, None))
                break
            else:
                kept.append(item)
        self.outbox = kept
        if notices:
            frame_out = self.gateway.metrics.frame_out
            for notice in notices:
                self.queued_bytes -= len(notice)
                frame_out(notice)
            self._write(b"".join(notices))

    def _ack_pending(self, item) -> bool:
        return isinstance(item, _PendingReply) and item.ack is not None and not item.future.done()

    def _flush(self, _settled: asyncio.Future | None = None) -> None:
        """Carry out the outbox in order until an append it must wait for (it resumes when that is
        settled), writing everything due in one transport write."""
        frame_out = self.gateway.metrics.frame_out
        chunks, held = [], False
        while self.outbox and not self.written.is_set():
            item = self.outbox[0]
            if isinstance(item, _PendingReply):
                if not item.future.done():
                    item.future.add_done_callback(self._flush)
                    held = item.ack is not None and self.session.notify_window > 1
                    break
                self.outbox.popleft()
                data = self._reply_of(item)
                frame_out(data)
                chunks.append(data)
                if item.ack and not self._ack_settled(item.ack):
                    self.written.set()  # the login ends: nothing after this reply is written
            elif item is None:
                self.outbox.popleft()
                self.written.set()
            elif callable(item):
                self.outbox.popleft()
                item()
            else:
                self.outbox.popleft()
                self.queued_bytes -= len(item)
                frame_out(item)
                chunks.append(item)
        else:
            self._flushing = False
        if chunks:
            self._write(b"".join(chunks))
        if held:  # after what came before it: NOTIFYs may pass the pending ACK replies, nothing else
            self._write_notices()
        self._held_by_ack = held
        self._watch_buffer()

    def _write(self, data: bytes) -> None:
        if not self.writer.transport.is_closing():  # a client closed for stalling gets nothing more
            self.writer.write(data)
            self.gateway.metrics.buffered(self.buffered)

    # -- bounding what a client that does not read makes us buffer

    @property
    def buffered(self) -> int:
        """Bytes waiting for this client: in the outbox and in the transport's write buffer."""
        return self.queued_bytes + self.writer.transport.get_write_buffer_size()

    def send(self, data: bytes) -> None:
        """Queue a reply or greeting: bounded by back-pressure (no command is read while the
        client is over the pause mark), so it is always taken."""
        self.queued_bytes += len(data)
        self.put(data)
        self.gateway.metrics.buffered(self.buffered)
        self._watch_buffer()

    def _watch_buffer(self) -> None:
        """Over the pause mark: start the stall timer (reading pauses in the read loop) and wait
        for the transport to drain; back at or under it: stop the timer, let the read loop go on."""
        if self.buffered > self.gateway.pause_at:
            if self._stall is None and not self.closing:
                self._stall = asyncio.get_running_loop().call_later(
                    self.gateway.config.gateway.stalled_client_timeout_s, self._stalled)
            transport = self.writer.transport
            if self._draining is None and transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]:
                self._draining = asyncio.ensure_future(self._drained())  # paused: resumes once drained
            return
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self.drained.set()

    async def _drained(self) -> None:
        """The transport paused writing (over its high-water mark): look again once it has drained.
        (What waits in the outbox is looked at again by :meth:`_flush` as it writes it.)"""
        try:
            await self._drain()
        finally:
            self._draining = None
        self._watch_buffer()

    def _stalled(self) -> None:
        self._stall = None
        if self.buffered > self.gateway.pause_at:
            self.drop("stalled", f"has not read its last {self.buffered} bytes for "
                                 f"{self.gateway.config.gateway.stalled_client_timeout_s} s")

    def drop(self, reason: str, detail: str) -> None:
        """Close a client that does not read what it is sent: log it, count it, discard its buffer.
        What it left unacknowledged stays pending for its account, as after any disconnect."""
        if self.closing and self.writer.transport.is_closing():
            return
        log.warning("closing %s (%s): it %s", self.writer.get_extra_info("peername"), self.session.account, detail)
        self.gateway.metrics.slow_clients_closed.inc(reason)
        self.closing = True
        self.put(None)
        self.drained.set()
        self.writer.transport.abort()

    def _ack_settled(self, ack: Ack) -> bool:
        """After the reply to a client's 310 ACK: False if it was not durable (end this login;
        it and every other NOTIFY in flight stay pending for the account)."""
        entry = self.in_flight.get(ack.smuid)
        if entry is not None and entry.acking:
            self._ack_written(entry)
            return True
        self.closing = True  # the message stays pending for the account
        self.reader.feed_eof()
        return False

    async def _drain(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()

    # -- notifications

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
            if type(frame) is not _Notice:  # rendered just now
                frame = _Notice(frame)
                self.gateway.remember_rendered(deliver.smuid, frame)
            if self.session.awaits(deliver.smuid):  # guaranteed: it awaits its two-phase ACK
                entry = self.in_flight[deliver.smuid] = _InFlight(deliver, time.monotonic())
                self._arm(entry)
            self.notify(frame)

    # -- retries (spec 5.1: retry timeout, maximum retries per message per client)

    def _arm(self, entry: _InFlight) -> None:
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

    def _retry_due(self, entry: _InFlight) -> None:
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

    def _abandon(self, entry: _InFlight) -> None:
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


class NotifyChannel:
    """SET NOTIFY PORT: the server's connection to the client's listener.

    NOTIFY frames are written here; the client's ``310 ACK`` is read here and
    answered here once durable, like on the session connection.
    """

    def __init__(self, connection: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connection = connection
        self.reader = reader
        self.writer = writer
        self.task = asyncio.create_task(self._read_acks())

    def write(self, data: bytes) -> None:
        gateway = self.connection.gateway
        unread = self.writer.transport.get_write_buffer_size()
        if unread and unread + len(data) > gateway.config.gateway.max_buffered_bytes:
            log.warning("closing the notification port of %s: %d bytes unread", self.connection.session.account,
                        unread)
            gateway.metrics.slow_clients_closed.inc("overflow")
            self.writer.transport.abort()  # the read task ends and gives the NOTIFY in flight back
            return
        if not self.writer.transport.is_closing():
            gateway.metrics.frame_out(data)
            self.writer.write(data)
            gateway.metrics.buffered(unread + len(data))

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()

    async def _read_acks(self) -> None:
        connection = self.connection
        try:
            while line := await self.reader.readline():
                for action in connection.session.channel_ack(line.rstrip(b"\r\n")):
                    if isinstance(action, Durable):
                        pending = connection._make_durable(action, awaited_alone=True)
                        self.write(await connection._settle(pending))
                        if not connection._ack_settled(pending.ack):
                            return
                    elif isinstance(action, Send):
                        self.write(action.data)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writer.close()
            connection.channel_lost(self)


def _topics_named(change: TopicChanged | SubscribersChanged) -> list[str]:
    """The topics a NOTIFY TOPIC / SUB of ``change`` reveals (a rename: both names).  A watcher is
    told only when it may read each (spec 4.1.3: what LIST hides, no notification reveals)."""
    if isinstance(change, TopicChanged) and change.action.startswith("RENAME "):
        return [change.topic, change.action[len("RENAME "):]]
    return [change.topic]


def _dead(deliver: Deliver) -> bool:
    """Whether ``deliver``'s message has expired by now (this gateway's clock): it is never NOTIFYed
    from then on, nor sent again, whether or not the job has yet said so (its ``Acked`` expired)."""
    return deliver.expires_at is not None and deliver.expired(time.time_ns() // 1000)


def _unavailable() -> bytes:
    return Reply(SERVICE_UNAVAILABLE, ("Service unavailable: message store not reachable",)).to_bytes()


class _Notice(bytes):
    """A NOTIFY MESSAGE frame in the outbox: with a notify window it may be written ahead of the
    replies to ACKs still being made durable (:meth:`Connection._write_notices`)."""

    __slots__ = ()


@dataclass(eq=False)
class _InFlight:
    """A guaranteed NOTIFY sent on a connection and not yet acknowledged for good."""

    deliver: Deliver
    notified_at: float  # when it was first sent (monotonic), for the ACK latency histogram
    due: float | None = None  # when its retry timeout passes (loop time); None: not armed
    retries: int = 0  # NACKs of it this connection sent
    acking: bool = False  # the client's 310 ACK of it is being made durable

    def disarm(self) -> None:
        self.due = None  # the connection's retry timer finds nothing due for it


@dataclass
class _PendingReply:
    """A reply that may only be written once its event is durable in Kafka (and, for a
    control event, folded: then the awaited result is the reply)."""

    future: asyncio.Future
    reply: bytes
    ack: Ack | None = None


def peer_host(writer: asyncio.StreamWriter) -> str:
    """The client's address ("" when the transport does not know it)."""
    peer = writer.get_extra_info("peername")
    return peer[0] if peer else ""


def notify_tls_context(config: GatewayConfig) -> ssl.SSLContext:
    """The client side of a TLS session's SET NOTIFY PORT connection: TLS 1.2+, the listener's
    certificate checked against ``notify_tls_ca`` (else the system's CAs) and the address dialled."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.notify_tls_ca or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def tls_context(config: GatewayConfig) -> ssl.SSLContext:
    """SMQPS: TLS 1.2+ with the configured certificate chain and key (standard library ``ssl``)."""
    if not (config.tls_cert and config.tls_key):
        raise ValueError("[gateway] tls_port needs tls_cert and tls_key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


class Gateway:
    """The SMQP server: accepts connections, owns the Kafka clients, the registry and the delivery book."""

    def __init__(self, config: SMQPConfig):
        self.config = config
        self.book = DeliveryBook()
        self.registry = Registry(is_account=self._is_account, server_timeout=config.gateway.default_timeout,
                                 max_children=config.gateway.max_children_per_topic,
                                 pending_for_topic=self.book.pending_for_topic)
        self.accounts = Accounts(config.accounts, allow_guest=config.gateway.allow_guest,
                                 overrides=self.registry.passwords, max_failures=config.gateway.max_login_failures,
                                 lockout_s=config.gateway.login_lockout_s, throttle_s=config.gateway.login_throttle_s)
        self.access = AccessList(config.ual)
        self.queue_params = functools.lru_cache(maxsize=4096)(TopicSettings(config.topics).resolve)
        self.messages = MessageStore(config.table_path("messages"), config.table_path("deliveries"))
        self.new_smuid = SmuidFactory(config.gateway.node_id)
        self.sessions: dict[str, list[Connection]] = defaultdict(list)
        # farm-wide: the gateway nodes each account is logged in at, folded from partition 0
        self.presence = PresenceMap()
        # DELIVERY ONE messages are handed on only once the book and the presence map are complete
        # (set at the end of start): a half-read map would make every account look logged out
        self.handing_on = False
        # route DELIVERY ALL messages from the fold, ahead of the job (:meth:`_route_early`)
        self.routes_early = config.gateway.route_early and config.kafka.commands_partitions == 1
        # per account logged in nowhere, the smuids this gateway NACKed away from it: once each
        self.handed_on: dict[str, set[int]] = defaultdict(set)  # (an account's entry goes once empty)
        self.stopping = False
        # a planned shutdown was asked for (SIGTERM, ``gateway.admin bye``): :func:`serve` closes
        # with ``shutdown_grace_s``
        self.shutdown_asked = asyncio.Event()
        self.shutdown_grace_s = 0.0
        self.connections: set[Connection] = set()
        self.kafka: Cluster | None = None
        self.log: DurableLog | None = None
        self.tail: Tail | None = None
        self.control: Tail | None = None
        self.server: asyncio.base_events.Server | None = None
        self.tls_server: asyncio.base_events.Server | None = None
        self.metrics = GatewayMetrics(self)
        self.status: asyncio.base_events.Server | None = None  # the /metrics page, when status_port is set
        self._fold_waiters: list[tuple[int, asyncio.Future]] = []
        # the timer that wakes at the earliest UNTIL of a subscription still on (:meth:`_arm_until`), and that UNTIL
        self._until_timer: asyncio.TimerHandle | None = None
        self._until_due: int | None = None
        # the NOTIFY frames of the latest messages sent, by SMUID: a message fanned out to many
        # logins is rendered once (the frame does not depend on the account)
        self.rendered: dict[int, bytes] = {}
        # a client over this many unread bytes is not read from, and closed if it stays over it
        self.pause_at = config.gateway.max_buffered_bytes // 2
        self.unguaranteed_outstanding = 0
        self.unguaranteed_dropped = 0
        self._notify_tls: ssl.SSLContext | None = None  # see notify_tls_context

    def fire_and_forget(self, action: Durable) -> None:
        """A non-guaranteed PUB: appended without a reply; dropped (and logged) when the
        producer cannot take it or too many are outstanding, never holding up guaranteed traffic."""
        if self.unguaranteed_outstanding >= MAX_UNGUARANTEED:
            self.unguaranteed_dropped += 1
            return
        self.unguaranteed_outstanding += 1
        future = self.log.append(action.key, action.event.to_bytes(), linger=True)

        def settled(done: asyncio.Future) -> None:
            self.unguaranteed_outstanding -= 1
            if done.exception() is not None:
                self.unguaranteed_dropped += 1
        future.add_done_callback(settled)

    def remember_rendered(self, smuid: int, frame: bytes) -> None:
        """Keep ``frame`` for the next logins sent ``smuid``; the oldest of
        :data:`RENDERED_MEMORY` frames is forgotten."""
        if smuid not in self.rendered:
            self.rendered[smuid] = frame
            if len(self.rendered) > RENDERED_MEMORY:
                del self.rendered[next(iter(self.rendered))]

    def _is_account(self, name: str) -> bool:
        return self.accounts.exists(name)

    def notify_tls_context(self) -> ssl.SSLContext:
        """Made at the first TLS session's SET NOTIFY PORT (a plain-only gateway never reads the CA file)."""
        if self._notify_tls is None:
            self._notify_tls = notify_tls_context(self.config.gateway)
        return self._notify_tls

    def new_session(self, peer: str = "", *, tls: bool = False) -> Session:
        """A session for a client at ``peer``: its failed logins are throttled by that address."""
        return Session(self.config.gateway, functools.partial(self.accounts.authenticate, source=peer),
                       clock=lambda: datetime.now(timezone.utc), new_guid=new_guid, new_smuid=self.new_smuid,
                       registry=self.registry, new_request=lambda: uuid.uuid4().hex,
                       hash_password=hash_password, on_command=self.metrics.frame_in,
                       over_capacity=self._over_capacity, access=self.access,
                       scram_credentials=functools.partial(self.accounts.scram_credentials, source=peer),
                       login_outcome=functools.partial(self.accounts.login_outcome, source=peer),
                       new_nonce=lambda: secrets.token_urlsafe(18),
                       new_salt=lambda: (new_salt(), DEFAULT_ITERATIONS), store_credentials=stored_hash,
                       queue_params=self.queue_params, queued=self.book.sizes.of, peer=peer, tls=tls,
                       known_message=self.book.seen.get)

    def _over_capacity(self) -> str | None:
        """None while this gateway takes logins; else where to redirect them ("" = nowhere: 503)."""
        logins = sum(len(connections) for connections in self.sessions.values())
        return None if logins < self.config.gateway.max_logins else self.config.gateway.redirect_to

    async def start(self) -> None:
        """Fold partition 0 and read the deliveries topic, then listen.

        This node's previous incarnation's logins are gone, even after a crash: a ``NodeReset``
        says so before anything is folded.  Nothing is handed on while the book and the presence
        map are being read: only once both are complete (the fold past that reset) does
        ``handing_on`` start; no login is connected here before that, so nothing is missed."""
        self.kafka = Cluster(self.config.kafka, client_id="smqp-gateway")
        self.log = await open_commands_log(self.config.kafka, self.kafka)
        reset = await self.log.append(b"", NodeReset(self.config.gateway.node_id).to_bytes(), partition=0)
        self.control = control_tail(self.config.kafka, self.kafka, self._on_control)
        self.control.start()
        self.tail = deliveries_tail(self.config.kafka, self.kafka, self._on_deliveries)
        self.tail.start()
        await asyncio.wait_for(asyncio.gather(self.tail.ready.wait(), self.control.ready.wait()), 60)
        await self.folded(reset.offset)
        for ack in await read_acks_since(self.config.kafka, self.kafka, dict(self.book.commands_offsets)):
            self.book.acknowledged(ack.account, ack.smuid)
        self.handing_on = True
        self.server = await asyncio.start_server(self._accept, self.config.gateway.host, self.config.gateway.port,
                                                 limit=self.config.gateway.max_line_bytes * 2,
                                                 backlog=self.config.gateway.listen_backlog)
        log.info("SMQP gateway listening on %s", self.address)
        if self.config.gateway.tls_port:
            self.tls_server = await asyncio.start_server(
                self._accept, self.config.gateway.host, self.config.gateway.tls_port,
                limit=self.config.gateway.max_line_bytes * 2, ssl=tls_context(self.config.gateway),
                backlog=self.config.gateway.listen_backlog)
            log.info("SMQPS (TLS) listening on %s", self.tls_address)
        if self.config.gateway.status_port:
            self.status = await serve_http(self.config.gateway.host, self.config.gateway.status_port, {
                "/metrics": self._metrics_page, "/healthz": self._health_page})
            log.info("status page on http://%s:%s/metrics", *self.status_address)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.sockets[0].getsockname()[:2]

    @property
    def tls_address(self) -> tuple[str, int] | None:
        return self.tls_server.sockets[0].getsockname()[:2] if self.tls_server else None

    @property
    def status_address(self) -> tuple[str, int] | None:
        return self.status.sockets[0].getsockname()[:2] if self.status else None

    async def _metrics_page(self, query: str) -> Response:
        return Response(self.metrics.render(), CONTENT_TYPE)

    async def _health_page(self, query: str) -> Response:
        return Response("ok\n")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(self, reader, writer)
        self.connections.add(connection)
        self.metrics.connections_total.inc()
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)

    # -- the registry fold

    def _on_control(self, records: list) -> None:
        """Fold partition-0 records; tell watchers connected here (live changes only, not the replay)."""
        live = self.control.ready.is_set()
        for offset, event in records:
            if isinstance(event, RawPublish):
                self.registry.apply(None, offset)
                self._after_fold(offset, self._route_early, offset, event)
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
            delay = min(max(0.0, (until - time.time_ns() // 1000) / 1e6), UNTIL_RECHECK_S)
            self._until_timer = asyncio.get_running_loop().call_later(delay, self._until_passed)

    def _until_passed(self) -> None:
        """End the subscriptions whose UNTIL passed; their topics' watchers get NOTIFY SUBSCRIBERS."""
        self._until_timer, self._until_due = None, None
        for change in self.registry.end_subscriptions(time.time_ns() // 1000):
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

    def _route_early(self, offset: int, raw: RawPublish) -> None:
        """NOTIFY a DELIVERY ALL message as soon as its publish is folded, ahead of the job.

        The fold has then seen exactly the subscriptions that precede the publish in the log,
        the order the job routes by, so :meth:`Registry.recipients` names the accounts the job
        will route it to; the job's ``Deliver`` of it then finds it in the book and is ignored.
        Only once the book is complete (``handing_on``), only for publishes the job has not
        committed (past its progress), and only with one commands partition, which keeps each
        ACK after its publish in the job's input.  Messages already expired, and DELIVERY ONE
        (the job picks the subscriber), are left to the job."""
        if (not (self.routes_early and self.handing_on) or offset < self.book.commands_offsets.get("0", 0)
                or not self.registry.may_reach(raw.topic)):  # most publishes: decoded by nobody here
            return
        try:
            publish = decode(raw.value)
        except (ValueError, TypeError, KeyError):
            return  # the job skips it too
        if publish.delivery != "all" or (publish.expires_at is not None and publish.expires_at <= to_micros(
                datetime.now(timezone.utc))):
            return
        for account in self.registry.recipients(publish.topic, publish.accepted_at):
            deliver = self.book.speculate(Deliver(
                account, publish.smuid, publish.topic, publish.cmuid, publish.account, publish.guid,
                publish.accepted_at, publish.priority, publish.headers, publish.sections,
                expires_at=publish.expires_at))
            if deliver is not None:
                self.metrics.routed_early.inc()
                self._offer(deliver)

    def _offer(self, deliver: Deliver) -> None:
        """Queue a delivery new to the book at every login of its account here."""
        for connection in self.sessions.get(deliver.account, ()):
            connection.queue.push(deliver)
            connection.send_next()

    # -- deliveries

    def _on_deliveries(self, events: list) -> None:
        for event in events:
            if type(event) is AckedBatch:
                for acked in event.events():
                    self._on_delivery(acked)
            else:
                self._on_delivery(event)

    def _on_delivery(self, event) -> None:
        """One deliveries-topic event: into the book, and to the logins here it concerns."""
        if isinstance(event, RawDeliver):
            if self.book.knows(event.account, event.smuid):
                return  # routed early here, or acknowledged: the job's copy changes nothing
            try:
                event = decode(event.value)
            except (ValueError, TypeError, KeyError):
                log.warning("skipping undecodable deliveries record %r", event.value[:80])
                return
        deliver = self.book.apply(event)
        if deliver is not None and deliver.delivery == "one" and not self.logged_in_anywhere(deliver.account):
            # routed to a subscriber logged in at no gateway: hand it on if someone here can take it
            self._hand_on(deliver)
        elif deliver is not None:
            self._offer(deliver)
        elif isinstance(event, Acked):
            self._settled_hand_on(event.account, event.smuid)
            if event.reason != "acked":
                for connection in self.sessions.get(event.account, ()):
                    connection.withdraw(event.smuid)

    # -- farm-wide presence: handing DELIVERY ONE messages on from accounts logged in nowhere

    def logged_in_anywhere(self, account: str) -> bool:
        """Logged in here (known at once), or at another gateway (as far as the fold has got)."""
        return bool(self.sessions.get(account)) or self.presence.present(account)

    def _hand_on(self, deliver: Deliver, takers: list[str] | None = None) -> None:
        """NACK (``disconnect``) ``deliver``, locked to an account logged in nowhere, when one of
        ``takers`` (default: every account logged in here) could be handed it.

        Only a gateway with such a login NACKs, so a NACK finds someone online to release the
        message to, not a retry counted against it; several such gateways NACKing the same
        delivery is harmless (the second NACK finds it released).  Once per delivery per gateway,
        until the account logs in again or the delivery is settled."""
        if not self.handing_on or deliver.smuid in self.handed_on.get(deliver.account, ()):
            return
        takers = list(self.sessions) if takers is None else takers
        if any(a != deliver.account and self.registry.admits(a, deliver.topic, deliver.accepted_at) for a in takers):
            self.handed_on[deliver.account].add(deliver.smuid)
            self.nack(deliver.account, "", deliver, reason="disconnect")

    def _settled_hand_on(self, account: str, smuid: int) -> None:
        """The job settled (released, acknowledged, expired) ``account``'s delivery of ``smuid``."""
        done = self.handed_on.get(account)
        if done is not None:
            done.discard(smuid)
            if not done:
                del self.handed_on[account]

    def _hand_on_locked(self, accounts, takers: list[str] | None = None) -> None:
        """Hand on what is locked to each of ``accounts`` that is logged in nowhere."""
        for account in accounts:
            if not self.logged_in_anywhere(account):
                for deliver in self.book.locked_to(account):
                    self._hand_on(deliver, takers)

    def _presence_changed(self, change) -> None:
        if isinstance(change, Left):  # its last login anywhere ended: unlock what it held
            self._hand_on_locked([change.account])
        elif isinstance(change, Arrived):  # it is back: what it holds is its own again
            self.handed_on.pop(change.account, None)

    def _announce_presence(self, account: str) -> None:
        """Append whether ``account`` is logged in here *now* to partition 0 for every gateway's
        presence map.  A failed append is tried again a second later, with the state of then:
        each announcement says the whole truth, so a repeat or a late one does no harm."""
        if self.stopping:
            return
        event = Presence(node=self.config.gateway.node_id, account=account, present=bool(self.sessions.get(account)))
        future = self.log.append(b"", event.to_bytes(), partition=0)

        def settled(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception() is not None:
                log.warning("presence of %s not appended (%s): trying again", account, done.exception())
                asyncio.get_running_loop().call_later(1, self._announce_presence, account)
        future.add_done_callback(settled)

    def nack(self, account: str, guid: str, deliver: Deliver, reason: str = "timeout") -> None:
        """Append a NACK of ``deliver`` (its NOTIFY went unacknowledged, or its subscriber left)
        for the job to count or reassign, stamped with its topic's ``max_retries``.

        Best effort: a NACK lost to a Kafka outage only delays the Trash by one retry."""
        event = Nack(account=account, guid=guid or "", smuid=deliver.smuid,
                     accepted_at=int(time.time() * 1_000_000),
                     max_retries=self.queue_params(deliver.topic).max_retries, reason=reason)
        future = self.log.append(account.encode("utf-8"), event.to_bytes(), linger=True)
        future.add_done_callback(lambda done: done.exception() and log.warning(
            "NACK of %s for %s not appended: %s", deliver.smuid, account, done.exception()))

    def register(self, connection: Connection) -> None:
        """A login started.  The account's first one here is announced to the farm, and what is
        locked to accounts logged in nowhere that it could take is handed on."""
        account = connection.session.account
        connection.queue = self.book.queue_for_login(account)
        first = not self.sessions.get(account)
        self.sessions[account].append(connection)
        if first:
            self._announce_presence(account)
            self.handed_on.pop(account, None)
            self._hand_on_locked(self.book.accounts(), takers=[account])
        connection.send_next()

    def unregister(self, connection: Connection) -> None:
        """A login ended; whatever it left unacknowledged stays pending for the account.  Its last
        one here is announced to the farm; once every gateway has folded that the account is logged
        in nowhere, the DELIVERY ONE messages locked to it are handed on by the gateways where
        someone who could take them is logged in (XEP-0254: unlocked on disconnect)."""
        account = connection.session.account
        if account and connection in self.sessions.get(account, ()):
            self.sessions[account].remove(connection)
            if not self.sessions[account]:
                del self.sessions[account]
                self._announce_presence(account)

    def plan_shutdown(self, grace_s: float) -> None:
        """Ask :func:`serve` to stop with :meth:`close` (``grace_s``).  A later ask can only shorten
        the grace, even one under way: Ctrl-C during a SIGTERM's grace closes at once."""
        if self.shutdown_asked.is_set():
            grace_s = min(grace_s, self.shutdown_grace_s)
        self.shutdown_grace_s = grace_s
        self.shutdown_asked.set()

    def _admin_bye(self, event: PlannedShutdown) -> None:
        """``python -m gateway.admin bye`` named this gateway."""
        try:
            grace = parse_timeout(event.grace)
        except ValueError:
            grace = None
        if grace is None:
            log.warning("planned shutdown %s has no usable grace %r: ignored", event.request, event.grace)
            return
        log.info("planned shutdown %s: NOTIFY SERVER BYE %s, then closing", event.request, event.grace)
        self.plan_shutdown(grace.total_seconds())

    async def _bye_ahead(self, grace_s: float) -> None:
        """NOTIFY SERVER BYE <grace> (4.1.11.4.2) to every client, then serve those connected until
        the grace ends or they have all left.  No new connection is taken meanwhile (the listeners
        close first): a client moving to another gateway of the farm must not land here again."""
        for server in (self.server, self.tls_server):
            if server:
                server.close()
        timeout = format_timeout(timedelta(seconds=math.ceil(grace_s)))
        frame = f"NOTIFY SERVER BYE {timeout}\r\n\r\n".encode("ascii")
        for connection in list(self.connections):
            if not connection.closing:
                connection.send(frame)
        started = time.monotonic()
        while self.connections and time.monotonic() - started < min(grace_s, self._current_grace()):
            await asyncio.sleep(0.05)

    def _current_grace(self) -> float:
        """The grace as a later :meth:`plan_shutdown` may have shortened it."""
        return self.shutdown_grace_s if self.shutdown_asked.is_set() else float("inf")

    async def close(self, grace_s: float = 0.0) -> None:
        """Stop accepting, say NOTIFY SERVER BYE to every client, then close the Kafka clients.
        With ``grace_s`` (a planned shutdown), :meth:`_bye_ahead` first."""
        if grace_s > 0:
            await self._bye_ahead(grace_s)
        for server in (self.server, self.tls_server):
            if server:
                server.close()
        if self.status:
            self.status.close()
        for connection in list(self.connections):
            if not connection.closing:
                connection.send(connection.session.server_bye())
                connection.closing = True
                connection.put(None)
                connection.reader.feed_eof()
        await asyncio.sleep(0.2)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._connections_ended(), 3)
        await self._reset_presence()
        for tail in (self.tail, self.control):
            if tail:
                await tail.stop()
        if self.log:
            await self.log.close()
        if self.kafka:
            self.kafka.close()

    async def _connections_ended(self) -> None:
        while self.connections:
            await asyncio.sleep(0.05)

    async def _reset_presence(self) -> None:
        """A clean stop: tell the farm nobody is logged in here any more (each ended login has
        said so too; this covers one whose announcement is still being retried).  Bounded: with
        Kafka unreachable the other gateways keep this node's logins until it starts again."""
        self.stopping = True
        if not self.log:
            return
        try:
            await asyncio.wait_for(self.log.append(b"", NodeReset(self.config.gateway.node_id).to_bytes(),
                                                   partition=0), 2)
        except Exception as error:  # noqa: BLE001 - stopping anyway
            log.warning("could not announce this node's logins as ended: %s", error)


async def serve(config: SMQPConfig, ready: asyncio.Event | None = None) -> None:
    """Run a gateway until SIGINT (closes at once), SIGTERM (closes after ``[gateway]
    shutdown_grace_s``) or ``python -m gateway.admin bye`` naming its node (closes after the grace
    it names): :meth:`Gateway.plan_shutdown`."""
    gateway = Gateway(config)
    await gateway.start()
    host, port = gateway.address
    print(f"SMQP gateway ready on {host}:{port} (node {config.gateway.node_id})", flush=True)
    if gateway.tls_address:
        print("SMQPS (TLS) on {}:{}".format(*gateway.tls_address), flush=True)
    if gateway.status_address:
        print("status page on http://%s:%s/metrics" % gateway.status_address, flush=True)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, gateway.plan_shutdown, 0.0)  # Ctrl-C: at once
    loop.add_signal_handler(signal.SIGTERM, gateway.plan_shutdown, config.gateway.shutdown_grace_s)
    if ready:
        ready.set()
    await gateway.shutdown_asked.wait()
    await gateway.close(gateway.shutdown_grace_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="smqp-gateway",
        description="Run one SMQP gateway: clients connect over TCP; PUBLISH/SUBSCRIBE/ACK go to Kafka; "
                    "NOTIFYs come from the streaming job's deliveries topic.",
    )
    parser.add_argument("--config", help="TOML configuration file (default: $SMQP_CONFIG, else built-in defaults)")
    parser.add_argument("--host", help="listen address (overrides [gateway] host)")
    parser.add_argument("--port", type=int, help="listen port (overrides [gateway] port)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO is per-connection chatter
    config = load_config(args.config)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = replace(config, gateway=replace(config.gateway, **overrides))
    gc.set_threshold(*GC_THRESHOLDS)  # here, not in serve: the process's, not an embedding program's
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
