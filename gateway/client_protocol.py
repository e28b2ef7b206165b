"""The client side of SMQP, sans-I/O: server bytes in, frames out; commands → bytes.

:class:`ServerReader` turns what a server sends into frames:

* :class:`Greeting` — the identification line, always first (spec 4);
* :class:`ReplyFrame` — a reply, multi-line ones joined up to the
  ``<code> <text>`` line (Appendix A).  A reply the caller announced with
  ``expect_reply(messages=True)`` (GET MESSAGE) is read on past its
  ``200 OK`` line: messages, each header lines (``Topic:`` first), an empty
  line, data sections and a ``.`` line, until an empty line ends the reply;
  they land in :attr:`ReplyFrame.messages`;
* :class:`Continuation` — a ``+ text`` line: the server wants the next piece
  of a multi-step exchange (SET LOGIN PASSWORD, 4.1.6.2.1);
* :class:`NotifyFrame` — NOTIFY MESSAGE read by the server's own framing
  rule (:class:`gateway.protocol.MessageFramer`: data counted by
  Content-Length, ``.`` end), and the other NOTIFY kinds (TOPIC,
  SUBSCRIBERS, SERVER TIMEOUT/BYE) as attribute lines up to an empty line.

Empty lines between frames are skipped, so the empty line that ends each
server reply is consumed whether or not a server sends it (the spec's LOGIN
transcript omits it).  Bytes that fit no frame raise
:class:`ServerProtocolError`: a client cannot resynchronise with a server
it no longer understands.

Which reply is a GET MESSAGE reply cannot be told from the bytes alone
without waiting for the line after ``200 OK`` (which the LOGIN transcript
never sends), so the caller says so: one :meth:`ServerReader.expect_reply`
per request it sends (commands, PUB bodies, ACKs, exchange lines), in order.
A reader nobody tells anything reads every reply as plain lines.

The rest of the module renders commands and parses reply payloads (topic
listings, message-id ranges, keyword lists) so that :mod:`gateway.client`
stays a thin I/O layer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Union

from gateway.protocol import LineBuffer, MessageFramer, Need, parse_header, render_body, render_lines
from schemas.events import Headers, Section

ACK = b"310 ACK\r\n\r\n"

#: Abbreviated NOTIFY resources → their full names (4.1.11).
_RESOURCES = {"MESS": "MESSAGE", "SUB": "SUBSCRIBERS", "SUBSCRIBER": "SUBSCRIBERS", "SERV": "SERVER"}

#: Abbreviated NOTIFY TOPIC actions → their full names (4.1.11.2).
TOPIC_ACTIONS = {"ADD": "ADDED", "REN": "RENAME", "DEL": "DELETED", "KEY": "KEYWORDS"}


class ServerProtocolError(Exception):
    """The server sent bytes that fit no SMQP frame."""


@dataclass(frozen=True)
class Greeting:
    text: str


@dataclass(frozen=True)
class StoredMessage:
    """One message of a GET MESSAGE reply: its header lines (``Topic`` first) and data sections."""

    headers: Headers
    sections: list[Section] = field(default_factory=list)


@dataclass(frozen=True)
class ReplyFrame:
    code: int
    lines: list[str]
    messages: list[StoredMessage] = field(default_factory=list)  # GET MESSAGE replies only


@dataclass(frozen=True)
class Continuation:
    """``+ text``: the server awaits the next line of an exchange (``text`` is its prompt)."""

    text: str


@dataclass(frozen=True)
class NotifyFrame:
    resource: str  # MESSAGE, SERVER, TOPIC, SUBSCRIBERS, … (abbreviations expanded)
    topic: str  # the rest of the NOTIFY line: a topic, or e.g. "BYE 00:05:00"
    headers: Headers = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)


Frame = Union[Greeting, ReplyFrame, Continuation, NotifyFrame]


# --------------------------------------------------------------------------
# Rendering


def _check_words(words: Iterable[str]) -> list[str]:
    words = [str(word) for word in words]
    for word in words:
        if "\r" in word or "\n" in word:
            raise ValueError(f"line break inside a command argument: {word!r}")
    return words


def render_command(*words: str) -> bytes:
    """A command line, then the empty line the spec's clients send after it."""
    return (" ".join(_check_words(words)) + "\r\n\r\n").encode("utf-8")


