"""What the client hands its user: the errors a refusal raises, and the messages and
notifications it reads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.client import wire as cp
from schemas.events import Headers, Section

if TYPE_CHECKING:  # annotations only: those modules import this one
    from gateway.client.channel import Channel
    from gateway.client.smqp_client import SMQPClient


#: SET LOGIN attributes other than PASSWORD (4.1.6.2).
LOGIN_ATTRIBUTES = ("NAME", "EMAIL", "ADDRESS", "PHONE")

#: Reply words of UNSUBSCRIBE → the resource names notifications use.
RESOURCE_WORDS = {"MESS": "MESSAGE", "MESSAGE": "MESSAGE", "TOPIC": "TOPIC", "SUB": "SUBSCRIBERS",
                  "SUBSCRIBER": "SUBSCRIBERS", "SUBSCRIBERS": "SUBSCRIBERS", "SERVER": "SERVER"}


class SMQPError(Exception):
    """A 4xx/5xx reply: ``code`` and the reply lines."""

    def __init__(self, code: int, lines: list[str]):
        super().__init__(f"{code} {' / '.join(lines)}")
        self.code = code
        self.lines = lines

    @property
    def reply_class(self) -> int:
        """4 for a 4xx refusal, 5 for a 5xx failure."""
        return self.code // 100


class SMQPRedirect(SMQPError):
    """``311 Redirect request`` to LOGIN (4.1.1): log in at ``host:port`` instead."""

    def __init__(self, code: int, lines: list[str]):
        super().__init__(code, lines)
        address = lines[-1].strip()
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise cp.ServerProtocolError(f"311 without an address: {lines!r}")
        self.host, self.port = host, int(port)


class _MessageFields:
    """Attribute accessors shared by notifications and GET MESSAGE results."""

    headers: Headers
    sections: list[Section]

    def header(self, name: str) -> str | None:
        """The first header attribute called ``name`` (case-insensitive): :meth:`_attributes`
        for one name, without its lists."""
        name = name.lower()
        for key, value in self.headers:
            if value is not None and key.lower() == name:
                return value
        return None

    def _attributes(self, *names: str) -> list[str | None]:
        """The first value of each of ``names`` (lower case), in one pass over the headers."""
        found: list[str | None] = [None] * len(names)
        for key, value in self.headers:
            key = key.lower()
            if key in names:
                index = names.index(key)
                if found[index] is None:
                    found[index] = value
        return found

    @property
    def smuid(self) -> int:
        """The number of ``Smuid: host/number``."""
        value = self.header("Smuid")
        if value is None:
            raise AttributeError("no Smuid attribute")
        return int(value.rsplit("/", 1)[-1])

    @property
    def cmuid(self) -> str | None:
        """``account/guid/uid`` of the publisher: what a reply names (:meth:`SMQPClient.publish_reply`)."""
        return self.header("Cmuid")

    @property
    def data(self) -> bytes:
        sections = self.sections
        if len(sections) == 1:  # the usual message: its one section's bytes, not a copy
            return sections[0].data
        return b"".join([section.data for section in sections])


@dataclass(eq=False)
class Message(_MessageFields):
    """A stored message from GET MESSAGE: header attributes (``Topic`` first) and data sections."""

    headers: Headers
    sections: list[Section] = field(default_factory=list)

    @property
    def topic(self) -> str | None:
        return self.header("Topic")


@dataclass(eq=False)
class Notification(_MessageFields):
    """A NOTIFY frame.

    ``resource`` is MESSAGE, TOPIC, SUBSCRIBERS or SERVER.  ``topic`` is the
    topic (for SERVER, the rest of the line: ``BYE``, ``TIMEOUT 00:05:00``).
    ``action``/``value`` read NOTIFY TOPIC's ``Action:`` attribute (and
    SERVER's event word and timeout), ``count`` NOTIFY SUBSCRIBERS' ``COUNT:``.
    """

    resource: str
    topic: str
    headers: Headers
    sections: list[Section] = field(default_factory=list)
    _client: SMQPClient | None = field(default=None, repr=False)
    _channel: Channel | None = field(default=None, repr=False)
    _acked: bool = field(default=False, repr=False)
    _ack_fields = None  # (guaranteed, Smuid value) once read; not a field: no __init__ argument

    @property
    def needs_ack(self) -> bool:
        """A NOTIFY MESSAGE awaiting its two-phase ACK (not one of a ``Guarantee: NO`` message)."""
        return self._ack_smuid()[0]

    def _ack_smuid(self) -> tuple[bool, str | None]:
        """(:attr:`needs_ack`, the ``Smuid`` value), from one pass over the headers.  That
        pass is made once, when the channel hands the notification over, not again for its
        ACK: the headers name the message as it arrived."""
        if self.resource != "MESSAGE" or self._acked:
            return False, None
        fields = self._ack_fields
        if fields is None:
            guarantee, guar, smuid = self._attributes("guarantee", "guar", "smuid")
            fields = self._ack_fields = ((guarantee or guar or "YES").upper() != "NO", smuid)
        return fields

    async def ack(self) -> None:
        """The client half of the two-phase commit, on the connection the NOTIFY came on;
        returns once the server's ``310 ACK`` arrived.  A no-op for other kinds, or twice.
        In a notify window (:meth:`SMQPClient.set_notify_window`) it names the message,
        ``310 ACK <smuid>``, so acknowledgements may be sent in any order and overlap."""
        await self.acknowledge()

    def acknowledge(self) -> asyncio.Future:
        """:meth:`ack` without waiting, for a consumer working through a notify window: the
        ``310 ACK`` is sent with this tick's other writes, and the returned future settles once
        the server's reply arrived (it fails as :meth:`ack` would).  Written at once, with no
        task of its own, unless a multi-step exchange holds the connection; then it follows it."""
        needs, smuid = self._ack_smuid()
        if not needs:
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        self._acked = True
        if self._channel.lock.locked():
            return asyncio.ensure_future(self._ack_after_exchange(smuid))
        return self._send_ack(smuid)

    async def _ack_after_exchange(self, smuid: str | None) -> None:
        try:
            async with self._channel.lock:
                outcome = self._send_ack(smuid)
        except BaseException:
            self._channel.unacknowledged.pop(smuid, None)
            raise
        await outcome

    def _send_ack(self, smuid: str | None) -> asyncio.Future:
        """Submit the ``310 ACK``; the future settles on its reply, which in a notify window must
        name the message.  Either way the message leaves the channel's unacknowledged ones."""
        channel, window = self._channel, self._client.notify_window

        def answered(outcome: asyncio.Future, reply: cp.Frame) -> None:
            channel.unacknowledged.pop(smuid, None)
            if outcome.done():  # cancelled by whoever awaited it
                return
            try:
                last = checked(reply).lines[-1]
                if window != 1 and last.split()[1:] != [smuid]:
                    raise cp.ServerProtocolError(f"310 ACK of {smuid} answered {last!r}")
            except BaseException as error:  # noqa: BLE001 - handed to whoever awaits the future
                outcome.set_exception(error)
            else:
                outcome.set_result(None)
        try:
            return channel.submit(cp.ACK if window == 1 else cp.render_ack(smuid), settle=answered)
        except BaseException:
            channel.unacknowledged.pop(smuid, None)
            raise

    async def reply(self, data: bytes | str, **options) -> int:
        """PUB REPLY to this message (see :meth:`SMQPClient.publish_reply`); returns the SMUID."""
        if self.resource != "MESSAGE" or not self.cmuid:
            raise ValueError("only a NOTIFY MESSAGE with a Cmuid can be replied to")
        return await self._client.publish_reply(self.header("Reply-Topic") or self.topic, self.cmuid, data,
                                                 **options)

    # -- NOTIFY TOPIC / SERVER

    def _event(self) -> tuple[str | None, str | None]:
        if self.resource == "TOPIC":
            text = self.header("Action") or ""
            word, _, rest = text.strip().partition(" ")
            word = word.upper()
            return cp.TOPIC_ACTIONS.get(word, word) or None, rest.strip() or None
        if self.resource == "SERVER":
            word, _, rest = self.topic.strip().partition(" ")
            return word.upper() or None, rest.strip() or None
        return None, None

    @property
    def action(self) -> str | None:
        """TOPIC: ADDED, RENAME, DELETED or KEYWORDS; SERVER: BYE or TIMEOUT."""
        return self._event()[0]

    @property
    def value(self) -> str | None:
        """What follows the action: the new name, the keywords, the timeout."""
        return self._event()[1]

    @property
    def new_name(self) -> str | None:
        return self.value if self.action == "RENAME" else None

    @property
    def keywords(self) -> list[str]:
        return cp.parse_keywords(self.value or "") if self.action == "KEYWORDS" else []

    @property
    def timeout(self) -> str | None:
        """NOTIFY SERVER TIMEOUT's timeout, or BYE's (``None``: right away)."""
        return self.value if self.resource == "SERVER" else None

    @property
    def count(self) -> int | None:
        """NOTIFY SUBSCRIBERS: the topic's subscriber count."""
        value = self.header("Count")
        return int(value) if value is not None and value.strip().isdigit() else None


def checked(frame: cp.ReplyFrame | cp.Continuation) -> cp.ReplyFrame | cp.Continuation:
    if isinstance(frame, cp.ReplyFrame) and frame.code >= 400:
        raise SMQPError(frame.code, frame.lines)
    return frame
