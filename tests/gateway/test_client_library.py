"""SMQPClient and the ``smqp`` command line against a tiny scripted server.

Each test's server is a real asyncio server on 127.0.0.1 that replays a
script: it checks the client's bytes exactly (``expect``) and answers with
the decided server formats byte for byte (``send``).  Bytes the client sends
beyond the script fail the test, so each test also proves nothing else went
over the wire (no stray empty line in the password exchange, no ACK on the
wrong connection).  Everything is bounded in time: ``pytest-timeout`` per
test, ``asyncio.wait_for`` around every read and every test body.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone

import pytest

from gateway.client import cli
from gateway.client import wire as cp
from gateway.client import SMQPClient, SMQPError
from schemas.events import Section

pytestmark = pytest.mark.timeout(30)

STEP_TIMEOUT = 5.0
TEST_TIMEOUT = 15.0

GREETING = b"SMQP/1.0 Ready. Scripted SMQP Server\r\n"
OK = b"200 OK\r\n\r\n"
LOGIN = [
    (b"LOGIN guest CLEAR/1.0\r\n\r\n", OK),
    (b"PASS guest\r\n\r\n", b"200-OK\r\n200-Topic: /accounts/guest\r\n200-Timeout: 00:24:00:00\r\n"
                            b"200-Time: D20010823T14451246Z\r\n200 Guid: guest0456\r\n\r\n"),
]
QUIT = [(b"QUIT\r\n\r\n", OK)]


class Conn:
    """The server's end of one connection, for scripts."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def expect(self, data: bytes) -> None:
        try:
            got = await asyncio.wait_for(self.reader.readexactly(len(data)), STEP_TIMEOUT)
        except asyncio.IncompleteReadError as error:
            got = error.partial
        assert got == data, f"client sent {got!r}, script expected {data!r}"

    async def read_command(self) -> bytes:
        """A command whose exact bytes the script cannot know (it holds a port number)."""
        return await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), STEP_TIMEOUT)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def steps(self, steps: list[tuple[bytes, bytes]]) -> None:
        for expected, answer in steps:
            await self.expect(expected)
            await self.send(answer)


Script = Callable[[Conn], Awaitable[None]]


def steps(*groups: list[tuple[bytes, bytes]]) -> Script:
    """A script of (client bytes, server answer) pairs."""
    async def script(conn: Conn) -> None:
        for group in groups:
            await conn.steps(group)
    return script


class ScriptedServer:
    """Accepts one connection, greets, runs the script, then requires the client to
    close without sending anything more.  Script failures are re-raised on exit."""

    def __init__(self, script: Script, greeting: bytes = GREETING):
        self.script = script
        self.greeting = greeting
        self.error: BaseException | None = None
        self.done = asyncio.Event()
        self.connections = 0

    async def __aenter__(self) -> ScriptedServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = Conn(reader, writer)
        try:
            assert self.connections == 1, "a second connection"
            await conn.send(self.greeting)
            await self.script(conn)
            rest = await asyncio.wait_for(reader.read(), STEP_TIMEOUT)
            assert rest == b"", f"client sent {rest!r} after the script ended"
        except BaseException as error:  # noqa: BLE001 - reported by __aexit__
            self.error = self.error or error
        finally:
            writer.close()
            self.done.set()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                await asyncio.wait_for(self.done.wait(), STEP_TIMEOUT)
        finally:
            self.server.close()
            await self.server.wait_closed()
        if self.error is not None:
            raise AssertionError(f"server script: {self.error!r}") from self.error


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), TEST_TIMEOUT))


async def logged_in(server: ScriptedServer) -> SMQPClient:
    return await SMQPClient.open("127.0.0.1", server.port, "guest", "")


def scripted(*groups: list[tuple[bytes, bytes]]):
    """Decorator: run ``test(client)`` against a server scripted with LOGIN, ``groups``, QUIT."""
    def decorate(test: Callable[[SMQPClient], Awaitable[None]]):
        def wrapper() -> None:
            async def body() -> None:
                async with ScriptedServer(steps(LOGIN, *groups, QUIT)) as server:
                    client = await logged_in(server)
                    async with client:
                        await test(client)
                        await client.quit()
            run(body)
        wrapper.__name__ = test.__name__
        wrapper.__doc__ = test.__doc__
        return wrapper
    return decorate


# --------------------------------------------------------------------------
# The library, command by command


@scripted([
    (b"COUNT TOPIC /news\r\n\r\n", b"200-OK\r\n200 2\r\n\r\n"),
    (b"COUNT MESSAGE /stock/quote/ibm\r\n\r\n", b"200-OK\r\n200 45\r\n\r\n"),
    (b"COUNT SUBSCRIBERS /stock/quote/ibm\r\n\r\n", b"200-OK\r\n200 12\r\n\r\n"),
    (b"LIST TOPIC /\r\n\r\n", b"200-OK\r\n200-/stocks\r\n200-/info\r\n200-/news > /info/news/cnn\r\n"
                              b"200 /weather\r\n\r\n"),
    (b"LIST TOPIC /weather\r\n\r\n", OK),
    (b"LIST MESSAGE /stocks/quotes/ibm\r\n\r\n", b"200-OK\r\n200 1809-1812,1845\r\n\r\n"),
    (b"LIST MESSAGE /empty\r\n\r\n", OK),
    (b"LIST SUBSCRIPTIONS\r\n\r\n", b"200-OK\r\n200-/stocks/quotes/ibm\r\n200 /stocks/quotes/*\r\n\r\n"),
    (b"LIST SUBSCRIPTIONS\r\n\r\n", OK),
    (b"GET TOPIC KEYWORDS /stocks/quotes/ibm\r\n\r\n", b"200-OK\r\n200 IBM,BIG BLUE\r\n\r\n"),
    (b"FIND TOPIC /stocks/* BLUE,IBM\r\n\r\n", b"200-OK\r\n200-/stocks/ibm (IBM,STOCKS,BIG BLUE)\r\n"
                                               b"200 /stocks/floral (FLOWERS,BLUE CARNATIONS)\r\n\r\n"),
    (b"FIND TOPIC /stocks\r\n\r\n", b"200-OK\r\n200 /stocks\r\n\r\n"),
])
async def test_count_list_find_and_keywords(client: SMQPClient):
    assert client.greeting == GREETING.decode().strip()
    assert client.login_attributes["Topic"] == "/accounts/guest"
    assert await client.count_topics("/news") == 2
    assert await client.count_messages("/stock/quote/ibm") == 45
    assert await client.count_subscribers("/stock/quote/ibm") == 12
    assert await client.list_topics() == [("/stocks", None), ("/info", None), ("/news", "/info/news/cnn"),
                                          ("/weather", None)]
    assert await client.list_topics("/weather") == []
    assert await client.list_messages("/stocks/quotes/ibm") == [1809, 1810, 1811, 1812, 1845]
    assert await client.list_messages("/empty") == []
    assert await client.list_subscriptions() == ["/stocks/quotes/ibm", "/stocks/quotes/*"]
    assert await client.list_subscriptions() == []
    assert await client.get_keywords("/stocks/quotes/ibm") == ["IBM", "BIG BLUE"]
    assert await client.find_topics("/stocks/*", ["BLUE", "IBM"]) == [
        ("/stocks/ibm", ["IBM", "STOCKS", "BIG BLUE"]), ("/stocks/floral", ["FLOWERS", "BLUE CARNATIONS"])]
    assert await client.find_topics("/stocks") == [("/stocks", [])]