def render_line(text: str) -> bytes:
    """One bare line, nothing after it: a step of an exchange, where an extra
    empty line would be read as the next step (an empty password)."""
    return (_check_words([text])[0] + "\r\n").encode("utf-8")


def render_publish(topic: str, cmuid: str, headers: Headers, sections: list[Section],
                   resource: str = "MESSAGE") -> bytes:
    """PUB MESSAGE (or PUB REPLY) with its body (Content-Length always set from the data)."""
    _check_words([topic, cmuid, *(f"{n}: {v}" for n, v in headers)])
    return render_lines([f"PUB {resource} {topic} {cmuid}"]) + render_body(headers, sections) + b"\r\n"


def format_keywords(keywords: Iterable[str]) -> str:
    """``("IBM", "BIG BLUE")`` → ``(IBM,BIG BLUE)`` (4.1.4, 4.1.6.1.2)."""
    keywords = [keyword.strip() for keyword in keywords]
    for keyword in keywords:
        if not keyword or any(c in keyword for c in ",()\r\n"):
            raise ValueError(f"bad keyword {keyword!r}: empty, or holds one of , ( ) or a line break")
    return "(" + ",".join(keywords) + ")"


def format_date_time(moment: datetime | str) -> str:
    """A SINCE/UNTIL argument: a datetime (naive means UTC) as ``DyyyymmddThhmmssffZ``;
    a string is passed through for the server to judge."""
    if isinstance(moment, str):
        return moment
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("D%Y%m%dT%H%M%S") + f"{moment.microsecond // 10000:02d}Z"


def format_ranges(selector: int | str | range | Iterable[int | range]) -> str:
    """A GET MESSAGE selector: ``1845``, ``"1845-1890,1905"``, ``"*"``, a range or
    SMUIDs (runs of consecutive ones are joined: ``[1, 2, 3, 7]`` → ``1-3,7``)."""
    if isinstance(selector, str):
        text = selector.strip()
        if text != "*" and not all(part and all(p.isdigit() for p in part.split("-", 1))
                                   for part in text.split(",")):
            raise ValueError(f"bad message selector {selector!r}: expected *, N, N-M or a list of them")
        return text
    if isinstance(selector, int):
        return str(selector)
    items = [selector] if isinstance(selector, range) else list(selector)
    ids = sorted({i for item in items for i in (item if isinstance(item, range) else [int(item)])})
    if not ids:
        raise ValueError("empty message selector")
    runs: list[list[int]] = []
    for smuid in ids:
        if runs and smuid == runs[-1][1] + 1:
            runs[-1][1] = smuid
        else:
            runs.append([smuid, smuid])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# --------------------------------------------------------------------------
# Reply payloads


def payload(reply: ReplyFrame) -> list[str]:
    """The lines after ``200-OK`` (none for a one-line ``200 OK``)."""
    return reply.lines[1:]


def parse_ranges(text: str) -> list[int]:
    """``1809-1812,1845`` → ``[1809, 1810, 1811, 1812, 1845]`` (LIST MESSAGE, 4.1.3.2)."""
    ids: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            ids += range(int(first), int(last) + 1) if dash else [int(first)]
        except ValueError:
            raise ServerProtocolError(f"bad message-id range {part!r}") from None
    return ids


def parse_topic_entry(line: str) -> tuple[str, str | None]:
    """A LIST TOPIC line: ``/news > /info/news/cnn`` → (``/news``, ``/info/news/cnn``)."""
    path, arrow, target = line.partition(" > ")
    return path.strip(), (target.strip() if arrow else None)


def parse_keywords(text: str) -> list[str]:
    """``IBM,BIG BLUE`` or ``(IBM,BIG BLUE)`` → ``["IBM", "BIG BLUE"]``."""
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return [keyword.strip() for keyword in text.split(",") if keyword.strip()]


