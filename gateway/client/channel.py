"""One connection to a gateway: the reader that pushes NOTIFYs aside, the in-order matching of
replies to requests, and the one multi-step exchange (SET LOGIN PASSWORD) holding it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.client import wire as cp
from gateway.client.messages import Notification, SMQPError

if TYPE_CHECKING:  # annotations only: those modules import this one
    from gateway.client.smqp_client import SMQPClient


#: Settles a request's future from its reply frame, as the reply is read (:meth:`Channel.submit`).
Settle = Callable[[asyncio.Future, "cp.Frame"], None]


CLOSED = object()  # queued after the last notification of a closed connection
_READ_LIMIT = 2 ** 16  # asyncio's default StreamReader limit


class _PushReader(asyncio.StreamReader):
    """A StreamReader that hands each chunk to its channel (:meth:`Channel.received`) as the
    transport delivers it, instead of buffering it for a read loop to collect: a reply then wakes
    the request waiting for it in the event-loop step it arrived in, not one step (and a task
    switch) later.  What arrives before the channel is attached is kept and handed over then."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=_READ_LIMIT, loop=loop)
        self._channel: Channel | None = None
        self._early: list[bytes] = []
        self._ended: tuple[BaseException | None] | None = None  # (exception,) once the connection ended

    def attach(self, channel: Channel) -> None:
        self._channel = channel
        early, self._early = b"".join(self._early), []
        if early:
            channel.received(early)
        if self._ended is not None:
            channel.ended()

    def feed_data(self, data: bytes) -> None:
        if self._channel is None:
            self._early.append(bytes(data))
        else:
            self._channel.received(data)

    def feed_eof(self) -> None:
        super().feed_eof()
        self._end(None)

    def set_exception(self, exc: BaseException) -> None:
        super().set_exception(exc)
        self._end(exc)

    def _end(self, exc: BaseException | None) -> None:
        self._ended = (exc,)
        if self._channel is not None:
            self._channel.ended()


