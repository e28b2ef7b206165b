"""The SMQP server session, sans-I/O: bytes in, actions out.

Like h11, a :class:`Session` never sees a socket, a timer or Kafka.  The
I/O layer feeds it what it reads (:meth:`Session.receive_data`) and carries
out the actions it returns, **in order**:

* :class:`Send` — write the bytes now;
* :class:`Durable` — append ``event.to_bytes()`` to Kafka (acks=all) under
  ``key``, and only then write ``reply``; on failure write a 503 instead.
  Later actions wait for it, so replies keep the order of the commands;
* :class:`LoggedIn` — the session now belongs to an account (start tailing
  its deliveries);
* :class:`Close` — close the connection after writing what came before.

Wire rules (spec section 4, decided where the spec is loose):

* Lines end with CRLF; a bare LF is accepted on command and header lines,
  never inside data.  Verbs and keywords are case-insensitive; empty lines
  between commands are ignored (the spec's clients send one after each
  command).
* A line longer than ``max_line_bytes`` gets ``400`` and is discarded up to
  its LF, without being buffered.  Each ``400`` counts as a bad command;
  after ``max_bad_commands`` of them the next one gets ``400`` and a close.
* PUBLISH bodies follow :class:`MessageFramer` (the one framing rule, also
  used by the client for NOTIFY MESSAGE): header lines, an empty line, data
  sections counted by ``Content-Length`` only, then a ``.`` line.  Errors
  inside a frame are answered once the frame has ended, so the next command
  always parses; a frame that never ends is the I/O layer's timer's job
  (:meth:`Session.frame_timeout`).
* Verbs the spec has but this gateway does not serve yet answer ``501``
  naming the verb (a PUB REPLY body is consumed first).
* Wildcard SUB/UNSUB MESSAGE replies echo the pattern (``200 /stocks/*``):
  the gateway cannot list matching topics, which the streaming job owns.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Callable, Union

from gateway.replies import (
    BAD_REQUEST,
    ENTITY_TOO_LARGE,
    LENGTH_REQUIRED,
    MAX_QUANTITIES_EXCEEDED,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    REQUEST_TIMEOUT,
    TOPIC_TOO_LONG,
    UNAUTHORIZED,
    Reply,
)
from schemas.config import GatewayConfig
from schemas.events import Ack, Deliver, Headers, Publish, Section, Subscribe, Unsubscribe
from schemas.timefmt import format_date_time, parse_date_time, parse_timeout
from schemas.topics import RootWildcardError, TopicError, account_topic, canonical, parse_pattern

CRLF = b"\r\n"
SERVER_BYE = b"NOTIFY SERVER BYE\r\n\r\n"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class AuthResult(enum.Enum):
    """What the account store says about a user/password pair."""

    OK = "ok"
    UNKNOWN_ACCOUNT = "unknown account"
    BAD_PASSWORD = "bad password"


class SessionMisuse(RuntimeError):
    """We, not the peer, broke the protocol (h11's LocalProtocolError), e.g. a
    second NOTIFY while the first still awaits its ``310 ACK``."""


# --------------------------------------------------------------------------
# Actions


@dataclass(frozen=True)
class Send:
    """Write these bytes now."""

    data: bytes


@dataclass(frozen=True)
class Durable:
    """Append ``event`` to Kafka under ``key`` (acks=all), then write ``reply``."""

    event: Publish | Subscribe | Unsubscribe | Ack
    key: bytes
    reply: bytes


@dataclass(frozen=True)
class LoggedIn:
    """The session authenticated as ``account``; ``guid`` names this login."""

    account: str
    guid: str


@dataclass(frozen=True)
class Close:
    """Close the connection once the actions before it are done."""


Action = Union[Send, Durable, LoggedIn, Close]


# --------------------------------------------------------------------------
# Reading lines and bytes


class Need(enum.Enum):
    """What :meth:`LineBuffer.read_line` returns instead of a line."""

    DATA = "need more data"
    LINE_TOO_LONG = "line too long"


class LineBuffer:
    """Received bytes not yet consumed, read as lines or counted bytes.

    Holds at most one unfinished line of ``max_line_bytes`` (plus whatever
    arrived in the current chunk): an overlong line is reported once and its
    rest dropped as it arrives, up to its LF.
    """

    def __init__(self, max_line_bytes: int):
        self._max = max_line_bytes
        self._data = bytearray()
        self._scanned = 0  # bytes already searched for LF
        self._skipping = False  # dropping the rest of an overlong line

    def __len__(self) -> int:
        return len(self._data)

    @property
    def pending(self) -> bool:
        """True while a partial line or an overlong line's tail is outstanding."""
        return bool(self._data) or self._skipping

    def feed(self, data: bytes) -> None:
        self._data += data

    def read_line(self) -> bytes | Need:
        """The next line without its CRLF (or bare LF), or why there is none yet."""
        if self._skipping and not self._skip_to_lf():
            return Need.DATA
        end = self._data.find(b"\n", self._scanned)
        if end < 0:
            return self._await_lf()
        line = bytes(self._data[:end])
        del self._data[: end + 1]
        self._scanned = 0
        line = line[:-1] if line.endswith(b"\r") else line
        return Need.LINE_TOO_LONG if len(line) > self._max else line

    def _await_lf(self) -> Need:
        """No LF yet: wait, unless the line is already too long to keep."""
        self._scanned = len(self._data)
        if len(self._data) <= self._max + 1:  # room for the line and its CR
            return Need.DATA
        self._data.clear()
        self._scanned = 0
        self._skipping = True
        return Need.LINE_TOO_LONG

    def _skip_to_lf(self) -> bool:
        """Drop an overlong line's tail; True once its LF has gone too."""
        end = self._data.find(b"\n")
        if end < 0:
            self._data.clear()
            return False
        del self._data[: end + 1]
        self._skipping = False
        return True

    def take(self, limit: int) -> bytes:
        """Up to ``limit`` raw bytes (data, not lines)."""
        chunk = bytes(self._data[:limit])
        del self._data[:limit]
        self._scanned = 0
        return chunk


# --------------------------------------------------------------------------
# The framing rule


def parse_header(line: bytes) -> tuple[str, str] | None:
    """``Name: value`` → (name, stripped value); None if it is not one."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(c) < 32 and c != "\t" or c == "\x7f" for c in text):
        return None  # a stray CR could split the line again on the subscriber's side
    name, colon, value = text.partition(":")
    if not colon or not name or name != name.strip() or " " in name or "\t" in name:
        return None
    return name, value.strip()


_DATA_HEADER_STARTS = frozenset({"content-type", "content-length"})


class _State(enum.Enum):
    HEADERS = "message header lines"
    BETWEEN = "between data sections"
    DATA_HEADERS = "data header lines"
    DATA = "data bytes"
    DATA_END = "CRLF after data"
    DISCARD = "discarding up to the '.' line"
    DONE = "done"


class MessageFramer:
    """The one framing rule for a PUBLISH (and NOTIFY) MESSAGE body.

    After the command line come header lines until an empty line, then zero
    or more data sections, then a line that is exactly ``.``.  A section is
    data header lines (``Content-Type``, ``Content-Length``, …) until an
    empty line, exactly ``Content-Length`` bytes, then CRLF.  Empty lines
    between sections are skipped.  Data is binary and counted only, so a
    ``\\r\\n.\\r\\n`` inside it never ends the frame.  Leniency: a
    ``Content-Type``/``Content-Length`` line among the message headers
    starts the first data header (the spec's PUB REPLY example omits the
    empty line), and ``.`` right after the headers ends an empty message.

    Errors are of two kinds.  Where the byte count is still known (missing
    Content-Type, too large) the frame is read on, data dropped, and the
    error kept.  Where it is lost (bad or missing Content-Length, no CRLF
    after the data, malformed or too many header lines, overlong line) the
    rest is discarded up to and including the next ``.`` line.  Either way
    :attr:`error` holds the first error, for the caller to send at the end.
    """

    def __init__(self, *, max_header_lines: int, max_message_bytes: int, keep_data: bool = True):
        self.headers: Headers = []
        self.sections: list[Section] = []
        self.error: Reply | None = None
        self._max_header_lines = max_header_lines
        self._max_bytes = max_message_bytes
        self._keep = keep_data
        self._state = _State.HEADERS
        self._header_lines = 0
        self._total = 0
        self._section_headers: Headers = []
        self._chunks: list[bytes] = []
        self._remaining = 0
        self._steps = MappingProxyType({
            _State.HEADERS: self._step_headers,
            _State.BETWEEN: self._step_between,
            _State.DATA_HEADERS: self._step_data_headers,
            _State.DATA: self._step_data,
            _State.DATA_END: self._step_data_end,
            _State.DISCARD: self._step_discard,
        })

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    def advance(self, buffer: LineBuffer) -> bool:
        """Consume what ``buffer`` holds; True once the frame's ``.`` line is read."""
        while not self.done and self._steps[self._state](buffer):
            pass
        return self.done

    # -- errors

    def _keep_error(self, reply: Reply) -> None:
        """An error that leaves the byte count intact: read on, drop the data."""
        if self.error is None:
            self.error = reply
        self._keep = False

    def _lose_sync(self, reply: Reply) -> bool:
        """An error after which only the ``.`` line can tell where the frame ends."""
        self._keep_error(reply)
        self._state = _State.DISCARD
        return True

    # -- steps: each returns True if it made progress

    def _header_line(self, buffer: LineBuffer) -> bytes | None:
        """The next line; None if there is none yet or it was too long (handled)."""
        line = buffer.read_line()
        if line is Need.DATA:
            return None
        if line is Need.LINE_TOO_LONG:
            self._lose_sync(Reply.error(BAD_REQUEST, "line too long"))
            return None
        return line

    def _parse_counted(self, line: bytes) -> tuple[str, str] | None:
        header = parse_header(line)
        if header is None:
            self._lose_sync(Reply.error(BAD_REQUEST, "malformed header line"))
            return None
        self._header_lines += 1
        if self._header_lines > self._max_header_lines:
            self._lose_sync(Reply.error(BAD_REQUEST, "too many header lines"))
            return None
        return header

    def _step_headers(self, buffer: LineBuffer) -> bool:
        line = self._header_line(buffer)
        if line is None:
            return self._state is _State.DISCARD
        if line in (b"", b"."):
            self._state = _State.BETWEEN if line == b"" else _State.DONE
            return True
        header = self._parse_counted(line)
        if header is not None and header[0].lower() in _DATA_HEADER_STARTS:
            self._section_headers = [header]
            self._state = _State.DATA_HEADERS
        elif header is not None:
            self.headers.append(header)
        return True

    def _step_between(self, buffer: LineBuffer) -> bool:
        line = self._header_line(buffer)
        if line is None:
            return self._state is _State.DISCARD
        if line == b".":
            self._state = _State.DONE
        elif line != b"":
            header = self._parse_counted(line)
            if header is not None:
                self._section_headers = [header]
                self._state = _State.DATA_HEADERS
        return True

    def _step_data_headers(self, buffer: LineBuffer) -> bool:
        line = self._header_line(buffer)
        if line is None:
            return self._state is _State.DISCARD
        if line == b".":
            self._keep_error(Reply.error(BAD_REQUEST, "data header without data"))
            self._state = _State.DONE
        elif line == b"":
            self._start_data()
        else:
            header = self._parse_counted(line)
            if header is not None:
                self._section_headers.append(header)
        return True

    def _start_data(self) -> None:
        """The data header is complete: validate it and count the data to come."""
        lengths = [v for n, v in self._section_headers if n.lower() == "content-length"]
        if not lengths:
            self._lose_sync(Reply.error(LENGTH_REQUIRED, "Content-Length missing"))
            return
        if len(lengths) > 1 or not (lengths[0].isascii() and lengths[0].isdigit()):
            self._lose_sync(Reply.error(BAD_REQUEST, "bad Content-Length"))
            return
        if not any(n.lower() == "content-type" for n, _ in self._section_headers):
            self._keep_error(Reply.error(BAD_REQUEST, "Content-Type missing"))
        self._remaining = int(lengths[0])
        self._total += self._remaining
        if self._total > self._max_bytes:
            self._keep_error(Reply.error(ENTITY_TOO_LARGE, f"more than {self._max_bytes} data bytes"))
        self._chunks = []
        self._state = _State.DATA

    def _step_data(self, buffer: LineBuffer) -> bool:
        if self._remaining:
            chunk = buffer.take(self._remaining)
            if not chunk:
                return False
            self._remaining -= len(chunk)
            if self._keep:
                self._chunks.append(chunk)
        if not self._remaining:
            self._state = _State.DATA_END
        return True

    def _step_data_end(self, buffer: LineBuffer) -> bool:
        if len(buffer) < 2:
            return False
        if buffer.take(2) != CRLF:
            return self._lose_sync(Reply.error(BAD_REQUEST, "Content-Length does not match the data"))
        if self._keep:
            self.sections.append(Section(self._section_headers, b"".join(self._chunks)))
        self._chunks = []
        self._state = _State.BETWEEN
        return True

    def _step_discard(self, buffer: LineBuffer) -> bool:
        line = buffer.read_line()
        if line is Need.DATA:
            return False
        if line == b".":
            self._state = _State.DONE
        return True


# --------------------------------------------------------------------------
# Rendering message bodies


def render_lines(lines: list[str]) -> bytes:
    return "".join(f"{line}\r\n" for line in lines).encode("utf-8")


def _section_header_lines(section: Section) -> list[str]:
    """The section's header lines with Content-Length set from its data, so the
    frame can never be miscounted."""
    length = str(len(section.data))
    lines = [f"{n}: {length if n.lower() == 'content-length' else v}" for n, v in section.headers]
    if not any(n.lower() == "content-length" for n, _ in section.headers):
        lines.append(f"Content-Length: {length}")
    return lines


def render_body(headers: Headers, sections: list[Section]) -> bytes:
    """Header lines, empty line, sections (empty line between), then ``.``.

    The inverse of :class:`MessageFramer`; both PUBLISH and NOTIFY use it.
    """
    parts = [render_lines([f"{n}: {v}" for n, v in headers]), CRLF]
    for index, section in enumerate(sections):
        if index:
            parts.append(CRLF)
        parts += [render_lines(_section_header_lines(section)), CRLF, section.data, CRLF]
    parts.append(b".\r\n")
    return b"".join(parts)


_SERVER_AFFIXED = frozenset({"created", "smuid", "cmuid"})


def render_notify(deliver: Deliver, server_host: str) -> bytes:
    """NOTIFY MESSAGE in spec 4.1.11.1's order: Created, Smuid, Cmuid, then the
    publisher's other attributes as sent, the sections, ``.``, an empty line."""
    created = next((v for n, v in deliver.headers if n.lower() == "created"), None)
    if created is None:
        created = format_date_time(from_micros(deliver.accepted_at))
    head = [
        f"NOTIFY MESSAGE {deliver.topic}",
        f"Created: {created}",
        f"Smuid: {server_host}/{deliver.smuid}",
        f"Cmuid: {deliver.publisher}/{deliver.publisher_guid}/{deliver.cmuid}",
    ]
    others = [(n, v) for n, v in deliver.headers if n.lower() not in _SERVER_AFFIXED]
    return render_lines(head) + render_body(others, deliver.sections) + CRLF


def to_micros(moment: datetime) -> int:
    """Microseconds since the epoch, exactly (no float rounding)."""
    delta = moment - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    return datetime.fromtimestamp(micros // 1_000_000, timezone.utc).replace(microsecond=micros % 1_000_000)


# --------------------------------------------------------------------------
# Header checks for PUBLISH


def _is_count(value: str) -> bool:
    return value.isascii() and value.isdigit()


def _parses(parse: Callable[[str], object]) -> Callable[[str], bool]:
    def check(value: str) -> bool:
        try:
            parse(value)
        except ValueError:
            return False
        return True
    return check


#: Message header attributes whose values the gateway validates.
_HEADER_CHECKS = MappingProxyType({
    "priority": _is_count,
    "pri": _is_count,
    "timeout": _parses(parse_timeout),
    "created": _parses(parse_date_time),
})


def check_message_headers(headers: Headers) -> Reply | None:
    """400 naming the first attribute with a bad value, else None."""
    for name, value in headers:
        check = _HEADER_CHECKS.get(name.lower())
        if check is not None and not check(value):
            return Reply.error(BAD_REQUEST, f"bad {name} value")
    return None


def message_priority(headers: Headers) -> int:
    """``Priority``/``Pri`` (already validated), 0 when absent."""
    return next((int(v) for n, v in headers if n.lower() in ("priority", "pri")), 0)


def topic_error(error: TopicError) -> Reply:
    """510 for ``/*`` (4.1.9.1), 402 for an overlong level, else 400."""
    if isinstance(error, RootWildcardError):
        return Reply.error(MAX_QUANTITIES_EXCEEDED)
    if error.too_long:
        return Reply.error(TOPIC_TOO_LONG, error.reason)
    return Reply.error(BAD_REQUEST, error.reason)


def _valid_account(name: str) -> bool:
    """An account owns the topic ``/accounts/<name>``, so its name must make one."""
    try:
        canonical(account_topic(name))
    except TopicError:
        return False
    return "/" not in name


# --------------------------------------------------------------------------
# The session


class _Phase(enum.Enum):
    """Per-connection state; per-frame state lives in :class:`_OpenPublish`."""

    NEW = "awaiting LOGIN"
    AUTHENTICATING = "awaiting PASS"
    READY = "logged in"
    CLOSED = "closed"


@dataclass
class _OpenPublish:
    """A PUBLISH whose body is still being read."""

    framer: MessageFramer
    topic: str
    cmuid: str
    error: Reply | None  # decided by the command line, sent after the body


#: Verb (and abbreviation) → handler suffix: ``smqp_<suffix>``.
_VERBS = MappingProxyType({
    "LOGIN": "LOGIN",
    "PASS": "PASS", "PASSWORD": "PASS",
    "PUB": "PUBLISH", "PUBLISH": "PUBLISH",
    "SUB": "SUBSCRIBE", "SUBSCRIBE": "SUBSCRIBE",
    "UNSUB": "UNSUBSCRIBE", "UNSUBSCRIBE": "UNSUBSCRIBE",
    "310": "ACK",
    "NOOP": "NOOP",
    "QUIT": "QUIT",
    **{verb: "not_implemented" for verb in ("COUNT", "LIST", "CREATE", "REMOVE", "REM", "SET", "FIND", "GET")},
})

#: Verbs served before login.  PUBLISH answers 401 itself, after its body.
_OPEN_VERBS = frozenset({"LOGIN", "PASS", "PASSWORD", "NOOP", "QUIT", "PUB", "PUBLISH"})

_MESSAGE = frozenset({"MESSAGE", "MESS"})
_PUB_RESOURCES = frozenset({*_MESSAGE, "REPLY"})
#: SUB/UNSUB resources the spec has and this gateway does not serve yet.
_OTHER_SUB_RESOURCES = frozenset({"TOPIC", "SUBSCRIBER", "SUBSCRIBERS", "SUB", "SERVER", "SERV", "*"})


class Session:
    """One client connection's SMQP state machine."""

    def __init__(self, config: GatewayConfig, authenticate: Callable[[str, str], AuthResult], *,
                 clock: Callable[[], datetime], new_guid: Callable[[str], str],
                 new_smuid: Callable[[], int]):
        self._config = config
        self._authenticate = authenticate
        self._clock = clock
        self._new_guid = new_guid
        self._new_smuid = new_smuid
        self._buffer = LineBuffer(config.max_line_bytes)
        self._phase = _Phase.NEW
        self._login_user: str | None = None
        self._account: str | None = None
        self._guid: str | None = None
        self._publish: _OpenPublish | None = None
        self._awaiting_ack: int | None = None
        self._bad_commands = 0
        self._handlers = MappingProxyType({verb: getattr(self, f"smqp_{name}") for verb, name in _VERBS.items()})

    # -- public API

    @property
    def account(self) -> str | None:
        return self._account

    @property
    def guid(self) -> str | None:
        return self._guid

    @property
    def logged_in(self) -> bool:
        return self._phase is _Phase.READY

    @property
    def closed(self) -> bool:
        return self._phase is _Phase.CLOSED

    @property
    def awaiting_ack(self) -> int | None:
        """The SMUID of the NOTIFY awaiting the client's ``310 ACK``, if any."""
        return self._awaiting_ack

    @property
    def in_frame(self) -> bool:
        """True while an unfinished PUBLISH body or command line is buffered:
        the I/O layer's cue to keep its frame timer running."""
        return not self.closed and (self._publish is not None or self._buffer.pending)

    def greeting(self) -> bytes:
        """The identification the server sends first (spec 4); no empty line follows."""
        return f"SMQP/1.0 Ready. {self._config.server_ident}\r\n".encode("utf-8")

    def receive_data(self, data: bytes) -> list[Action]:
        """Feed received bytes; ``b""`` means the peer closed (a partial frame is dropped)."""
        if self.closed:
            return []
        if not data:
            self._close()
            return []
        self._buffer.feed(data)
        actions: list[Action] = []
        while not self.closed:
            step = self._next_step()
            if step is None:
                break
            actions += step
        return actions

    def notify(self, deliver: Deliver) -> bytes:
        """Render NOTIFY MESSAGE and await its ``310 ACK`` (one at a time, 4.1.11.1)."""
        if not self.logged_in:
            raise SessionMisuse("NOTIFY on a session that is not logged in")
        if self._awaiting_ack is not None:
            raise SessionMisuse(f"NOTIFY while SMUID {self._awaiting_ack} still awaits its 310 ACK")
        if deliver.account.lower() != self._account.lower():
            raise SessionMisuse(f"delivery for {deliver.account!r} on {self._account!r}'s session")
        self._awaiting_ack = deliver.smuid
        return render_notify(deliver, self._config.server_host)

    def frame_timeout(self) -> list[Action]:
        """The frame timer fired: 408 and close if a frame is unfinished, else nothing."""
        if not self.in_frame:
            return []
        self._close()
        return [Send(Reply.error(REQUEST_TIMEOUT).to_bytes()), Close()]

    def server_bye(self) -> bytes:
        """NOTIFY SERVER BYE (4.1.11.4.2), sent before the server shuts down."""
        return SERVER_BYE

    # -- the read loop

    def _next_step(self) -> list[Action] | None:
        """Actions for the next complete command or frame; None if more bytes are needed."""
        if self._publish is not None:
            if not self._publish.framer.advance(self._buffer):
                return None
            publish, self._publish = self._publish, None
            return self._finish_publish(publish)
        line = self._buffer.read_line()
        if line is Need.DATA:
            return None
        if line is Need.LINE_TOO_LONG:
            return self._bad(Reply.error(BAD_REQUEST, "line too long"))
        return self._dispatch(line)

    def _dispatch(self, line: bytes) -> list[Action]:
        """One command line → its ``smqp_<VERB>`` handler."""
        try:
            words = line.decode("utf-8").split()
        except UnicodeDecodeError:
            return self._bad(Reply.error(BAD_REQUEST, "command is not UTF-8"))
        if not words:
            return []
        verb = words[0].upper()
        handler = self._handlers.get(verb)
        if handler is None:
            return self._bad(Reply.error(BAD_REQUEST, "unknown command"))
        if not self.logged_in and verb not in _OPEN_VERBS:
            return self._reply(Reply.error(UNAUTHORIZED, "LOGIN first"))
        return handler(verb, words[1:])

    # -- helpers

    def _close(self) -> None:
        self._phase = _Phase.CLOSED
        self._publish = None

    def _now(self) -> int:
        return to_micros(self._clock())

    @staticmethod
    def _reply(reply: Reply) -> list[Action]:
        return [Send(reply.to_bytes())]

    def _bad(self, reply: Reply) -> list[Action]:
        """Answer a syntax error, counting it against the session's budget."""
        self._bad_commands += 1
        if self._bad_commands <= self._config.max_bad_commands:
            return self._reply(reply)
        self._close()
        return [Send(Reply.error(BAD_REQUEST, "too many bad commands, closing").to_bytes()), Close()]

    def _error(self, reply: Reply) -> list[Action]:
        """Any error reply; only 400s count as bad commands."""
        return self._bad(reply) if reply.code == BAD_REQUEST else self._reply(reply)

    def _usage(self, usage: str) -> list[Action]:
        return self._bad(Reply.error(BAD_REQUEST, f"usage: {usage}"))

    def _not_implemented(self, what: str) -> list[Action]:
        return self._reply(Reply.error(NOT_IMPLEMENTED, what))

    # -- handlers: one per verb, abbreviations share them

    def smqp_LOGIN(self, verb: str, args: list[str]) -> list[Action]:
        """``LOGIN <user> <method>/<version>``; only CLEAR is offered (405 otherwise)."""
        if self.logged_in:
            return self._bad(Reply.error(BAD_REQUEST, "already logged in"))
        method, slash, version = args[1].partition("/") if len(args) == 2 else ("", "", "")
        if not (method and slash and version):
            return self._usage("LOGIN <user> <method>/<version>")
        if not _valid_account(args[0]):
            return self._bad(Reply.error(BAD_REQUEST, "account name must be a valid topic level"))
        self._phase, self._login_user = _Phase.NEW, None
        if method.upper() != "CLEAR":
            return self._reply(Reply.error(NOT_ALLOWED))
        self._phase, self._login_user = _Phase.AUTHENTICATING, args[0]
        return self._reply(Reply.ok())

    def smqp_PASS(self, verb: str, args: list[str]) -> list[Action]:
        """``PASS <user> [password]`` after ``LOGIN <user> CLEAR``; one attempt per LOGIN."""
        if self.logged_in:
            return self._bad(Reply.error(BAD_REQUEST, "already logged in"))
        if not 1 <= len(args) <= 2:
            return self._usage("PASS <user> [password]")
        user, password = args[0], (args[1] if len(args) == 2 else "")
        expected, self._login_user, self._phase = self._login_user, None, _Phase.NEW
        if user != expected:
            return self._bad(Reply.error(BAD_REQUEST, "PASS without a matching LOGIN"))
        result = self._authenticate(user, password)
        if result is AuthResult.UNKNOWN_ACCOUNT:
            return self._reply(Reply.error(NOT_FOUND, "account not found"))
        if result is not AuthResult.OK:
            return self._reply(Reply.error(UNAUTHORIZED, "password not correct"))
        return self._log_in(user)

    def _log_in(self, user: str) -> list[Action]:
        """The 4.1.1 login reply, in the spec example's attribute order."""
        self._phase, self._account, self._guid = _Phase.READY, user, self._new_guid(user)
        reply = Reply.ok(
            f"Topic: {account_topic(user)}",
            f"Timeout: {self._config.default_timeout}",
            f"Time: {format_date_time(self._clock())}",
            f"Guid: {self._guid}",
        )
        return [Send(reply.to_bytes()), LoggedIn(user, self._guid)]

    def smqp_PUBLISH(self, verb: str, args: list[str]) -> list[Action]:
        """``PUB MESSAGE <topic> <cmuid>`` opens a body; errors wait for its end."""
        resource = args[0].upper() if args else ""
        if resource not in _PUB_RESOURCES:
            return self._usage("PUBLISH MESSAGE <topic> <cmuid>")
        error, topic = self._publish_target(resource, args[1:])
        framer = MessageFramer(max_header_lines=self._config.max_header_lines,
                               max_message_bytes=self._config.max_message_bytes, keep_data=error is None)
        self._publish = _OpenPublish(framer, topic, args[2] if len(args) == 3 else "", error)
        return []

    def _publish_target(self, resource: str, args: list[str]) -> tuple[Reply | None, str]:
        """(error to send after the body, canonical topic)."""
        if not self.logged_in:
            return Reply.error(UNAUTHORIZED, "LOGIN first"), ""
        if resource == "REPLY":
            return Reply.error(NOT_IMPLEMENTED, "PUBLISH REPLY"), ""
        if len(args) != 2:
            return Reply.error(BAD_REQUEST, "usage: PUBLISH MESSAGE <topic> <cmuid>"), ""
        try:
            return None, canonical(args[0])
        except TopicError as error:
            return topic_error(error), ""

    def _finish_publish(self, publish: _OpenPublish) -> list[Action]:
        """The body has ended: the first error, or the durable Publish and its 200."""
        framer = publish.framer
        error = publish.error or framer.error or check_message_headers(framer.headers)
        if error is not None:
            return self._error(error)
        event = Publish(
            smuid=self._new_smuid(), topic=publish.topic, cmuid=publish.cmuid,
            account=self._account, guid=self._guid, accepted_at=self._now(),
            priority=message_priority(framer.headers), headers=framer.headers, sections=framer.sections,
        )
        reply = Reply.ok(f"{publish.cmuid} {event.smuid}")
        return [Durable(event, publish.topic.encode("utf-8"), reply.to_bytes())]

    def _message_pattern(self, verb: str, args: list[str]) -> tuple[list[Action] | None, str]:
        """Shared SUB/UNSUB parsing: (actions to answer with instead, pattern)."""
        resource = args[0].upper() if args else ""
        if resource in _OTHER_SUB_RESOURCES:
            return self._not_implemented(f"{verb} {resource}"), ""
        if resource not in _MESSAGE or len(args) < 2:
            return self._usage(f"{verb} MESSAGE <topic>"), ""
        if len(args) > 2 and args[2].upper() in ("SINCE", "UNTIL"):
            return self._not_implemented(f"{verb} MESSAGE {args[2].upper()}"), ""
        if len(args) != 2:
            return self._usage(f"{verb} MESSAGE <topic>"), ""
        try:
            return None, parse_pattern(args[1]).text
        except TopicError as error:
            return self._error(topic_error(error)), ""

    def smqp_SUBSCRIBE(self, verb: str, args: list[str]) -> list[Action]:
        """``SUB MESSAGE <topic>|<topic>/*``: durable Subscribe, then ``200 <pattern>``."""
        answer, pattern = self._message_pattern(verb, args)
        if answer is not None:
            return answer
        event = Subscribe(account=self._account, guid=self._guid, pattern=pattern, accepted_at=self._now())
        return [Durable(event, pattern.encode("utf-8"), Reply.ok(pattern).to_bytes())]

    def smqp_UNSUBSCRIBE(self, verb: str, args: list[str]) -> list[Action]:
        """``UNSUB MESSAGE <topic>|<topic>/*``: durable Unsubscribe, then ``200 MESSAGE <pattern>``.

        ``UNSUB MESSAGE *`` (everything) needs the subscription list, which
        the streaming job owns: 501 for now.
        """
        if len(args) == 2 and args[1] in ("*", "/*"):
            return self._not_implemented(f"{verb} MESSAGE *")
        answer, pattern = self._message_pattern(verb, args)
        if answer is not None:
            return answer
        event = Unsubscribe(account=self._account, guid=self._guid, pattern=pattern, accepted_at=self._now())
        return [Durable(event, pattern.encode("utf-8"), Reply.ok(f"MESSAGE {pattern}").to_bytes())]

    def smqp_ACK(self, verb: str, args: list[str]) -> list[Action]:
        """The client's ``310 ACK`` of the pending NOTIFY: durable Ack, then ``310 ACK``."""
        if [a.upper() for a in args] != ["ACK"]:
            return self._usage("310 ACK")
        if self._awaiting_ack is None:
            return self._bad(Reply.error(BAD_REQUEST, "no NOTIFY awaits acknowledgement"))
        smuid, self._awaiting_ack = self._awaiting_ack, None
        event = Ack(account=self._account, guid=self._guid, smuid=smuid, accepted_at=self._now())
        return [Durable(event, self._account.encode("utf-8"), Reply.ack().to_bytes())]

    def smqp_NOOP(self, verb: str, args: list[str]) -> list[Action]:
        """``NOOP``: ``200 OK``, nothing else."""
        return self._usage("NOOP") if args else self._reply(Reply.ok())

    def smqp_QUIT(self, verb: str, args: list[str]) -> list[Action]:
        """``QUIT``: ``200 OK``, then close; subscriptions stay (4.1.14)."""
        if args:
            return self._usage("QUIT")
        self._close()
        return [Send(Reply.ok().to_bytes()), Close()]

    def smqp_not_implemented(self, verb: str, args: list[str]) -> list[Action]:
        """Spec verbs this gateway does not serve yet."""
        return self._not_implemented(verb)
