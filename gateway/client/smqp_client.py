"""The reference SMQP client: an asyncio library over the sans-I/O client reader.

    async with await SMQPClient.open("127.0.0.1", 7720, "guest") as client:
        await client.subscribe("/stocks/*")
        smuid = await client.publish("/stocks/quotes/ibm", b"24.567")
        note = await client.next_notification()
        await note.ack()          # the two-phase 310 ACK

Every command of spec section 4 has a typed method (``count_messages``,
``list_topics``, ``create_topic``, ``get_messages``, ``change_password``,
``notify_port``, ``publish_reply``, ``subscribe_topic``, ``unsubscribe_all``,
…); a refusal (4xx/5xx) raises :class:`SMQPError`.  Replies are matched to
commands in order, so several commands may be in flight at once
(pipelining); the one multi-step exchange, SET LOGIN PASSWORD, holds the
connection until it is done.

Notifications of every kind (MESSAGE, TOPIC, SUBSCRIBERS, SERVER) arrive
through one queue, :meth:`SMQPClient.next_notification`, whichever
connection they came on: after :meth:`SMQPClient.notify_port` the server
connects to a listener of ours and sends them there, and
:meth:`Notification.ack` answers on the connection the NOTIFY came from.
Only NOTIFY MESSAGE takes the two-phase ``310 ACK``; ``ack()`` on the others
does nothing.

:meth:`SMQPClient.set_notify_window` (SET NOTIFY WINDOW, the server's
pipelining extension) lets up to n NOTIFY MESSAGEs await their ACK at once;
then ``ack()`` names the message (``310 ACK <smuid>``), checks that the
server's ``310 ACK <smuid>`` names the same one, and several ``ack()`` calls
may be outstanding together; :meth:`Notification.acknowledge` sends one without
waiting and returns a future its reply settles (a consumer working through a
window acknowledges as it goes, like pika's ``basic_ack``, and still learns of
a refusal).  Commands written in one tick of the event loop leave in one send.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import secrets
import ssl as ssl_module
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gateway import scram
from gateway.client import wire as cp
from gateway.client.channel import CLOSED, Channel, Exchange, open_connection, start_server
from gateway.client.messages import (
    LOGIN_ATTRIBUTES,
    Message,
    Notification,
    RESOURCE_WORDS,
    SMQPError,
    SMQPRedirect,
    checked,
)
from schemas.events import Headers, Section


def _unsub_entry(line: str, default: str) -> tuple[str, str]:
    """``MESSAGE /a`` → (MESSAGE, /a); ``SUB /a`` → (SUBSCRIBERS, /a); ``/a`` → (default, /a)."""
    word, _, rest = line.strip().partition(" ")
    if word.upper() in RESOURCE_WORDS and rest:
        return RESOURCE_WORDS[word.upper()], rest.strip()
    return default, line.strip()


@dataclass
class _Farm:
    """The gateways a client may move to on BYE, and how it logs in (:meth:`SMQPClient.open`)."""

    addresses: list[tuple[str, int]]
    account: str
    password: str = field(repr=False)
    method: str
    ssl: ssl_module.SSLContext | None
    timeout: float
    max_redirects: int
    current: int = 0  # the index of the gateway connected to

    def after_current(self) -> list[int]:
        """The other gateways' indexes, the next one first, round the list."""
        count = len(self.addresses)
        return [(self.current + step) % count for step in range(1, count)]


class SMQPClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._notifications: asyncio.Queue = asyncio.Queue()
        self.greeting: str = ""
        self.login_attributes: dict[str, str] = {}  # Topic, Timeout, Time, Guid of the last login
        self.account: str | None = None  # logged in as
        self._greeted = asyncio.get_running_loop().create_future()
        self._cmuids = itertools.count(1)
        self._listener: asyncio.Server | None = None
        self._notify_channels: set[Channel] = set()
        self.notify_window = 1  # SET NOTIFY WINDOW: NOTIFY MESSAGEs that may await our ACK at once
        self._main = Channel(self, reader, writer, main=True)
        self.closed = self._main.closed
        self._farm: _Farm | None = None  # where to go when the gateway says BYE (``open(farm=…)``)
        self._moving: asyncio.Task | None = None
        self._retired: set[Channel] = set()  # connections to gateways we moved away from, until they close

    # -- connecting

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 10.0, *,
                      ssl: ssl_module.SSLContext | None = None) -> SMQPClient:
        """Open a connection (SMQPS when ``ssl`` is given) and wait for the server's identification line."""
        reader, writer = await asyncio.wait_for(open_connection(host, port, ssl), timeout)
        client = cls(reader, writer)
        try:
            client.greeting = await asyncio.wait_for(client._greeted, timeout)
        except BaseException:
            await client.close()
            raise
        return client

    @classmethod
    async def open(cls, host: str, port: int, account: str = "guest", password: str = "", *,
                   timeout: float = 10.0, max_redirects: int = 5,
                   ssl: ssl_module.SSLContext | None = None, method: str = "CLEAR",
                   farm: Sequence[tuple[str, int]] = ()) -> SMQPClient:
        """Connect and log in (``method`` as for :meth:`login`), following up to
        ``max_redirects`` 311 redirects (4.1.1).

        ``farm``: the addresses of the other gateways of the farm.  When the gateway says NOTIFY
        SERVER BYE (a planned shutdown: it still serves us for its timeout), the client logs in
        at the next of them that answers and carries on there (:meth:`_move_on`); the BYE itself
        is still handed over by :meth:`next_notification`.  Subscriptions belong to the account,
        so they follow; what the session set (a notify window, SET NOTIFY SUSPEND or PORT) is set
        again only for the window.  Without ``farm`` a BYE is followed by the close, as before."""
        client = await cls._open(host, port, account, password, timeout, max_redirects, ssl, method)
        if farm:
            addresses = [(host, port)] + [tuple(a) for a in farm if tuple(a) != (host, port)]
            client._farm = _Farm(addresses, account, password, method, ssl, timeout, max_redirects)
        return client

    @classmethod
    async def _open(cls, host: str, port: int, account: str, password: str, timeout: float, max_redirects: int,
                    ssl: ssl_module.SSLContext | None, method: str) -> SMQPClient:
        for _ in range(max_redirects + 1):
            client = await cls.connect(host, port, timeout, ssl=ssl)
            try:
                await asyncio.wait_for(client.login(account, password, method=method), timeout)
                return client
            except SMQPRedirect as redirect:
                host, port = redirect.host, redirect.port
                await client.close()
            except BaseException:
                await client.close()
                raise
        raise SMQPError(311, ["too many redirects", f"{host}:{port}"])

    @property
    def address(self) -> tuple[str, int]:
        """The server (host, port) this client is connected to (after any 311 redirects)."""
        return tuple(self._main.writer.get_extra_info("peername")[:2])

    async def __aenter__(self) -> SMQPClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- channel callbacks

    def _greeting(self, text: str) -> None:
        if not self._greeted.done():
            self._greeted.set_result(text)

    def _notified(self, note: Notification) -> None:
        if note._channel in self._retired:
            return  # the gateway we left: the one we moved to notifies what is still pending
        self._notifications.put_nowait(note)
        if (self._farm is not None and note._channel is self._main and note.resource == "SERVER"
                and note.action == "BYE" and (self._moving is None or self._moving.done())):
            self._moving = asyncio.create_task(self._move_on())

    def _channel_closed(self, channel: Channel) -> None:
        self._retired.discard(channel)
        if channel is self._main and self._moving is not None and not self._moving.done():
            return  # the gateway that said BYE closed before we moved: _move_on reports how it went
        if channel is self._main:
            if not self._greeted.done():
                self._greeted.set_exception(channel.error or ConnectionError("connection closed before greeting"))
                self._greeted.exception()  # retrieved: connect() reports it
            self._notifications.put_nowait(CLOSED)
        else:
            self._notify_channels.discard(channel)

    def _accept_notify(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._notify_channels.add(Channel(self, reader, writer, main=False))

    async def _move_on(self) -> None:
        """Log in at the next gateway of the farm that answers, then send every later command
        there; the gateway left keeps the connection until it closes it (an ACK of a NOTIFY it
        sent still goes there), but nothing more it notifies is handed over.  If none answers,
        the client ends as after any close."""
        farm, leaving = self._farm, self._main
        for index in farm.after_current():
            host, port = farm.addresses[index]
            try:
                fresh = await self._open(host, port, farm.account, farm.password, farm.timeout,
                                         farm.max_redirects, farm.ssl, farm.method)
            except (OSError, asyncio.TimeoutError, SMQPError, cp.ServerProtocolError):
                continue
            farm.current = index
            self._adopt(fresh)
            self._retired.add(leaving)
            if leaving.closed.is_set():
                self._retired.discard(leaving)
            if self.notify_window > 1:
                with contextlib.suppress(SMQPError, ConnectionError):
                    await self.set_notify_window(self.notify_window)
            return
        self._moving = None  # nowhere to go: the close of the gateway we are on ends the client
        if leaving.closed.is_set():
            self._channel_closed(leaving)

    def _adopt(self, fresh: SMQPClient) -> None:
        """Make ``fresh``'s logged-in connection this client's own, with what it was notified."""
        channel = fresh._main
        channel.client = self
        self._main, self.closed = channel, channel.closed
        self.greeting, self.login_attributes, self.account = fresh.greeting, fresh.login_attributes, fresh.account
        while not fresh._notifications.empty():
            note = fresh._notifications.get_nowait()
            if note is not CLOSED:
                note._client = self
                self._notifications.put_nowait(note)

    # -- requests

    async def _request(self, channel: Channel, data: bytes, *, messages: bool = False
                       ) -> cp.ReplyFrame | cp.Continuation:
        async with channel.lock:
            waiter = channel.submit(data, messages=messages)
            await channel.writer.drain()
        return checked(await waiter)

    async def command_raw(self, data: bytes, *, messages: bool = False) -> cp.ReplyFrame:
        """Send prepared bytes and wait for the matching reply; raise SMQPError on 4xx/5xx."""
        reply = await self._request(self._main, data, messages=messages)
        if not isinstance(reply, cp.ReplyFrame):
            raise cp.ServerProtocolError(f"unexpected continuation {reply.text!r}")
        return reply

    async def command(self, *words: str) -> cp.ReplyFrame:
        return await self.command_raw(cp.render_command(*words))

    async def _lines(self, *words: str) -> list[str]:
        return cp.payload(await self.command(*words))

    # -- LOGIN, NOOP, QUIT

    async def login(self, account: str, password: str = "", *, method: str = "CLEAR") -> dict[str, str]:
        """LOGIN with CLEAR + PASS, or with ``method="SCRAM-SHA-256"`` (the password never
        leaves this process); returns the attributes of the 200 reply (Topic, Guid, …).
        Raises :class:`SMQPRedirect` on 311.  PASS sends the password as one word: no spaces."""
        if method.upper() == scram.METHOD:
            return await self._scram_login(account, password)
        if any(c.isspace() for c in password):
            raise ValueError("a password sent with PASS cannot contain spaces")
        reply = await self.command("LOGIN", account, "CLEAR/1.0")
        if reply.code == 311:
            raise SMQPRedirect(reply.code, reply.lines)
        reply = await self.command(*(["PASS", account, password] if password else ["PASS", account]))
        self.login_attributes = dict(line.split(": ", 1) for line in reply.lines if ": " in line)
        self.account = account
        return self.login_attributes

    async def _scram_login(self, account: str, password: str) -> dict[str, str]:
        """SCRAM-SHA-256 over ``+`` continuations; the server's ``Verifier:`` is checked."""
        client = scram.ScramClient(account, password, secrets.token_urlsafe(18))
        encode = lambda text: cp.render_line(base64.b64encode(text.encode()).decode())  # noqa: E731
        channel = self._main
        async with channel.lock:
            async def step(data: bytes):
                waiter = channel.submit(data)
                await channel.writer.drain()
                return checked(await waiter)
            try:
                reply = await step(cp.render_command("LOGIN", account, f"{scram.METHOD}/1.0"))
                if reply.code == 311:
                    raise SMQPRedirect(reply.code, reply.lines)
                server_first = await step(encode(client.first()))
                if not isinstance(server_first, cp.Continuation):
                    raise cp.ServerProtocolError(f"SCRAM: expected '+ server-first', got {server_first!r}")
                final = client.final(base64.b64decode(server_first.text).decode())
                reply = await step(encode(final))
            except (SMQPError, cp.ServerProtocolError, scram.ScramError):
                raise
            except BaseException:
                channel.writer.transport.abort()  # half way through: the server would misread what follows
                raise
        attributes = dict(line.split(": ", 1) for line in reply.lines if ": " in line)
        if not client.verify(base64.b64decode(attributes.get("Verifier", "")).decode()):
            await self.close()
            raise scram.ScramError("the server did not prove it knows the password")
        self.login_attributes, self.account = attributes, account
        return attributes

    async def noop(self) -> None:
        await self.command("NOOP")

    async def quit(self) -> None:
        await self.command("QUIT")
        await self.close()

    # -- COUNT, LIST, FIND, GET

    async def count_topics(self, topic: str) -> int:
        return cp.leading_int((await self.command("COUNT", "TOPIC", topic)).lines[-1])

    async def count_messages(self, topic: str) -> int:
        return cp.leading_int((await self.command("COUNT", "MESSAGE", topic)).lines[-1])

    async def count_subscribers(self, topic: str) -> int:
        return cp.leading_int((await self.command("COUNT", "SUBSCRIBERS", topic)).lines[-1])

    async def list_topics(self, topic: str = "/") -> list[tuple[str, str | None]]:
        """Child topics as (path, target); target is set for a virtual topic."""
        return [cp.parse_topic_entry(line) for line in await self._lines("LIST", "TOPIC", topic)]

    async def list_messages(self, topic: str) -> list[int]:
        """The SMUIDs in ``topic``, ranges expanded."""
        return cp.parse_ranges(",".join(await self._lines("LIST", "MESSAGE", topic)))

    async def list_subscriptions(self) -> list[str]:
        return await self._lines("LIST", "SUBSCRIPTIONS")

    async def find_topics(self, pattern: str, keywords: Iterable[str] = ()) -> list[tuple[str, list[str]]]:
        """Topics matching ``pattern`` (``/a`` or ``/a/*``) and any of ``keywords``, with their keywords."""
        keywords = list(keywords)
        words = ["FIND", "TOPIC", pattern]
        if keywords:
            words.append(cp.format_keywords(keywords)[1:-1])
        return [cp.parse_found_topic(line) for line in await self._lines(*words)]

    async def get_keywords(self, topic: str) -> list[str]:
        return cp.parse_keywords(",".join(await self._lines("GET", "TOPIC", "KEYWORDS", topic)))

    async def get_messages(self, topic: str, selector: int | str | range | Iterable[int | range] = "*"
                           ) -> list[Message]:
        """GET MESSAGE by SMUID, ranges (``"1845-1890,1905"``, ``range``, a list) or ``"*"``.
        No match is a 404 :class:`SMQPError`."""
        data = cp.render_command("GET", "MESSAGE", topic, cp.format_ranges(selector))
        reply = await self.command_raw(data, messages=True)
        return [Message(m.headers, m.sections) for m in reply.messages]

    # -- CREATE, REMOVE, SET TOPIC

    async def create_topic(self, topic: str, keywords: Iterable[str] = (), target: str | None = None) -> None:
        """CREATE TOPIC, with keywords and, for a virtual topic, the topic it maps to."""
        keywords = list(keywords)
        words = ["CREATE", "TOPIC", topic]
        if keywords:
            words.append(cp.format_keywords(keywords))
        if target is not None:
            words += [">", target]
        await self.command(*words)

    async def remove_topic(self, topic: str) -> int:
        """REMOVE TOPIC; returns how many messages are still pending delivery."""
        lines = await self._lines("REMOVE", "TOPIC", topic)
        return cp.leading_int(lines[-1]) if lines else 0

    async def rename_topic(self, topic: str, new_topic: str) -> None:
        await self.command("SET", "TOPIC", "NAME", topic, new_topic)

    async def set_keywords(self, topic: str, keywords: Iterable[str]) -> None:
        """SET TOPIC KEYWORD: replaces the topic's keywords (an empty list clears them)."""
        keywords = list(keywords)
        await self.command("SET", "TOPIC", "KEYWORD", topic, cp.format_keywords(keywords) if keywords else "()")

    # -- SET LOGIN

    async def set_login(self, attribute: str, value: str) -> None:
        """SET LOGIN NAME|EMAIL|ADDRESS|PHONE ``value`` (spaces allowed); passwords: change_password."""
        attribute = attribute.upper()
        if attribute not in LOGIN_ATTRIBUTES:
            raise ValueError(f"SET LOGIN {attribute}: expected one of {', '.join(LOGIN_ATTRIBUTES)}"
                             + (" (use change_password)" if attribute.startswith("PASS") else ""))
        if not value.strip():
            raise ValueError(f"SET LOGIN {attribute} needs a value")
        await self.command("SET", "LOGIN", attribute, value.strip())

    async def change_password(self, old: str, new: str, *, method: str = "CLEAR") -> None:
        """SET LOGIN PASSWORD (4.1.6.2.1).  CLEAR/1.0: ``+ old password`` → old, ``+ new password``
        → new.  ``method="SCRAM-SHA-256"``: a SCRAM exchange proves the old password, then the new
        one travels only as its SaltedPassword for a salt the server gives, masked with a key of
        that exchange (:mod:`gateway.scram`): neither password crosses the wire.

        Nothing else is sent on the connection meanwhile.  Should this be
        cancelled half way, the connection is dropped: the server would
        otherwise read the next command as a step of the exchange.
        """
        if method.upper() == scram.METHOD:
            return await self._scram_change_password(old, new)
        if method.upper() != "CLEAR":
            raise ValueError(f"SET LOGIN PASSWORD: method CLEAR or {scram.METHOD}, not {method!r}")
        if not new or any(c.isspace() for c in new):
            raise ValueError("the new password must be one word (LOGIN sends it with PASS)")
        lines = [cp.render_line(text) for text in ("SET LOGIN PASSWORD CLEAR/1.0", old, new)]  # checked first
        async with Exchange(self._main, "SET LOGIN PASSWORD") as exchange:
            prompt = await exchange.step(lines[0], cp.ReplyFrame)
            if not prompt.lines[-1].startswith("+"):
                raise cp.ServerProtocolError(f"SET LOGIN PASSWORD: no '+' prompt in {prompt.lines!r}")
            await exchange.step(lines[1], cp.Continuation)
            await exchange.step(lines[2], cp.ReplyFrame, last=True)

    async def _scram_change_password(self, old: str, new: str) -> None:
        if not new:
            raise ValueError("the new password must not be empty")
        client = scram.ScramClient(self.account or "", old, secrets.token_urlsafe(18))
        encode = lambda text: cp.render_line(base64.b64encode(text.encode()).decode())  # noqa: E731
        decode = lambda frame: base64.b64decode(frame.text).decode()  # noqa: E731
        async with Exchange(self._main, "SET LOGIN PASSWORD") as exchange:
            prompt = await exchange.step(cp.render_line(f"SET LOGIN PASSWORD {scram.METHOD}/1.0"), cp.ReplyFrame)
            if prompt.lines[-1].strip() != "+":
                raise cp.ServerProtocolError(f"SET LOGIN PASSWORD: no '+' prompt in {prompt.lines!r}")
            server_first = await exchange.step(encode(client.first()), cp.Continuation)
            final = await asyncio.to_thread(client.final, decode(server_first))
            offer = await exchange.step(encode(final), cp.Continuation)
            answer = await asyncio.to_thread(client.new_password, decode(offer), new)
            await exchange.step(encode(answer), cp.ReplyFrame, last=True)

    # -- SET NOTIFY

    async def suspend(self, topic: str | None = None) -> None:
        """SET NOTIFY SUSPEND: hold NOTIFY MESSAGE (for ``topic``, or all)."""
        await self.command("SET", "NOTIFY", "SUSPEND", *([topic] if topic else []))

    async def resume(self, topic: str | None = None) -> None:
        await self.command("SET", "NOTIFY", "RESUME", *([topic] if topic else []))

    async def set_notify_window(self, n: int) -> None:
        """SET NOTIFY WINDOW (the server's extension, not in the spec): up to ``n`` NOTIFY MESSAGEs
        may await their ACK at once, each :meth:`Notification.ack` naming its message.  1 is
        the spec's one-at-a-time two-phase commit."""
        if n < 1:
            raise ValueError(f"SET NOTIFY WINDOW takes n >= 1, not {n}")
        previous, self.notify_window = self.notify_window, n  # NOTIFYs may follow the reply at once
        try:
            await self.command("SET", "NOTIFY", "WINDOW", str(n))
        except BaseException:
            self.notify_window = previous
            raise

    async def notify_port(self, port: int = 0, host: str | None = None, *, listen_host: str | None = None,
                          ssl: ssl_module.SSLContext | None = None) -> int:
        """SET NOTIFY PORT: listen first (``port`` 0: any free port), then ask the server to connect.

        The listener binds ``listen_host``, else ``host``, else this
        connection's own local address.  Notifications arriving there come
        out of :meth:`next_notification` like the others; their ``ack()``
        answers there.  Returns the port listened on.

        On an SMQPS session the server connects with TLS, so the listener
        needs ``ssl``: a server-side context holding its certificate (one the
        gateway's ``notify_tls_ca`` trusts, for the address it connects to).
        """
        if ssl is None and self._main.writer.get_extra_info("ssl_object") is not None:
            raise ValueError("an SMQPS session's notify listener is TLS: pass ssl=<server-side SSLContext>")
        bind = listen_host or host or self._main.writer.get_extra_info("sockname")[0]
        before = set(self._notify_channels)
        listener = await start_server(self._accept_notify, bind, port, ssl)
        actual = listener.sockets[0].getsockname()[1]
        try:
            await self.command("SET", "NOTIFY", "PORT", str(actual), *([host] if host else []))
        except BaseException:
            listener.close()
            for channel in self._notify_channels - before:  # the server connected, then refused
                await channel.close()
            raise
        previous, self._listener = self._listener, listener
        if previous is not None:
            previous.close()
        return actual

    # -- PUBLISH

    async def publish(self, topic: str, data: bytes | str, *, content_type: str = "text/plain",
                      headers: Iterable[tuple[str, str]] = (), cmuid: str | None = None) -> int:
        """PUB MESSAGE with one data section; returns the server's SMUID once durable."""
        return await self._publish("MESSAGE", topic, data, content_type, list(headers), cmuid)

    async def publish_unguaranteed(self, topic: str, data: bytes | str, *, content_type: str = "text/plain",
                                   headers: Iterable[tuple[str, str]] = (), cmuid: str | None = None) -> None:
        """PUB MESSAGE with ``Guarantee: NO`` (2002 revision): written and forgotten — the server
        sends no reply, not even an error, and the message may be dropped under pressure."""
        headers = [("Guarantee", "NO"), *((n, v) for n, v in headers if n.lower() not in ("guarantee", "guar"))]
        frame = self._publish_frame("MESSAGE", topic, data, content_type, headers, cmuid)
        async with self._main.lock:
            if self._main.closed.is_set():
                raise self._main.error or ConnectionError("connection closed")
            self._main.write(frame)
            await self._main.writer.drain()

    async def publish_reply(self, topic: str, cmuid_replied_to: str, data: bytes | str, *,
                            content_type: str = "text/plain", headers: Iterable[tuple[str, str]] = (),
                            cmuid: str | None = None) -> int:
        """PUB REPLY (4.1.8.2): a message to the publisher of the one whose CMUID
        (``account/guid/uid``, its ``Cmuid`` attribute) is ``cmuid_replied_to``;
        ``topic`` is the topic that message came from.  Returns the SMUID."""
        headers = [("Cmuid", cmuid_replied_to), *((n, v) for n, v in headers if n.lower() != "cmuid")]
        return await self._publish("REPLY", topic, data, content_type, headers, cmuid)

    def _publish_frame(self, resource: str, topic: str, data: bytes | str, content_type: str,
                       headers: Headers, cmuid: str | None) -> bytes:
        """A PUB frame with one data section (a CMUID of our own when none is given)."""
        body = data.encode() if isinstance(data, str) else data
        section = Section([("Content-Type", content_type), ("Content-Length", str(len(body)))], body)
        return cp.render_publish(topic, cmuid or f"C{next(self._cmuids)}", headers, [section], resource)

    async def _publish(self, resource: str, topic: str, data: bytes | str, content_type: str,
                       headers: Headers, cmuid: str | None) -> int:
        reply = await self.command_raw(self._publish_frame(resource, topic, data, content_type, headers, cmuid))
        return int(reply.lines[-1].split()[-1])

    # -- SUBSCRIBE, UNSUBSCRIBE

    async def subscribe(self, pattern: str, since: datetime | str | None = None,
                        until: datetime | str | None = None) -> list[str]:
        """SUB MESSAGE; returns the topics subscribed (a wildcard's matching topics)."""
        words = ["SUB", "MESSAGE", pattern]
        if since is not None:
            words += ["SINCE", cp.format_date_time(since)]
        if until is not None:
            words += ["UNTIL", cp.format_date_time(until)]
        return await self._lines(*words)

    async def subscribe_topic(self, pattern: str) -> list[str]:
        """SUB TOPIC: NOTIFY TOPIC when topics matching ``pattern`` are added, renamed, removed, re-keyworded."""
        return await self._lines("SUB", "TOPIC", pattern)

    async def subscribe_subscribers(self, pattern: str) -> list[str]:
        """SUB SUBSCRIBER: NOTIFY SUBSCRIBERS when the subscriber count of ``pattern`` changes."""
        return await self._lines("SUB", "SUBSCRIBER", pattern)

    async def subscribe_server_timeout(self) -> None:
        """SUB SERVER TIMEOUT: NOTIFY SERVER TIMEOUT with the server's default message timeout."""
        await self.command("SUB", "SERVER", "TIMEOUT")

    async def unsubscribe(self, pattern: str) -> list[tuple[str, str]]:
        """UNSUB MESSAGE ``/a``, ``/a/*`` or ``*``; returns (resource, topic) of each subscription ended."""
        return [_unsub_entry(line, "MESSAGE") for line in await self._lines("UNSUB", "MESSAGE", pattern)]

    async def unsubscribe_topic(self, pattern: str) -> list[tuple[str, str]]:
        return [_unsub_entry(line, "TOPIC") for line in await self._lines("UNSUB", "TOPIC", pattern)]

    async def unsubscribe_subscribers(self, pattern: str) -> list[tuple[str, str]]:
        return [_unsub_entry(line, "SUBSCRIBERS") for line in await self._lines("UNSUB", "SUBSCRIBER", pattern)]

    async def unsubscribe_server_timeout(self) -> None:
        await self.command("UNSUB", "SERVER", "TIMEOUT")

    async def unsubscribe_all(self) -> list[tuple[str, str]]:
        """UNSUB *: every subscription of every resource."""
        return [_unsub_entry(line, "MESSAGE") for line in await self._lines("UNSUB", "*")]

    # -- notifications

    async def next_notification(self, timeout: float | None = None) -> Notification:
        """The next NOTIFY of any kind from any connection; ``TimeoutError`` after
        ``timeout`` seconds, ``ConnectionError`` once the connection has closed."""
        if self._notifications.empty():
            note = await asyncio.wait_for(self._notifications.get(), timeout)
        else:  # without wait_for's task and timer: a consumer behind its window finds one waiting
            note = self._notifications.get_nowait()
        if note is CLOSED:
            self._notifications.put_nowait(CLOSED)  # for the next caller too
            raise self._main.error or ConnectionError("connection closed")
        return note

    # -- closing

    async def close(self) -> None:
        if self._moving is not None and not self._moving.done():
            self._moving.cancel()
        for channel in list(self._retired):
            await channel.close()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for channel in list(self._notify_channels):
            await channel.close()
        if listener is not None:
            await listener.wait_closed()
        await self._main.close()