async def open_connection(host: str, port: int, ssl: ssl_module.SSLContext | None
                          ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection`` with a :class:`_PushReader`."""
    loop = asyncio.get_running_loop()
    reader = _PushReader(loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(lambda: protocol, host, port, ssl=ssl)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def start_server(connected, host: str | None, port: int,
                       ssl: ssl_module.SSLContext | None = None) -> asyncio.Server:
    """``asyncio.start_server`` with a :class:`_PushReader` per connection."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: asyncio.StreamReaderProtocol(_PushReader(loop), connected, loop=loop), host, port, ssl=ssl)


class Channel:
    """One connection: writes requests, reads frames, matches replies to requests in order."""

    def __init__(self, client: SMQPClient, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 main: bool):
        self.client = client
        self.reader = reader
        self.writer = writer
        self.main = main
        # Smuids of the NOTIFY MESSAGEs handed over whose 310 ACK exchange is not done, oldest
        # first and at most the notify window of them: a retry of one of them is dropped
        self.unacknowledged: dict[str, None] = {}
        self.parser = cp.ServerReader(greeting=main)
        # per request sent, oldest first: the future its reply settles, and the function that
        # settles it as the reply is read (None: with the reply frame itself)
        self.waiting: deque[tuple[asyncio.Future, Settle | None]] = deque()
        self.lock = asyncio.Lock()  # held while writing, and across an exchange that must not interleave
        self._outgoing: list[bytes] = []  # written this tick, handed to the transport together at its end
        self.closed = asyncio.Event()
        self.error: Exception | None = None
        self.task: asyncio.Task | None = None
        if isinstance(reader, _PushReader):
            # the reader calls received() and ended() from then on; attached once the caller is
            # done building (the client keeps this channel as its _main only after it returns)
            asyncio.get_running_loop().call_soon(reader.attach, self)
        else:
            self.task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        """For a plain StreamReader: collect what it buffered, until the connection ends."""
        try:
            while not self.closed.is_set() and (data := await self.reader.read(65536)):
                self.received(data)
        except OSError:
            pass  # reset, or closed under us: the waiters hear "connection closed"
        finally:
            self.ended()

    def received(self, data: bytes) -> None:
        """Dispatch the frames completed by ``data``; bytes that fit no frame end the connection."""
        if self.closed.is_set():
            return
        try:
            for frame in self.parser.feed(data):
                self._dispatch(frame)
        except Exception as error:  # noqa: BLE001 - ServerProtocolError above all: we cannot resync
            self.error = error
            self.writer.transport.abort()
            self.ended()

    def ended(self) -> None:
        """The connection is gone (once): the waiters hear why, the client forgets the channel."""
        if self.closed.is_set():
            return
        self.closed.set()
        problem = self.error or ConnectionError("connection closed by server")
        for waiter, _ in self.waiting:
            if not waiter.done():
                waiter.set_exception(problem)
        self.waiting.clear()
        self.client._channel_closed(self)

    def _dispatch(self, frame: cp.Frame) -> None:
        if isinstance(frame, cp.Greeting):
            self.client._greeting(frame.text)
        elif isinstance(frame, cp.NotifyFrame):
            note = Notification(frame.resource, frame.topic, frame.headers, frame.sections, self.client, self)
            needs, smuid = note._ack_smuid()
            smuid = smuid if needs else None
            if smuid is not None and smuid in self.unacknowledged:
                return  # the server's retry of a NOTIFY handed over: one message, one 310 ACK
            if smuid is not None:
                self.unacknowledged[smuid] = None
                while len(self.unacknowledged) > self.client.notify_window:  # left unacknowledged
                    del self.unacknowledged[next(iter(self.unacknowledged))]
            self.client._notified(note)
        elif self.waiting:  # a reply or continuation; a cancelled waiter still owns its reply
            waiter, settle = self.waiting.popleft()
            if settle is not None:
                settle(waiter, frame)
            elif not waiter.done():
                waiter.set_result(frame)

    def submit(self, data: bytes, *, messages: bool = False, settle: Settle | None = None) -> asyncio.Future:
        """Write one request now; the future gets its reply frame, or what ``settle(future, reply)``
        makes of it: a 310 ACK's is checked as it is read, with no second future and no extra step
        of the event loop per acknowledgement.  Call with :attr:`lock` held."""
        if self.closed.is_set():
            raise self.error or ConnectionError("connection closed")
        waiter = asyncio.get_running_loop().create_future()
        self.waiting.append((waiter, settle))
        self.parser.expect_reply(messages=messages)
        self.write(data)
        return waiter

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the transport, after everything queued before it.  What a tick
        writes leaves in one ``send``: a consumer acknowledging a window's worth of NOTIFYs, or
        pipelined publishes, cost a system call per burst, not one per command."""
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._write_out)
        self._outgoing.append(data)

    def _write_out(self) -> None:
        data, self._outgoing = b"".join(self._outgoing), []
        if data and not self.writer.transport.is_closing():
            self.writer.write(data)

    async def close(self) -> None:
        self._write_out()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class Exchange:
    """A multi-step exchange (``+`` continuation lines) that holds the connection.  A refusal
    (4xx/5xx) ends it; anything else that stops it half way (cancelled, a protocol or SCRAM
    error) drops the connection, since the server would read what we send next as a step."""

    def __init__(self, channel: Channel, name: str):
        self.channel = channel
        self.name = name
        self.open = False  # the server is reading our lines as steps

    async def __aenter__(self) -> Exchange:
        await self.channel.lock.acquire()
        return self

    async def __aexit__(self, kind, error, traceback) -> None:
        try:
            if kind is not None and self.open:
                self.channel.writer.transport.abort()
        finally:
            self.channel.lock.release()

    async def step(self, data: bytes, expect: type, *, last: bool = False):
        waiter = self.channel.submit(data)
        self.open = not last
        await self.channel.writer.drain()
        reply = await waiter
        if isinstance(reply, cp.ReplyFrame) and reply.code >= 400:
            self.open = False  # a refusal ends the exchange
            raise SMQPError(reply.code, reply.lines)
        if not isinstance(reply, expect):
            raise cp.ServerProtocolError(f"{self.name}: unexpected {reply!r}")
        return reply