def parse_found_topic(line: str) -> tuple[str, list[str]]:
    """A FIND TOPIC line: ``/stocks/ibm (IBM,BIG BLUE)`` → (``/stocks/ibm``, [``IBM``, ``BIG BLUE``])."""
    path, _, rest = line.strip().partition(" ")
    return path, parse_keywords(rest)


def leading_int(line: str) -> int:
    """``12 messages pending`` → 12; ``45`` → 45."""
    word = line.split(None, 1)[0] if line.strip() else ""
    if not word.isdigit():
        raise ServerProtocolError(f"expected a number, got {line[:80]!r}")
    return int(word)


# --------------------------------------------------------------------------
# Reading


def _reply_line(line: str) -> tuple[int, bool, str] | None:
    """``200-text`` → (200, False, text); ``200 text`` → (200, True, text)."""
    code, sep, text = line[:3], line[3:4], line[4:]
    if not (code.isascii() and code.isdigit()) or sep not in ("-", " ", ""):
        return None
    return int(code), sep != "-", text


def _one_reply(lines: list[bytes]) -> bool:
    """``lines`` are exactly one whole reply: ``<code>-text`` lines, then ``<code> text``."""
    last = lines[-1]
    code = last[:3]
    if len(code) != 3 or not code.isdigit() or last[3:4] not in (b" ", b""):
        return False
    return all(line[:3] == code and line[3:4] == b"-" for line in lines[:-1])


@dataclass
class _GetReply:
    """A GET MESSAGE reply past its ``200 OK``: messages so far, the one being read."""

    code: int
    lines: list[str]
    messages: list[StoredMessage] = field(default_factory=list)
    framer: MessageFramer | None = None