@scripted([
    (b"CREATE TOPIC /stocks/quotes/ibm\r\n\r\n", OK),
    (b"CREATE TOPIC /stocks/ibm (IBM,STOCKS,QUOTE,BIG BLUE)\r\n\r\n", OK),
    (b"CREATE TOPIC /stocks/ibm2 (BIG BLUE) > /stocks/quotes/ibm\r\n\r\n", OK),
    (b"CREATE TOPIC /news > /info/news/cnn\r\n\r\n", b"409 Conflict\r\n\r\n"),
    (b"REMOVE TOPIC /stocks/quotes/ibm\r\n\r\n", b"200-OK\r\n200 12 messages pending\r\n\r\n"),
    (b"SET TOPIC NAME /stocks/quotes/ibm /stocks/ibm/quote\r\n\r\n", OK),
    (b"SET TOPIC KEYWORD /stocks/ibm (BLUE,IBM,STOCKS)\r\n\r\n", OK),
    (b"SET TOPIC KEYWORD /stocks/ibm ()\r\n\r\n", OK),
])
async def test_topic_administration(client: SMQPClient):
    await client.create_topic("/stocks/quotes/ibm")
    await client.create_topic("/stocks/ibm", ["IBM", "STOCKS", "QUOTE", "BIG BLUE"])
    await client.create_topic("/stocks/ibm2", ("BIG BLUE",), target="/stocks/quotes/ibm")
    with pytest.raises(SMQPError) as refused:
        await client.create_topic("/news", target="/info/news/cnn")
    assert (refused.value.code, refused.value.reply_class, refused.value.lines) == (409, 4, ["Conflict"])
    assert await client.remove_topic("/stocks/quotes/ibm") == 12
    await client.rename_topic("/stocks/quotes/ibm", "/stocks/ibm/quote")
    await client.set_keywords("/stocks/ibm", ["BLUE", "IBM", "STOCKS"])
    await client.set_keywords("/stocks/ibm", [])
    with pytest.raises(ValueError):  # refused before anything is sent
        await client.create_topic("/x", ["A,B"])


@scripted([
    (b"SET LOGIN NAME Jayne Smith\r\n\r\n", OK),
    (b"SET LOGIN EMAIL jayne@example.com\r\n\r\n", OK),
    (b"SET LOGIN ADDRESS 9974 Scripps Ranch Blvd., San Diego\r\n\r\n", OK),
    (b"SET LOGIN PHONE +1-555-0100\r\n\r\n", OK),
    (b"SET NOTIFY SUSPEND\r\n\r\n", OK),
    (b"SET NOTIFY SUSPEND /stocks/*\r\n\r\n", OK),
    (b"SET NOTIFY RESUME /stocks/*\r\n\r\n", OK),
    (b"SET NOTIFY RESUME\r\n\r\n", OK),
    (b"NOOP\r\n\r\n", OK),
])
async def test_set_login_and_suspend_resume(client: SMQPClient):
    await client.set_login("name", "Jayne Smith")
    await client.set_login("EMAIL", "jayne@example.com")
    await client.set_login("Address", "9974 Scripps Ranch Blvd., San Diego")
    await client.set_login("PHONE", "+1-555-0100")
    for bad in (("PASSWORD", "x"), ("SHOE", "9"), ("NAME", " ")):
        with pytest.raises(ValueError):
            await client.set_login(*bad)
    await client.suspend()
    await client.suspend("/stocks/*")
    await client.resume("/stocks/*")
    await client.resume()
    await client.noop()


PASSWORD_EXCHANGE = [
    (b"SET LOGIN PASSWORD CLEAR/1.0\r\n", b"200-OK\r\n200 + old password\r\n\r\n"),
    (b"old pw\r\n", b"+ new password\r\n\r\n"),
    (b"n3w\r\n", OK),
]


def test_change_password_sends_bare_lines_and_holds_the_connection():
    """No empty line after any exchange line (it would be read as a password), and a
    command issued meanwhile goes out only once the exchange is over."""
    async def body() -> None:
        async with ScriptedServer(steps(LOGIN, PASSWORD_EXCHANGE, [(b"NOOP\r\n\r\n", OK)], QUIT)) as server:
            async with await logged_in(server) as client:
                change = asyncio.create_task(client.change_password("old pw", "n3w"))
                await asyncio.sleep(0)  # the exchange has the connection
                await asyncio.gather(change, client.noop())
                await client.quit()
    run(body)


