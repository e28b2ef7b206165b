"""The reference SMQP client: an asyncio library over the sans-I/O client reader.

    async with await SMQPClient.connect("127.0.0.1", 7720) as client:
        await client.login("guest", "")
        await client.subscribe("/stocks/*")
        smuid = await client.publish("/stocks/quotes/ibm", b"24.567")
        note = await client.next_notification()
        await note.ack()          # the two-phase 310 ACK

Replies are matched to commands in order, so several ``publish`` calls may
be in flight at once (pipelining); notifications are queued separately.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field

from gateway import client_protocol as cp
from schemas.events import Section


class SMQPError(Exception):
    """A non-2xx/3xx reply: ``code`` and the reply lines."""

    def __init__(self, code: int, lines: list[str]):
        super().__init__(f"{code} {' / '.join(lines)}")
        self.code = code
        self.lines = lines


@dataclass
class Notification:
    """A NOTIFY frame; ``ack()`` performs the client half of the two-phase commit."""

    client: SMQPClient
    resource: str
    topic: str
    headers: list[tuple[str, str]]
    sections: list[Section] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    @property
    def smuid(self) -> int:
        return int(self.header("Smuid").rsplit("/", 1)[1])

    @property
    def data(self) -> bytes:
        return b"".join(section.data for section in self.sections)

    async def ack(self) -> None:
        await self.client.command_raw(cp.ACK)


class SMQPClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer
        self._parser = cp.ServerReader()
        self._waiting: deque[asyncio.Future] = deque()
        self.notifications: asyncio.Queue[Notification] = asyncio.Queue()
        self.greeting: str = ""
        self._greeted = asyncio.get_running_loop().create_future()
        self._cmuids = itertools.count(1)
        self._task = asyncio.create_task(self._read_loop())
        self.closed = asyncio.Event()

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 10.0) -> SMQPClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        client = cls(reader, writer)
        client.greeting = await asyncio.wait_for(client._greeted, timeout)
        return client

    async def __aenter__(self) -> SMQPClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _read_loop(self) -> None:
        try:
            while data := await self._reader.read(65536):
                for frame in self._parser.feed(data):
                    self._dispatch(frame)
        except ConnectionError:
            pass
        finally:
            self.closed.set()
            for waiter in self._waiting:
                if not waiter.done():
                    waiter.set_exception(ConnectionError("connection closed by server"))
            if not self._greeted.done():
                self._greeted.set_exception(ConnectionError("connection closed before greeting"))

    def _dispatch(self, frame) -> None:
        if isinstance(frame, cp.Greeting):
            self._greeted.set_result(frame.text)
        elif isinstance(frame, cp.NotifyFrame):
            self.notifications.put_nowait(
                Notification(self, frame.resource, frame.topic, frame.headers, frame.sections))
        elif isinstance(frame, cp.ReplyFrame):
            if self._waiting:  # a cancelled waiter still owns its reply
                waiter = self._waiting.popleft()
                if not waiter.done():
                    waiter.set_result(frame)

    async def command_raw(self, data: bytes) -> cp.ReplyFrame:
        """Send prepared bytes and wait for the matching reply; raise SMQPError on 4xx/5xx."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._writer.write(data)
        await self._writer.drain()
        reply = await waiter
        if reply.code >= 400:
            raise SMQPError(reply.code, reply.lines)
        return reply

    async def command(self, *words: str) -> cp.ReplyFrame:
        return await self.command_raw(cp.render_command(*words))

    async def login(self, account: str, password: str = "") -> dict[str, str]:
        """LOGIN with CLEAR + PASS; returns the attributes of the 200 reply (Topic, Guid, …)."""
        await self.command("LOGIN", account, "CLEAR/1.0")
        reply = await self.command(*(["PASS", account, password] if password else ["PASS", account]))
        return dict(line.split(": ", 1) for line in reply.lines if ": " in line)

    async def publish(self, topic: str, data: bytes | str, *, content_type: str = "text/plain",
                      headers: list[tuple[str, str]] = (), cmuid: str | None = None) -> int:
        """PUB MESSAGE with one data section; returns the server's SMUID once durable."""
        body = data.encode() if isinstance(data, str) else data
        cmuid = cmuid or f"C{next(self._cmuids)}"
        section = Section([("Content-Type", content_type), ("Content-Length", str(len(body)))], body)
        reply = await self.command_raw(cp.render_publish(topic, cmuid, list(headers), [section]))
        return int(reply.lines[-1].split()[-1])

    async def subscribe(self, pattern: str) -> list[str]:
        return (await self.command("SUB", "MESSAGE", pattern)).lines[1:]

    async def unsubscribe(self, pattern: str) -> list[str]:
        return (await self.command("UNSUB", "MESSAGE", pattern)).lines[1:]

    async def noop(self) -> None:
        await self.command("NOOP")

    async def next_notification(self, timeout: float | None = None) -> Notification:
        return await asyncio.wait_for(self.notifications.get(), timeout)

    async def quit(self) -> None:
        await self.command("QUIT")
        await self.close()

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except ConnectionError:
            pass
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
