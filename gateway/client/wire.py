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
  rule (:class:`gateway.protocol.framing.MessageFramer`: data counted by
  Content-Length, ``.`` end), and the other NOTIFY kinds (TOPIC,
  SUBSCRIBERS, SERVER TIMEOUT/BYE) as attribute lines up to an empty line.
  A NOTIFY MESSAGE that is all in the buffer and plain, as the gateway
  renders it, is read at once instead (:class:`_PlainNotify`): the same
  frame, for a fraction of the framer's steps.

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

from gateway.protocol.framing import (CONTROL_BYTES, DATA_HEADER_STARTS, LineBuffer, MessageFramer, Need,
                                      counted_length, data_header_fields, parse_header, split_header)
from gateway.protocol.rendering import render_body, render_lines
from schemas.events import Headers, Section

ACK = b"310 ACK\r\n\r\n"

#: Abbreviated NOTIFY resources → their full names (4.1.11).
_RESOURCES = {"MESS": "MESSAGE", "SUB": "SUBSCRIBERS", "SUBSCRIBER": "SUBSCRIBERS", "SERV": "SERVER"}

#: Abbreviated NOTIFY TOPIC actions → their full names (4.1.11.2).
TOPIC_ACTIONS = {"ADD": "ADDED", "REN": "RENAME", "DEL": "DELETED", "KEY": "KEYWORDS"}

_NOTIFY_MESSAGE = b"NOTIFY MESSAGE "


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


def render_ack(smuid: str) -> bytes:
    """``310 ACK <smuid>``, as :func:`render_command` renders it: one is sent per message in a
    notify window, so the usual SMUID (no line break) skips its general checks."""
    word = str(smuid)
    if "\r" in word or "\n" in word:
        return render_command("310", "ACK", word)  # refused there, as any command would be
    return ("310 ACK " + word + "\r\n\r\n").encode("utf-8")


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
    if len(lines) == 1:  # most replies (every 310 ACK): no generator to build
        return True
    return all(line[:3] == code and line[3:4] == b"-" for line in lines[:-1])


# -- NOTIFY MESSAGE read at once


def _plain_lines(block: bytes | bytearray) -> list[str] | None:
    """``block`` as lines of text, when they are plain: separated by CRLF, with no other CR or
    LF, no control byte but TAB, valid UTF-8 (as each line then is).  CR and LF are among the
    :data:`~gateway.protocol.framing.CONTROL_BYTES`: deleted from a block of plain lines, those leave it
    two bytes shorter per CRLF between them, and no shorter."""
    if len(block) - len(block.translate(None, CONTROL_BYTES)) != 2 * block.count(b"\r\n"):
        return None
    try:
        return block.decode("utf-8").split("\r\n")
    except UnicodeDecodeError:
        return None


def _plain_headers(lines: list[str]) -> Headers | None:
    """What :func:`gateway.protocol.framing.parse_header` makes of each line, which
    :func:`_plain_lines` has already checked for control bytes and UTF-8; None if it refuses one."""
    headers = []
    for line in lines:
        header = split_header(line)
        if header is None:
            return None
        headers.append(header)
    return headers


def _plain_length(headers: Headers) -> int | None:
    """A data header's one numeric Content-Length, if it also has a Content-Type (else the
    framer reports the error)."""
    lengths, typed = data_header_fields(headers)
    return counted_length(lengths) if typed else None