def test_change_password_refusals_leave_the_connection_usable():
    async def body() -> None:
        script = steps(LOGIN,
                       [(b"SET LOGIN PASSWORD CLEAR/1.0\r\n", b"200-OK\r\n200 + old password\r\n\r\n"),
                        (b"wrong\r\n", b"401 Unauthorized\r\n\r\n"),
                        (b"SET LOGIN PASSWORD CLEAR/1.0\r\n", b"405 Not allowed\r\n\r\n"),
                        (b"SET LOGIN PASSWORD CLEAR/1.0\r\n", b"200-OK\r\n200 + old password\r\n\r\n"),
                        (b"\r\n", b"+ new password\r\n\r\n"),
                        (b"x\r\n", b"400 Bad request (password rules)\r\n\r\n"),
                        (b"NOOP\r\n\r\n", OK)],
                       QUIT)
        async with ScriptedServer(script) as server:
            async with await logged_in(server) as client:
                for old, code in (("wrong", 401), ("any", 405), ("", 400)):
                    with pytest.raises(SMQPError) as refused:
                        await client.change_password(old, "x")
                    assert refused.value.code == code
                await client.noop()
                with pytest.raises(ValueError):
                    await client.change_password("a\r\nQUIT", "b")
                await client.quit()
    run(body)


def stored(smuid: int, topic: str, sections: bytes, *extra: bytes) -> bytes:
    return (b"Topic: " + topic.encode() + b"\r\nCreated: D20010815T08032445Z\r\nSmuid: host/" + str(smuid).encode()
            + b"\r\nCmuid: ann/ann01/A" + str(smuid).encode() + b"\r\n" + b"".join(extra) + b"\r\n"
            + sections + b".\r\n")


TEXT_SECTION = b"Content-Type: text/plain\r\nContent-Length: 6\r\n\r\n34.456\r\n"
DOTS = b"\r\n.\r\nTopic: /x\r\n\r\n"
TWO_SECTIONS = (b"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello\r\n\r\n"
                b"Content-Type: application/octet-stream\r\nContent-Length: " + str(len(DOTS)).encode()
                + b"\r\n\r\n" + DOTS + b"\r\n")
GET_REPLY = (b"200 OK\r\n" + stored(1845, "/stocks/quotes/ibm", TEXT_SECTION, b"Priority: 1\r\n")
             + stored(1905, "/stocks/quotes/ibm", TWO_SECTIONS) + b"\r\n")


@scripted([
    (b"GET MESSAGE /stocks/quotes/ibm 1845-1890,1905\r\n\r\n",
     b"NOTIFY SUB /stocks/quotes/ibm\r\nCOUNT: 3\r\n\r\n" + GET_REPLY),
    (b"GET MESSAGE /stocks/quotes/ibm 1845\r\n\r\nNOOP\r\n\r\nGET MESSAGE /stocks/quotes/ibm *\r\n\r\n",
     b"200 OK\r\n" + stored(1845, "/stocks/quotes/ibm", TEXT_SECTION) + b"\r\n" + OK + GET_REPLY),
    (b"GET MESSAGE /stocks/quotes/ibm 1-3,7\r\n\r\n", b"404 Not found (no such message)\r\n\r\n"),
])
async def test_get_messages(client: SMQPClient):
    first, second = await client.get_messages("/stocks/quotes/ibm", "1845-1890,1905")
    assert (first.topic, first.smuid, first.cmuid, first.header("priority")) == (
        "/stocks/quotes/ibm", 1845, "ann/ann01/A1845", "1")
    assert first.headers[:2] == [("Topic", "/stocks/quotes/ibm"), ("Created", "D20010815T08032445Z")]
    assert first.sections == [Section([("Content-Type", "text/plain"), ("Content-Length", "6")], b"34.456")]
    assert [s.data for s in second.sections] == [b"hello", DOTS]
    assert second.data == b"hello" + DOTS
    # the SUB notification that came first is queued, not mistaken for the reply
    note = await client.next_notification(1)
    assert (note.resource, note.topic, note.count) == ("SUBSCRIBERS", "/stocks/quotes/ibm", 3)
    # pipelined: GET, NOOP, GET — each reply read the right way
    one, _, every = await asyncio.gather(client.get_messages("/stocks/quotes/ibm", 1845), client.noop(),
                                         client.get_messages("/stocks/quotes/ibm"))
    assert [m.smuid for m in one] == [1845] and [m.smuid for m in every] == [1845, 1905]
    with pytest.raises(SMQPError) as missing:
        await client.get_messages("/stocks/quotes/ibm", [1, 2, 3, 7])
    assert missing.value.code == 404


