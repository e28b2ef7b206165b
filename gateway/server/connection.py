"""One client connection: the pump that reads bytes into the session and carries out its
actions in order, writing replies in command order, and the bounds on what a slow client makes us buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.server.book import NotifyQueue
from gateway.protocol.actions import (
    CheckRemote,
    Close,
    ConnectNotify,
    Consult,
    Control,
    Durable,
    LoggedIn,
    ReadMessages,
    Send,
    Wake,
)
from gateway.replies import NOT_FOUND, REQUEST_TIMEOUT, Reply, SERVICE_UNAVAILABLE
from gateway.server import remote
from gateway.server.notify_channel import NotifyChannel
from gateway.server.notifying import InFlight, Notice, Notifying
from schemas.events import Ack, Publish

if TYPE_CHECKING:  # annotations only: that module imports this one
    from gateway.server.gateway import Gateway

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


class Connection(Notifying):
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
        self.in_flight: dict[int, InFlight] = {}
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
            elif isinstance(action, CheckRemote):  # CREATE TOPIC /x > <domain>/<topic>: ask that farm
                self._block(remote.perform(self.gateway.config.federation, action))
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
        store = self.gateway.messages

        def read(topic: str) -> list:
            if action.smuids_only:
                return store.smuids(topic, action.now)
            return store.messages(topic, action.now, action.span)
        found = await asyncio.to_thread(lambda: [m for t in action.topics for m in read(t)])
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
        record = action.event.to_bytes()
        future = self.gateway.log.append(action.key, record, linger=linger)
        if isinstance(action.event, Publish):
            self.gateway.remember_own(record, action.event, future)
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

    def _ack_written(self, entry: InFlight) -> None:
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
        elif self._held_by_ack and type(item) is Notice and not self._notices_due:
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
            if type(item) is Notice:
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


def _unavailable() -> bytes:
    return Reply(SERVICE_UNAVAILABLE, ("Service unavailable: message store not reachable",)).to_bytes()


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