class _PlainNotify:
    """Reads a NOTIFY MESSAGE frame at once, when all of it is in the buffer and plain.

    What the gateway sends most is NOTIFY MESSAGE as :func:`gateway.protocol.rendering.render_notify`
    writes it: the NOTIFY line and header lines, an empty line, then sections (data header
    lines, an empty line, exactly Content-Length bytes, CRLF) and a ``.`` line.  A few finds
    and splits over the bytes read it, where the framer takes a dozen steps and a parse_header
    per line.  Only frames the framer reads without error or leniency are read here, so the
    frame is the framer's; anything else (a frame not all here yet, a bare LF, a control byte,
    a header line parse_header refuses, a Content-Type/Length among the message headers, a
    missing, repeated or non-numeric Content-Length, a missing Content-Type, data not followed
    by CRLF, a line or a total over the reader's limits) is left to the framer, whose
    errors then stay its own.

    A connection's messages mostly share a few data headers (``Content-Type: text/plain``,
    ``Content-Length: 200``), so each short one is parsed once and kept, per reader.
    """

    _KEPT = 64  # data headers kept at most (then forgotten all at once)
    _KEPT_BYTES = 512  # the longest data header kept

    def __init__(self, max_line_bytes: int, max_header_lines: int, max_message_bytes: int):
        self._max_line = max_line_bytes
        self._max_header_lines = max_header_lines
        self._max_bytes = max_message_bytes
        self._data_headers: dict[bytes, tuple[tuple[tuple[str, str], ...], int]] = {}

    def __call__(self, data: bytes | bytearray, pos: int) -> tuple[NotifyFrame, int] | None:
        """The frame at ``pos`` (where ``NOTIFY MESSAGE`` starts) and where it ends, past its
        ``.`` line and the empty line the server sends after it if that is here too (the
        reader would skip it next); or None."""
        head_end = data.find(b"\r\n\r\n", pos)
        lines = self._lines(data, pos, head_end)  # the NOTIFY line, then the header lines
        headers = None if lines is None else _plain_headers(lines[1:])
        if headers is None or not DATA_HEADER_STARTS.isdisjoint([name.lower() for name, _ in headers]):
            return None  # (a Content-Type/Length there starts a data header: the framer's leniency)
        sections: list[Section] = []
        count, total, at = len(headers), 0, head_end + 4
        while True:
            while data.startswith(b"\r\n", at):  # empty lines between sections
                at += 2
            if data.startswith(b".\r\n", at):
                break
            read = self._section(data, at)
            if read is None:
                return None
            section, at = read
            sections.append(section)
            count += len(section.headers)
            total += len(section.data)
        if count > self._max_header_lines or total > self._max_bytes:
            return None
        end = at + 3  # past the "." line
        if data.startswith(b"\r\n", end):
            end += 2
        return NotifyFrame("MESSAGE", lines[0][len(_NOTIFY_MESSAGE):].strip(), headers, sections), end

    def _lines(self, data: bytes | bytearray, start: int, end: int) -> list[str] | None:
        """:func:`_plain_lines` of ``data[start:end]``, if ``end`` was found and no line is too
        long (none is if the block is not: a test of each line is for the rare block that is)."""
        if end < 0 or end - start > self._max_line:
            return None
        return _plain_lines(data[start:end])

    def _section(self, data: bytes | bytearray, start: int) -> tuple[Section, int] | None:
        """The section at ``start`` and where it ends (past the CRLF after its data)."""
        head_end = data.find(b"\r\n\r\n", start)
        parsed = self._data_header(data, start, head_end)
        if parsed is None:
            return None
        headers, length = parsed
        begin = head_end + 4
        end = begin + length
        if not data.startswith(b"\r\n", end):  # (or not all here yet)
            return None
        return Section(headers, bytes(data[begin:end])), end + 2

    def _data_header(self, data: bytes | bytearray, start: int, end: int) -> tuple[Headers, int] | None:
        """The data header ``data[start:end]`` and its Content-Length: parsed, or as parsed before."""
        key = bytes(data[start:end]) if 0 <= end - start <= self._KEPT_BYTES else None
        kept = self._data_headers.get(key) if key is not None else None
        if kept is not None:
            return list(kept[0]), kept[1]
        lines = self._lines(data, start, end)
        headers = None if lines is None else _plain_headers(lines)
        length = None if headers is None else _plain_length(headers)
        if length is None:
            return None
        if key is not None:
            if len(self._data_headers) >= self._KEPT:
                self._data_headers.clear()
            self._data_headers[key] = (tuple(headers), length)
        return headers, length


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
        self._plain_notify = _PlainNotify(max_line_bytes, max_header_lines, max_message_bytes)
        self._read_plain = max_line_bytes >= 1  # (below that, even the "." line is too long)
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
            if self._read_plain and self._greeted and self._reply is None:  # where _on_line reads NOTIFY
                frame = self._buffer.read_with(_NOTIFY_MESSAGE, self._plain_notify)
                if frame is not None:
                    return frame
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