@scripted([
    (b"SUB MESSAGE /stocks/quotes/ibm\r\n\r\n", b"200-OK\r\n200 /stocks/quotes/ibm\r\n\r\n"),
    (b"SUB MESSAGE /stocks/quotes/* SINCE D20010915T08000000Z UNTIL D20010915T123000\r\n\r\n",
     b"200-OK\r\n200-/stocks/quotes/ibm\r\n200-/stocks/quotes/msft\r\n200 /stocks/quotes/sony\r\n\r\n"),
    (b"SUB MESSAGE /a SINCE D20010916T08000000Z UNTIL D20010915T08000000Z\r\n\r\n", b"409 Conflict\r\n\r\n"),
    (b"SUB TOPIC /stocks/*\r\n\r\n", b"200-OK\r\n200 /stocks/*\r\n\r\n"),
    (b"SUB SUBSCRIBER /stocks/quotes/ibm\r\n\r\n", b"200-OK\r\n200 /stocks/quotes/ibm\r\n\r\n"),
    (b"SUB SERVER TIMEOUT\r\n\r\n", OK + b"NOTIFY SERVER TIMEOUT 00:05:00\r\n\r\n"),
    (b"UNSUB MESSAGE /stocks/*\r\n\r\n", b"200-OK\r\n200-MESSAGE /stocks/quotes/ibm\r\n"
                                         b"200 MESSAGE /stocks/quotes/sony\r\n\r\n"),
    (b"UNSUB TOPIC /stocks/*\r\n\r\n", b"200-OK\r\n200 TOPIC /stocks/*\r\n\r\n"),
    (b"UNSUB SUBSCRIBER /stocks/quotes/ibm\r\n\r\n", b"200-OK\r\n200 SUB /stocks/quotes/ibm\r\n\r\n"),
    (b"UNSUB SERVER TIMEOUT\r\n\r\n", b"200-OK\r\n200 SERVER TIMEOUT\r\n\r\n"),
    (b"UNSUB *\r\n\r\n", b"200-OK\r\n200-MESSAGE /stocks/quotes/ibm\r\n200-TOPIC /stocks/quotes/beos\r\n"
                         b"200 SUB /stocks/quotes/ibm\r\n\r\n"),
    (b"UNSUB MESSAGE *\r\n\r\n", b"404 Not found (not subscribed to /*)\r\n\r\n"),
])
async def test_subscribe_and_unsubscribe_variants(client: SMQPClient):
    assert await client.subscribe("/stocks/quotes/ibm") == ["/stocks/quotes/ibm"]
    assert await client.subscribe("/stocks/quotes/*", since=datetime(2001, 9, 15, 8, tzinfo=timezone.utc),
                                  until="D20010915T123000") == [
        "/stocks/quotes/ibm", "/stocks/quotes/msft", "/stocks/quotes/sony"]
    with pytest.raises(SMQPError):
        await client.subscribe("/a", until=datetime(2001, 9, 15, 8), since=datetime(2001, 9, 16, 8))
    assert await client.subscribe_topic("/stocks/*") == ["/stocks/*"]
    assert await client.subscribe_subscribers("/stocks/quotes/ibm") == ["/stocks/quotes/ibm"]
    await client.subscribe_server_timeout()
    note = await client.next_notification(1)
    assert (note.resource, note.action, note.timeout, note.needs_ack) == ("SERVER", "TIMEOUT", "00:05:00", False)
    assert await client.unsubscribe("/stocks/*") == [("MESSAGE", "/stocks/quotes/ibm"),
                                                     ("MESSAGE", "/stocks/quotes/sony")]
    assert await client.unsubscribe_topic("/stocks/*") == [("TOPIC", "/stocks/*")]
    assert await client.unsubscribe_subscribers("/stocks/quotes/ibm") == [("SUBSCRIBERS", "/stocks/quotes/ibm")]
    await client.unsubscribe_server_timeout()
    assert await client.unsubscribe_all() == [("MESSAGE", "/stocks/quotes/ibm"), ("TOPIC", "/stocks/quotes/beos"),
                                              ("SUBSCRIBERS", "/stocks/quotes/ibm")]
    with pytest.raises(SMQPError):
        await client.unsubscribe("*")


NOTIFY_MESSAGE = (b"NOTIFY MESSAGE /stocks/quotes/ibm\r\nCreated: D20010815T08032445Z\r\nSmuid: www.host.com/1835\r\n"
                  b"Cmuid: jtegen/jtegen497549/A004\r\nReply: YES\r\n\r\n" + TEXT_SECTION + b".\r\n\r\n")
NOTIFY_OTHERS = (b"NOTIFY TOPIC /stocks/quotes/ibm\r\nAction: RENAME /stocks/quotes/big_blue\r\n\r\n"
                 b"NOTIFY TOPIC /stocks/ibm\r\nAction: KEYWORDS IBM,BIG BLUE\r\n\r\n"
                 b"NOTIFY TOPIC /stocks/new\r\nAction: ADD\r\n\r\n"
                 b"NOTIFY SUB /stocks/quotes/ibm\r\nCOUNT: 34\r\n\r\n")


def test_notifications_of_every_kind_interleaved_with_replies():
    """NOTIFYs between pipelined replies; only MESSAGE is acknowledged; PUB REPLY to it;
    BYE then the server closes: the queue says so after the last notification."""
    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        await conn.expect(b"NOOP\r\n\r\nNOOP\r\n\r\n")
        await conn.send(OK + NOTIFY_OTHERS + OK + NOTIFY_MESSAGE)
        await conn.steps([
            (cp.ACK, b"310 ACK\r\n\r\n"),
            (b"PUB REPLY /stocks/quotes/ibm CF0456\r\nCmuid: jtegen/jtegen497549/A004\r\nPriority: 1\r\n\r\n"
             b"Content-Type: text/plain\r\nContent-Length: 9\r\n\r\nThank you\r\n.\r\n\r\n",
             b"200-OK\r\n200 CF0456 1838\r\n\r\n"),
        ])
        await conn.send(b"NOTIFY SERVER BYE\r\n\r\n")
        conn.writer.close()

    async def body() -> None:
        server = ScriptedServer(script)
        async with server:
            async with await logged_in(server) as client:
                await asyncio.gather(client.noop(), client.noop())
                notes = [await client.next_notification(1) for _ in range(5)]
                renamed, keywords, added, count, message = notes
                assert (renamed.resource, renamed.topic, renamed.action, renamed.new_name) == (
                    "TOPIC", "/stocks/quotes/ibm", "RENAME", "/stocks/quotes/big_blue")
                assert (keywords.action, keywords.keywords) == ("KEYWORDS", ["IBM", "BIG BLUE"])
                assert (added.action, added.value) == ("ADDED", None)
                assert (count.resource, count.count) == ("SUBSCRIBERS", 34)
                for note in notes[:4]:
                    assert not note.needs_ack
                    await note.ack()  # nothing is sent
                assert (message.smuid, message.cmuid, message.header("reply")) == (
                    1835, "jtegen/jtegen497549/A004", "YES")
                assert message.needs_ack
                await message.ack()
                await message.ack()  # once only
                assert await message.reply("Thank you", cmuid="CF0456", headers=[("Priority", "1")]) == 1838
                bye = await client.next_notification(1)
                assert (bye.resource, bye.action, bye.timeout) == ("SERVER", "BYE", None)
                for _ in range(2):  # and again: it stays closed
                    with pytest.raises(ConnectionError):
                        await client.next_notification(1)
                with pytest.raises(ConnectionError):
                    await client.noop()
    run(body)