class ServerReader:
    """Feed server bytes with :meth:`feed`; get complete frames back.

    ``greeting=False`` reads a connection with no identification line first
    (the one a server opens to the client's SET NOTIFY PORT listener); a
    line starting ``SMQP/`` is still reported as a :class:`Greeting` there.
    """

    def __init__(self, *, greeting: bool = True, max_line_bytes: int = 1 << 20,
                 max_header_lines: int = 1 << 16, max_message_bytes: int = 1 << 31):
        self._buffer = LineBuffer(max_line_bytes)
        self._max_header_lines = max_header_lines
        self._max_message_bytes = max_message_bytes
        self._greeted = not greeting
        self._optional_greeting = not greeting
        self._expected: deque[bool] = deque()  # per request sent: is its reply a GET MESSAGE reply?
        self._reply: tuple[int, list[str]] | None = None  # a multi-line reply so far
        self._get: _GetReply | None = None  # a GET MESSAGE reply whose messages are being read
        self._notify: NotifyFrame | None = None  # a NOTIFY whose body is being read
        self._framer: MessageFramer | None = None  # that body, for NOTIFY MESSAGE
        self.closed = False

    @property
    def in_frame(self) -> bool:
        """True while a frame is incomplete (say, when the connection closes)."""
        return (self._reply is not None or self._get is not None or self._notify is not None
                or self._buffer.pending)

    def expect_reply(self, *, messages: bool = False) -> None:
        """Announce one request sent; ``messages=True`` if it was GET MESSAGE."""
        self._expected.append(messages)

    def feed(self, data: bytes) -> list[Frame]:
        """Complete frames in ``data`` and what came before; ``b""`` marks EOF."""
        if not data:
            self.closed = True
            return []
        self._buffer.feed(data)
        frames: list[Frame] = []
        while (frame := self._next_frame()) is not None:
            frames.append(frame)
        return frames

    def _read_line(self) -> bytes | None:
        line = self._buffer.read_line()
        if line is Need.DATA:
            return None
        if line is Need.LINE_TOO_LONG:
            raise ServerProtocolError("server line too long")
        return line

    def _next_frame(self) -> Frame | None:
        while True:
            if self._notify is not None:
                return self._notify_body()
            if self._get is not None:
                return self._get_body()
            if (self._expected and not self._expected[0] and self._reply is None and self._greeted
                    and self._buffer.peek(1).isdigit()):  # a plain reply awaited and coming
                lines = self._buffer.read_block(_one_reply)
                if lines is not None:  # a whole reply and its empty line, as _on_line would read them
                    self._pop_expected()
                    return ReplyFrame(int(lines[0][:3]), [line[4:].decode("utf-8", errors="replace")
                                                          for line in lines])
            line = self._read_line()
            if line is None:
                return None
            frame = self._on_line(line.decode("utf-8", errors="replace"))
            if frame is not None:
                return frame

    def _on_line(self, line: str) -> Frame | None:
        """One line outside a NOTIFY body or GET reply."""
        if not self._greeted:
            if not line:
                return None
            self._greeted = True
            return Greeting(line)
        if self._reply is not None:
            return self._reply_line(line)
        if not line:
            return None
        if line[:7].upper() == "NOTIFY ":
            self._start_notify(line)
            return None
        if line.startswith("+"):
            self._pop_expected()
            return Continuation(line[1:].strip())
        if self._optional_greeting and line.startswith("SMQP/"):
            self._optional_greeting = False
            return Greeting(line)
        return self._reply_line(line)

    def _pop_expected(self) -> bool:
        return self._expected.popleft() if self._expected else False

    def _reply_line(self, line: str) -> ReplyFrame | None:
        parsed = _reply_line(line)
        if parsed is None:
            raise ServerProtocolError(f"not a reply line: {line[:80]!r}")
        code, last, text = parsed
        if self._reply is not None and self._reply[0] != code:
            raise ServerProtocolError(f"reply {self._reply[0]} continued as {code}")
        lines = (self._reply[1] if self._reply else []) + [text]
        self._reply = None if last else (code, lines)
        if not last:
            return None
        if self._pop_expected() and 200 <= code < 300:
            self._get = _GetReply(code, lines)
            return None
        return ReplyFrame(code, lines)

    def _get_body(self) -> ReplyFrame | None:
        """Advance a GET MESSAGE reply; the frame once its closing empty line is read."""
        get = self._get
        while True:
            if get.framer is not None:
                if not get.framer.advance(self._buffer):
                    return None
                if get.framer.error is not None:
                    raise ServerProtocolError(f"bad GET MESSAGE body: {get.framer.error.lines[0]}")
                get.messages.append(StoredMessage(get.framer.headers, get.framer.sections))
                get.framer = None
            line = self._read_line()
            if line is None:
                return None
            if line == b"":
                self._get = None
                return ReplyFrame(get.code, get.lines, get.messages)
            header = parse_header(line)
            if header is None:
                raise ServerProtocolError(f"expected a message header or an empty line, got {line[:80]!r}")
            get.framer = MessageFramer(max_header_lines=self._max_header_lines,
                                       max_message_bytes=self._max_message_bytes)
            get.framer.headers.append(header)  # the line that told us another message follows

    def _start_notify(self, line: str) -> None:
        words = line.split(None, 2)
        if len(words) < 2:
            raise ServerProtocolError(f"NOTIFY without a resource: {line[:80]!r}")
        resource = _RESOURCES.get(words[1].upper(), words[1].upper())
        self._notify = NotifyFrame(resource, words[2].strip() if len(words) > 2 else "")
        if resource == "MESSAGE":
            self._framer = MessageFramer(max_header_lines=self._max_header_lines,
                                         max_message_bytes=self._max_message_bytes)

    def _notify_body(self) -> NotifyFrame | None:
        """Advance the open NOTIFY; the frame once complete."""
        if self._framer is not None:
            return self._message_body()
        while True:
            line = self._read_line()
            if line is None:
                return None
            if line == b"":
                frame, self._notify = self._notify, None
                return frame
            header = parse_header(line)
            if header is None:
                raise ServerProtocolError(f"bad NOTIFY attribute line {line[:80]!r}")
            self._notify.headers.append(header)

    def _message_body(self) -> NotifyFrame | None:
        framer = self._framer
        if not framer.advance(self._buffer):
            return None
        if framer.error is not None:
            raise ServerProtocolError(f"bad NOTIFY MESSAGE body: {framer.error.lines[0]}")
        frame = NotifyFrame(self._notify.resource, self._notify.topic, framer.headers, framer.sections)
        self._notify, self._framer = None, None
        return frame
