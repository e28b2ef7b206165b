"""The client side of SMQP, sans-I/O: server bytes in, frames out; commands → bytes.

:class:`ServerReader` turns what a server sends into frames:

* :class:`Greeting` — the identification line, always first (spec 4);
* :class:`ReplyFrame` — a reply, multi-line ones joined up to the
  ``<code> <text>`` line (Appendix A);
* :class:`NotifyFrame` — NOTIFY MESSAGE read by the server's own framing
  rule (:class:`gateway.protocol.MessageFramer`: data counted by
  Content-Length, ``.`` end), and other NOTIFY kinds (SERVER BYE, TOPIC,
  SUBSCRIBERS) as header lines up to an empty line.

Empty lines between frames are skipped, so the empty line that ends each
server reply is consumed whether or not a server sends it (the spec's LOGIN
transcript omits it).  Bytes that fit no frame raise
:class:`ServerProtocolError`: a client cannot resynchronise with a server
it no longer understands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from gateway.protocol import LineBuffer, MessageFramer, Need, parse_header, render_body, render_lines
from schemas.events import Headers, Section

ACK = b"310 ACK\r\n\r\n"

#: Abbreviated NOTIFY resources → their full names (4.1.11).
_RESOURCES = {"MESS": "MESSAGE", "SUB": "SUBSCRIBERS", "SERV": "SERVER"}


class ServerProtocolError(Exception):
    """The server sent bytes that fit no SMQP frame."""


@dataclass(frozen=True)
class Greeting:
    text: str


@dataclass(frozen=True)
class ReplyFrame:
    code: int
    lines: list[str]


@dataclass(frozen=True)
class NotifyFrame:
    resource: str  # MESSAGE, SERVER, TOPIC, SUBSCRIBERS, … (abbreviations expanded)
    topic: str  # the rest of the NOTIFY line: a topic, or e.g. "BYE 00:05:00"
    headers: Headers = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)


Frame = Union[Greeting, ReplyFrame, NotifyFrame]


def render_command(*words: str) -> bytes:
    """A command line, then the empty line the spec's clients send after it."""
    return (" ".join(words) + "\r\n\r\n").encode("utf-8")


def render_publish(topic: str, cmuid: str, headers: Headers, sections: list[Section]) -> bytes:
    """PUB MESSAGE with its body (Content-Length always set from the data)."""
    return render_lines([f"PUB MESSAGE {topic} {cmuid}"]) + render_body(headers, sections) + b"\r\n"


def _reply_line(line: str) -> tuple[int, bool, str] | None:
    """``200-text`` → (200, False, text); ``200 text`` → (200, True, text)."""
    code, sep, text = line[:3], line[3:4], line[4:]
    if not (code.isascii() and code.isdigit()) or sep not in ("-", " ", ""):
        return None
    return int(code), sep != "-", text


class ServerReader:
    """Feed server bytes with :meth:`feed`; get complete frames back."""

    def __init__(self, *, max_line_bytes: int = 1 << 20, max_header_lines: int = 1 << 16,
                 max_message_bytes: int = 1 << 31):
        self._buffer = LineBuffer(max_line_bytes)
        self._max_header_lines = max_header_lines
        self._max_message_bytes = max_message_bytes
        self._greeted = False
        self._reply: tuple[int, list[str]] | None = None  # a multi-line reply so far
        self._notify: NotifyFrame | None = None  # a NOTIFY whose body is being read
        self._framer: MessageFramer | None = None  # that body, for NOTIFY MESSAGE
        self.closed = False

    @property
    def in_frame(self) -> bool:
        """True while a frame is incomplete (say, when the connection closes)."""
        return self._reply is not None or self._notify is not None or self._buffer.pending

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

    def _next_frame(self) -> Frame | None:
        while True:
            if self._notify is not None:
                return self._notify_body()
            line = self._buffer.read_line()
            if line is Need.DATA:
                return None
            if line is Need.LINE_TOO_LONG:
                raise ServerProtocolError("server line too long")
            frame = self._on_line(line.decode("utf-8", errors="replace"))
            if frame is not None or self._notify is not None:
                return frame or self._notify_body()

    def _on_line(self, line: str) -> Frame | None:
        """One line outside a NOTIFY body."""
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
        return self._reply_line(line)

    def _reply_line(self, line: str) -> ReplyFrame | None:
        parsed = _reply_line(line)
        if parsed is None:
            raise ServerProtocolError(f"not a reply line: {line[:80]!r}")
        code, last, text = parsed
        if self._reply is not None and self._reply[0] != code:
            raise ServerProtocolError(f"reply {self._reply[0]} continued as {code}")
        lines = (self._reply[1] if self._reply else []) + [text]
        self._reply = None if last else (code, lines)
        return ReplyFrame(code, lines) if last else None

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
            line = self._buffer.read_line()
            if line is Need.DATA:
                return None
            if line is Need.LINE_TOO_LONG:
                raise ServerProtocolError("server line too long")
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