@scripted([
    (b"PUB MESSAGE /stocks/quotes/ibm C1\r\n\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\n24.567\r\n"
     b".\r\n\r\n"
     b"PUB MESSAGE /stocks/quotes/ibm C2\r\nName: q\r\n\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
     b"\r\n{}\r\n.\r\n\r\n"
     b"PUB MESSAGE /nope C3\r\n\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n\r\n.\r\n\r\n",
     b"200-OK\r\n200 C1 1810\r\n\r\n200-OK\r\n200 C2 1811\r\n\r\n404 Not found\r\n\r\n"),
    (b"PUB REPLY /stocks/quotes/ibm A9\r\nCmuid: jtegen/g/A004\r\nX-A: b\r\n\r\n"
     b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\nok\r\n.\r\n\r\n",
     b"200-OK\r\n200 A9 1840\r\n\r\n"),
    (b"NOOP\r\n\r\n", OK + b"NOTIFY MESSAGE /accounts/guest\r\nCreated: D20010815T08035341Z\r\nSmuid: host/1840\r\n"
                      b"Cmuid: bob/bob1/A9\r\nIn-Reply-To: jtegen/g/A004\r\nReply-Topic: /stocks/quotes/ibm\r\n\r\n"
                      b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\nok\r\n.\r\n\r\n"),
    (cp.ACK, b"310 ACK\r\n\r\n"),
])
async def test_pipelined_publishes_and_replies(client: SMQPClient):
    results = await asyncio.gather(
        client.publish("/stocks/quotes/ibm", "24.567"),
        client.publish("/stocks/quotes/ibm", b"{}", content_type="application/json", headers=[("Name", "q")]),
        client.publish("/nope", b""), return_exceptions=True)
    assert results[:2] == [1810, 1811] and isinstance(results[2], SMQPError) and results[2].code == 404
    # a Cmuid among the extra headers is replaced by the one replied to
    assert await client.publish_reply("/stocks/quotes/ibm", "jtegen/g/A004", b"ok", cmuid="A9",
                                      headers=[("Cmuid", "spoof"), ("X-A", "b")]) == 1840
    await client.noop()
    reply = await client.next_notification(1)
    assert (reply.topic, reply.header("In-Reply-To"), reply.header("Reply-Topic"), reply.data) == (
        "/accounts/guest", "jtegen/g/A004", "/stocks/quotes/ibm", b"ok")
    await reply.ack()


def test_notify_port_uses_a_real_listener():
    """SET NOTIFY PORT: the client listens first; the scripted server connects to that
    port before replying, sends NOTIFYs there and reads the 310 ACK there."""
    seen: dict = {}

    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        command = await conn.read_command()
        words = command.decode().split()
        assert words[:3] == ["SET", "NOTIFY", "PORT"] and len(words) == 4, command
        seen["port"] = int(words[3])
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", seen["port"]), STEP_TIMEOUT)
        notify = Conn(reader, writer)
        await conn.send(OK)
        await notify.send(NOTIFY_MESSAGE + b"NOTIFY TOPIC /t\r\nAction: DELETED\r\n\r\n")
        await notify.expect(cp.ACK)
        await notify.send(b"310 ACK\r\n\r\n")
        await conn.steps(QUIT)
        assert await asyncio.wait_for(reader.read(), STEP_TIMEOUT) == b""  # nothing else came there
        writer.close()

    async def body() -> None:
        async with ScriptedServer(script) as server:
            async with await logged_in(server) as client:
                port = await client.notify_port()
                assert port == seen["port"] and port != server.port
                message = await client.next_notification(2)
                assert (message.resource, message.smuid) == ("MESSAGE", 1835)
                await message.ack()  # answered on the notify connection: the main script expects only QUIT
                deleted = await client.next_notification(2)
                assert (deleted.resource, deleted.topic, deleted.action) == ("TOPIC", "/t", "DELETED")
                await client.quit()
    run(body)


def test_notify_port_refused_closes_the_listener():
    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        await conn.read_command()
        await conn.send(b"408 Request timeout\r\n\r\n")
        await conn.steps(QUIT)

    async def body() -> None:
        async with ScriptedServer(script) as server:
            async with await logged_in(server) as client:
                with pytest.raises(SMQPError) as refused:
                    await client.notify_port()
                assert refused.value.code == 408
                await client.quit()
    run(body)


def test_login_follows_a_redirect():
    async def body() -> None:
        async with ScriptedServer(steps(LOGIN, QUIT)) as target:
            redirect = steps([(b"LOGIN guest CLEAR/1.0\r\n\r\n",
                               b"311-Redirect request\r\n311 127.0.0.1:" + str(target.port).encode() + b"\r\n\r\n")])
            async with ScriptedServer(redirect) as first:
                async with await SMQPClient.open("127.0.0.1", first.port) as client:
                    assert client.login_attributes["Guid"] == "guest0456"
                    await client.quit()
    run(body)


def test_login_refused_and_garbage_from_the_server():
    async def body() -> None:
        async with ScriptedServer(steps([(b"LOGIN nobody CLEAR/1.0\r\n\r\n", b"404 Not found\r\n\r\n")])) as server:
            with pytest.raises(SMQPError) as refused:
                await SMQPClient.open("127.0.0.1", server.port, "nobody")
            assert refused.value.code == 404
        async with ScriptedServer(steps([(b"LOGIN guest CLEAR/1.0\r\n\r\n", b"hello?\r\n")])) as server:
            with pytest.raises(cp.ServerProtocolError):
                await SMQPClient.open("127.0.0.1", server.port)
    run(body)


def test_server_closing_fails_pending_commands():
    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        await conn.expect(b"COUNT TOPIC /a\r\n\r\n")
        await conn.send(b"200-OK\r\n")  # and goes away mid-reply
        conn.writer.close()

    async def body() -> None:
        async with ScriptedServer(script) as server:
            async with await logged_in(server) as client:
                with pytest.raises(ConnectionError):
                    await client.count_topics("/a")
                with pytest.raises(ConnectionError):
                    await client.next_notification(1)
    run(body)


# --------------------------------------------------------------------------
# The command line, against the same scripted server run in a thread


class ThreadedServer:
    """A :class:`ScriptedServer` on its own event loop, for ``cli.main`` (which runs asyncio itself)."""

    def __init__(self, script: Script):
        self.script = script
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def __enter__(self) -> ThreadedServer:
        self.thread = threading.Thread(target=self._thread, daemon=True)
        self.thread.start()
        assert self.ready.wait(STEP_TIMEOUT)
        return self

    def _thread(self) -> None:
        async def serve() -> None:
            async with ScriptedServer(self.script) as server:
                self.port = server.port
                self.ready.set()
                await asyncio.wait_for(server.done.wait(), TEST_TIMEOUT)
        try:
            asyncio.run(serve())
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            self.error = error
            self.ready.set()

    def __exit__(self, *exc) -> None:
        self.thread.join(TEST_TIMEOUT)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def smqp(server: ThreadedServer, *argv: str) -> int:
    return cli.main(["--port", str(server.port), "--user", "guest", "--password", "", *argv])


def test_cli_topics_tree_count_and_get(capsys):
    script = steps(LOGIN, [
        (b"LIST TOPIC /\r\n\r\n", b"200-OK\r\n200-/stocks\r\n200 /news > /info/news/cnn\r\n\r\n"),
        (b"LIST TOPIC /stocks\r\n\r\n", b"200-OK\r\n200 /stocks/ibm\r\n\r\n"),
        (b"LIST TOPIC /stocks/ibm\r\n\r\n", OK),
    ], QUIT)
    with ThreadedServer(script) as server:
        assert smqp(server, "topics", "-r") == 0
    assert capsys.readouterr().out == "/stocks\n  /stocks/ibm\n/news > /info/news/cnn\n"

    with ThreadedServer(steps(LOGIN, [(b"COUNT MESSAGE /s\r\n\r\n", b"200-OK\r\n200 45\r\n\r\n")], QUIT)) as server:
        assert smqp(server, "count", "message", "/s") == 0
    assert capsys.readouterr().out == "45\n"

    get = steps(LOGIN, [(b"GET MESSAGE /stocks/quotes/ibm 1845-1890,1905\r\n\r\n", GET_REPLY)], QUIT)
    with ThreadedServer(get) as server:
        assert smqp(server, "get", "/stocks/quotes/ibm", "1845-1890,1905") == 0
    out = capsys.readouterr().out
    assert out.startswith("Topic: /stocks/quotes/ibm\nCreated: D20010815T08032445Z\nSmuid: host/1845\n"
                          "Cmuid: ann/ann01/A1845\nPriority: 1\n\nContent-Type: text/plain\nContent-Length: 6\n\n"
                          "34.456\n.\n\nTopic: /stocks/quotes/ibm\n")
    assert f"[{len(DOTS)} bytes of application/octet-stream]" in out


def test_cli_admin_commands(capsys):
    script = steps(LOGIN, [
        (b"CREATE TOPIC /stocks/ibm (IBM,BIG BLUE) > /stocks/quotes/ibm\r\n\r\n", OK),
    ], QUIT)
    with ThreadedServer(script) as server:
        assert smqp(server, "create", "/stocks/ibm", "-k", "IBM", "-k", "BIG BLUE", "--target",
                    "/stocks/quotes/ibm") == 0
    cases = [
        (["remove", "/t"], b"REMOVE TOPIC /t\r\n\r\n", b"200-OK\r\n200 12 messages pending\r\n\r\n",
         "12 messages pending\n"),
        (["rename", "/t", "/u"], b"SET TOPIC NAME /t /u\r\n\r\n", OK, ""),
        (["keywords", "set", "/t", "IBM", "BIG BLUE"], b"SET TOPIC KEYWORD /t (IBM,BIG BLUE)\r\n\r\n", OK, ""),
        (["keywords", "get", "/t"], b"GET TOPIC KEYWORDS /t\r\n\r\n", b"200-OK\r\n200 IBM,BIG BLUE\r\n\r\n",
         "IBM\nBIG BLUE\n"),
        (["find", "/stocks/*", "BLUE"], b"FIND TOPIC /stocks/* BLUE\r\n\r\n",
         b"200-OK\r\n200-/stocks/ibm (IBM,BIG BLUE)\r\n200 /stocks/x\r\n\r\n",
         "/stocks/ibm (IBM,BIG BLUE)\n/stocks/x\n"),
        (["list-subs"], b"LIST SUBSCRIPTIONS\r\n\r\n", b"200-OK\r\n200 /a/*\r\n\r\n", "/a/*\n"),
        (["set-login", "address", "1", "Main", "St"], b"SET LOGIN ADDRESS 1 Main St\r\n\r\n", OK, ""),
        (["unsub", "--all"], b"UNSUB *\r\n\r\n", b"200-OK\r\n200-MESSAGE /a\r\n200 SUB /b\r\n\r\n",
         "MESSAGE /a\nSUBSCRIBERS /b\n"),
        (["unsub", "/a/*", "--resource", "topic"], b"UNSUB TOPIC /a/*\r\n\r\n", b"200-OK\r\n200 TOPIC /a/x\r\n\r\n",
         "TOPIC /a/x\n"),
        (["pub", "/t", "hi", "--header", "Priority: 5", "--cmuid", "P1"],
         b"PUB MESSAGE /t P1\r\nPriority: 5\r\n\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi\r\n"
         b".\r\n\r\n", b"200-OK\r\n200 P1 7\r\n\r\n", "7\n"),
        (["count", "sub", "/t"], b"COUNT SUBSCRIBERS /t\r\n\r\n", b"200-OK\r\n200 3\r\n\r\n", "3\n"),
        (["reply", "/t", "ann/g/A1", "thanks", "--cmuid", "R1"],
         b"PUB REPLY /t R1\r\nCmuid: ann/g/A1\r\n\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nthanks\r\n"
         b".\r\n\r\n", b"200-OK\r\n200 R1 99\r\n\r\n", "99\n"),
    ]
    capsys.readouterr()
    for argv, command, answer, printed in cases:
        with ThreadedServer(steps(LOGIN, [(command, answer)], QUIT)) as server:
            assert smqp(server, *argv) == 0, argv
        assert capsys.readouterr().out == printed, argv


def test_cli_login_prints_the_login_attributes(capsys):
    with ThreadedServer(steps(LOGIN, QUIT)) as server:
        assert smqp(server, "login") == 0
    assert capsys.readouterr().out == ("SMQP/1.0 Ready. Scripted SMQP Server\nTopic: /accounts/guest\n"
                                       "Timeout: 00:24:00:00\nTime: D20010823T14451246Z\nGuid: guest0456\n")


def test_cli_sub_prints_and_acks_until_count(capsys):
    script = steps(LOGIN, [
        (b"SUB MESSAGE /stocks/* SINCE D20010915T080000Z\r\n\r\n",
         b"200-OK\r\n200-/stocks/ibm\r\n200 /stocks/msft\r\n\r\n"
         b"NOTIFY TOPIC /stocks/x\r\nAction: ADDED\r\n\r\n" + NOTIFY_MESSAGE),
        (cp.ACK, b"310 ACK\r\n\r\n"),
    ], QUIT)
    with ThreadedServer(script) as server:
        assert smqp(server, "sub", "/stocks/*", "--since", "D20010915T080000Z", "--count", "2") == 0
    captured = capsys.readouterr()
    assert captured.out == "TOPIC /stocks/x ADDED\n/stocks/quotes/ibm 1835 34.456\n"
    assert "subscribed /stocks/msft" in captured.err


def test_cli_passwd_prompts(monkeypatch, capsys):
    answers = iter(["0ld", "n3w", "n3w"])
    monkeypatch.setattr(cli.getpass, "getpass", lambda prompt="": next(answers))
    script = steps([(b"LOGIN guest CLEAR/1.0\r\n\r\n", OK), (b"PASS guest 0ld\r\n\r\n", LOGIN[1][1])],
                   [(b"SET LOGIN PASSWORD CLEAR/1.0\r\n", b"200-OK\r\n200 + old password\r\n\r\n"),
                    (b"0ld\r\n", b"+ new password\r\n\r\n"), (b"n3w\r\n", OK)],
                   QUIT)
    with ThreadedServer(script) as server:
        assert cli.main(["--port", str(server.port), "--user", "guest", "passwd"]) == 0
    answers = iter(["n3w", "typo"])
    monkeypatch.setattr(cli.getpass, "getpass", lambda prompt="": next(answers))
    assert cli.main(["--port", "1", "--password", "old", "passwd"]) == 2  # before connecting
    assert "do not match" in capsys.readouterr().err


def test_cli_exit_codes(capsys):
    with ThreadedServer(steps(LOGIN, [(b"COUNT TOPIC /x\r\n\r\n", b"404 Not found\r\n\r\n")])) as server:
        assert smqp(server, "count", "topic", "/x") == 1
    assert "404" in capsys.readouterr().err
    with ThreadedServer(steps([(b"LOGIN guest CLEAR/1.0\r\n\r\n", b"what\r\n")])) as server:
        assert smqp(server, "count", "topic", "/x") == 3
    assert "does not speak SMQP" in capsys.readouterr().err
    with ThreadedServer(steps(LOGIN)) as server:
        assert smqp(server, "get", "/t", "12-") == 2  # a bad selector is refused before sending
    assert "bad message selector" in capsys.readouterr().err
    assert cli.main(["--port", "1", "pub", "/a/b", "hi"]) == 2
    assert "cannot reach" in capsys.readouterr().err


SUBCOMMANDS = ["pub", "reply", "sub", "unsub", "topics", "create", "remove", "rename", "keywords", "find",
               "count", "get", "list-subs", "set-login", "passwd", "login"]


@pytest.mark.parametrize("argv", [[name] for name in SUBCOMMANDS] + [["keywords", "get"], ["keywords", "set"]])
def test_cli_every_subcommand_has_help(argv, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: smqp " + " ".join(argv))


def test_a_retried_notify_is_handed_over_once_so_it_gets_one_310_ack():
    """The server sends a NOTIFY again when its 310 ACK is late (retry timeout); the ACK carries
    no SMUID, so acknowledging both copies would acknowledge the next message too."""
    other = NOTIFY_MESSAGE.replace(b"www.host.com/1835", b"www.host.com/1836")

    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        await conn.expect(b"NOOP\r\n\r\n")
        await conn.send(OK + NOTIFY_MESSAGE + NOTIFY_MESSAGE)  # the second: the server's retry
        await conn.steps([(cp.ACK, b"310 ACK\r\n\r\n" + other), (cp.ACK, b"310 ACK\r\n\r\n"), *QUIT])

    async def body() -> None:
        async with ScriptedServer(script) as server:
            async with await logged_in(server) as client:
                await client.noop()
                got = []
                for _ in range(2):
                    note = await client.next_notification(STEP_TIMEOUT)
                    await note.ack()
                    got.append(note.smuid)
                assert got == [1835, 1836]
                await client.quit()
    run(body)


def notify_of(smuid: int) -> bytes:
    return NOTIFY_MESSAGE.replace(b"www.host.com/1835", f"www.host.com/{smuid}".encode())


def test_in_a_notify_window_acks_name_their_message_and_overlap():
    """After SET NOTIFY WINDOW 3 the server sends three NOTIFYs at once; each ack() sends
    310 ACK <smuid>, all three are outstanding together, and a retry of one still awaiting its
    ACK exchange is handed over once."""
    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        await conn.expect(b"SET NOTIFY WINDOW 3\r\n\r\n")
        await conn.send(OK + notify_of(1) + notify_of(2) + notify_of(1) + notify_of(3))  # 1 twice: a retry
        await conn.expect(b"310 ACK www.host.com/3\r\n\r\n310 ACK www.host.com/1\r\n\r\n310 ACK www.host.com/2\r\n\r\n")
        await conn.send(b"310 ACK www.host.com/3\r\n\r\n310 ACK www.host.com/1\r\n\r\n310 ACK www.host.com/2\r\n\r\n")
        await conn.steps(QUIT)

    async def body() -> None:
        async with ScriptedServer(script) as server:
            async with await logged_in(server) as client:
                await client.set_notify_window(3)
                notes = [await client.next_notification(STEP_TIMEOUT) for _ in range(3)]
                assert [note.smuid for note in notes] == [1, 2, 3]
                acks = [asyncio.ensure_future(notes[i].ack()) for i in (2, 0, 1)]
                await asyncio.wait_for(asyncio.gather(*acks), STEP_TIMEOUT)
                await client.quit()
    run(body)


def test_a_310_reply_naming_another_message_is_a_protocol_error():
    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        await conn.expect(b"SET NOTIFY WINDOW 2\r\n\r\n")
        await conn.send(OK + notify_of(1))
        await conn.expect(b"310 ACK www.host.com/1\r\n\r\n")
        await conn.send(b"310 ACK www.host.com/7\r\n\r\n")

    async def body() -> None:
        async with ScriptedServer(script) as server:
            async with await logged_in(server) as client:
                await client.set_notify_window(2)
                note = await client.next_notification(STEP_TIMEOUT)
                with pytest.raises(cp.ServerProtocolError, match="www.host.com/1"):
                    await note.ack()
    run(body)


def test_acknowledge_sends_a_windows_acks_without_waiting_and_each_settles_on_its_own_reply():
    """acknowledge() returns at once: the server reads all three ACKs before it answers any, and
    each future settles on its own reply: a matching 310 ACK, one naming another message (a
    protocol error) and a refusal (SMQPError)."""
    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        await conn.expect(b"SET NOTIFY WINDOW 3\r\n\r\n")
        await conn.send(OK + notify_of(1) + notify_of(2) + notify_of(3))
        await conn.expect(b"310 ACK www.host.com/1\r\n\r\n310 ACK www.host.com/2\r\n\r\n310 ACK www.host.com/3\r\n\r\n")
        await conn.send(b"310 ACK www.host.com/1\r\n\r\n")
        await conn.expect(b"NOOP\r\n\r\n")
        await conn.send(b"310 ACK www.host.com/9\r\n\r\n" + b"503 Kafka unavailable\r\n\r\n" + OK)
        await conn.steps(QUIT)

    async def body() -> None:
        async with ScriptedServer(script) as server:
            async with await logged_in(server) as client:
                await client.set_notify_window(3)
                notes = [await client.next_notification(STEP_TIMEOUT) for _ in range(3)]
                first, second, third = [note.acknowledge() for note in notes]
                await asyncio.wait_for(first, STEP_TIMEOUT)
                assert not second.done() and not third.done()
                await client.noop()  # answered after the two ACKs before it
                with pytest.raises(cp.ServerProtocolError, match="www.host.com/2"):
                    await second
                with pytest.raises(SMQPError) as refused:
                    await third
                assert refused.value.code == 503
                assert notes[0].acknowledge().done()  # twice: nothing more is sent
                await client.quit()
    run(body)


def test_a_cancelled_acknowledgement_still_takes_its_own_reply_and_one_cut_off_fails():
    """Replies are matched to requests in order: the reply of an ACK whose waiter gave up is
    still that ACK's, so the next ones settle on their own; an ACK whose reply never comes,
    the connection closing, fails with ConnectionError."""
    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        await conn.expect(b"SET NOTIFY WINDOW 3\r\n\r\n")
        await conn.send(OK + notify_of(1) + notify_of(2) + notify_of(3))
        await conn.expect(b"310 ACK www.host.com/1\r\n\r\n310 ACK www.host.com/2\r\n\r\n"
                          b"310 ACK www.host.com/3\r\n\r\n")
        await conn.send(b"310 ACK www.host.com/1\r\n\r\n310 ACK www.host.com/2\r\n\r\n")
        conn.writer.close()

    async def body() -> None:
        async with ScriptedServer(script) as server:
            client = await logged_in(server)
            await client.set_notify_window(3)
            notes = [await client.next_notification(STEP_TIMEOUT) for _ in range(3)]
            first, second, third = [note.acknowledge() for note in notes]
            first.cancel()
            await asyncio.wait_for(second, STEP_TIMEOUT)  # not taken for the first's reply
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(third, STEP_TIMEOUT)
            assert first.cancelled()
            await client.close()
    run(body)


def test_acknowledge_during_a_multi_step_exchange_goes_out_after_it():
    async def script(conn: Conn) -> None:
        await conn.steps(LOGIN)
        await conn.expect(b"NOOP\r\n\r\n")
        await conn.send(OK + NOTIFY_MESSAGE)
        await conn.steps([*PASSWORD_EXCHANGE, (cp.ACK, b"310 ACK\r\n\r\n"), *QUIT])

    async def body() -> None:
        async with ScriptedServer(script) as server:
            async with await logged_in(server) as client:
                await client.noop()
                note = await client.next_notification(STEP_TIMEOUT)
                change = asyncio.create_task(client.change_password("old pw", "n3w"))
                await asyncio.sleep(0)  # the exchange has the connection
                acked = note.acknowledge()
                await asyncio.wait_for(asyncio.gather(change, acked), STEP_TIMEOUT)
                await client.quit()
    run(body)


def test_cli_sub_window_sets_the_window_and_acknowledges_by_smuid(capsys):
    script = steps(LOGIN, [
        (b"SET NOTIFY WINDOW 5\r\n\r\n", OK),
        (b"SUB MESSAGE /stocks/*\r\n\r\n", b"200-OK\r\n200 /stocks/ibm\r\n\r\n" + notify_of(1) + notify_of(2)),
        (b"310 ACK www.host.com/1\r\n\r\n", b"310 ACK www.host.com/1\r\n\r\n"),
        (b"310 ACK www.host.com/2\r\n\r\n", b"310 ACK www.host.com/2\r\n\r\n"),
    ], QUIT)
    with ThreadedServer(script) as server:
        assert smqp(server, "sub", "/stocks/*", "--window", "5", "--count", "2") == 0
    assert capsys.readouterr().out == "/stocks/quotes/ibm 1 34.456\n/stocks/quotes/ibm 2 34.456\n"
