"""The SMQP server session, sans-I/O: bytes in, actions out.

Like h11, a :class:`Session` never sees a socket, a timer or Kafka.  The
I/O layer feeds it what it reads (:meth:`Session.receive_data`) and carries
out the actions it returns, **in order**:

* :class:`Send` — write the bytes now;
* :class:`Durable` — append ``event.to_bytes()`` to Kafka (acks=all) under
  ``key``, and only then write ``reply``; on failure write a 503 instead.
  Later actions wait for it, so replies keep the order of the commands.  An
  empty ``reply`` (a non-guaranteed PUB) is sent without waiting and
  without any answer, and may be dropped;
* :class:`Control` — append a control event to commands partition 0 and
  write the outcome the registry's fold recorded for it;
* :class:`Consult` — answer from the registry once this session's earlier
  control events are folded (syncing first when it finds nothing);
* :class:`ReadMessages` — load stored messages, then write what ``render``
  makes of them;
* :class:`ConnectNotify` / :class:`Wake` — SET NOTIFY PORT / RESUME;
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
* Topics must exist (CREATE TOPIC) before PUB/SUB; a wildcard SUB lists the
  topics it matches today.  Account topics ``/accounts/<name>`` take PUB
  REPLY only, and only their owner may subscribe to them.
* SET LOGIN PASSWORD reads its answers as continuation lines (the empty line
  after the command is skipped); a virtual topic on a remote server is 501.
"""

from __future__ import annotations

import base64
import enum
import ipaddress
import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Callable, TypeVar, Union

from gateway.replies import (
    BAD_REQUEST,
    CONFLICT,
    ENTITY_TOO_LARGE,
    FORBIDDEN,
    LENGTH_REQUIRED,
    MAX_QUANTITIES_EXCEEDED,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    REDIRECT,
    REQUEST_TIMEOUT,
    RESOURCE_TOO_LARGE,
    SERVICE_UNAVAILABLE,
    TOPIC_TOO_LONG,
    UNAUTHORIZED,
    Reply,
)
from schemas.config import GatewayConfig
from gateway.registry import SUBSCRIBERS_WATCH, TOPIC_WATCH
from gateway.scram import METHOD as SCRAM_METHOD
from gateway.scram import Credentials, ScramError, ScramServer
from gateway.ual import AccessList
from schemas.events import (
    Ack,
    CreateTopic,
    Deliver,
    Headers,
    Publish,
    RemoveTopic,
    RenameTopic,
    Section,
    SetLogin,
    SetTopicDelivery,
    SetTopicKeywords,
    Subscribe,
    Unsubscribe,
    Unwatch,
    Watch,
)
from schemas.queue_params import QueueParameters
from schemas.timefmt import format_date_time, format_micros, parse_date_time, parse_timeout
from schemas.topics import (RootWildcardError, TopicError, account_topic, canonical, is_account_topic, parse_pattern,
                            trash_of, trash_topic)

CRLF = b"\r\n"
SERVER_BYE = b"NOTIFY SERVER BYE\r\n\r\n"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class AuthResult(enum.Enum):
    """What the account store says about a user/password pair."""

    OK = "ok"
    UNKNOWN_ACCOUNT = "unknown account"
    BAD_PASSWORD = "bad password"
    THROTTLED = "too many failed logins"


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


@dataclass(frozen=True)
class Control:
    """Append ``event`` (a control event) to commands partition 0, wait until this gateway's
    registry has folded it, then write the outcome the fold recorded for ``event.request``."""

    event: object


@dataclass(frozen=True)
class Consult:
    """Answer from the registry, in command order, once this connection's earlier
    :class:`Control` events are folded.  ``decide(final)`` returns the actions to carry
    out, or None when what it looked for is missing: the I/O layer then appends a
    ``Sync`` barrier, waits until it is folded (so it has seen every gateway's writes
    acknowledged before) and calls ``decide(True)``, which must answer."""

    decide: Callable[[bool], "list[Action] | None"]


@dataclass(frozen=True)
class ReadMessages:
    """Load the stored messages of ``topics`` (off the event loop), then carry out
    ``render(messages)``, in command order; ``smuids_only``: their SMUIDs are enough (a count).
    ``now`` (microseconds, the session's clock): only the messages live then, neither expired nor
    trashed (spec 2.4); a Trash path reads the dead ones whatever it says; None: every message."""

    topics: tuple[str, ...]
    render: Callable[[list], "list[Action]"]
    smuids_only: bool = False
    now: int | None = None


@dataclass(frozen=True)
class ConnectNotify:
    """SET NOTIFY PORT: connect to the client's listener (``host`` None: the peer's
    address), send notifications there, and reply 200, or 404/408 when it cannot."""

    host: str | None
    port: int


@dataclass(frozen=True)
class Wake:
    """Notification state changed (RESUME): offer the next NOTIFY if one is due."""


Action = Union[Send, Durable, LoggedIn, Close, Control, Consult, ReadMessages, ConnectNotify, Wake]


# --------------------------------------------------------------------------
# Reading lines and bytes


class Need(enum.Enum):
    """What :meth:`LineBuffer.read_line` returns instead of a line."""

    DATA = "need more data"
    LINE_TOO_LONG = "line too long"


_Read = TypeVar("_Read")  # what a parser given to LineBuffer.read_with reads


class LineBuffer:
    """Received bytes not yet consumed, read as lines or counted bytes.

    Holds at most one unfinished line of ``max_line_bytes`` (plus whatever
    arrived in the current chunk): an overlong line is reported once and its
    rest dropped as it arrives, up to its LF.

    The bytes are kept as received with a read position, not cut on every
    line: a chunk that holds whole frames (the usual case) is read by slicing
    it, one copy per line and no moving of what follows.  Only a partial line
    left at the end of a chunk is copied into a growable buffer.
    """

    def __init__(self, max_line_bytes: int):
        self._max = max_line_bytes
        self._data: bytes | bytearray = b""
        self._pos = 0  # start of the bytes not yet consumed
        self._scanned = 0  # bytes before this index already searched for LF
        self._skipping = False  # dropping the rest of an overlong line

    def __len__(self) -> int:
        return len(self._data) - self._pos

    @property
    def pending(self) -> bool:
        """True while a partial line or an overlong line's tail is outstanding."""
        return len(self._data) > self._pos or self._skipping

    def feed(self, data: bytes) -> None:
        if self._pos >= len(self._data):  # all consumed: read the new chunk in place
            self._data, self._pos, self._scanned = bytes(data), 0, 0
            return
        if type(self._data) is bytes:
            self._data = bytearray(memoryview(self._data)[self._pos:])
        else:
            del self._data[:self._pos]
        self._scanned = max(self._scanned - self._pos, 0)
        self._pos = 0
        self._data += data

    def read_line(self) -> bytes | Need:
        """The next line without its CRLF (or bare LF), or why there is none yet."""
        if self._skipping and not self._skip_to_lf():
            return Need.DATA
        data, pos = self._data, self._pos
        end = data.find(b"\n", self._scanned if self._scanned > pos else pos)
        if end < 0:
            return self._await_lf()
        self._pos = self._scanned = end + 1
        if end > pos and data[end - 1] == 13:  # CR
            end -= 1
        if end - pos > self._max:
            return Need.LINE_TOO_LONG
        return bytes(data[pos:end])

    def read_block(self, fits: Callable[[list[bytes]], bool] | None = None) -> list[bytes] | None:
        """The lines up to the next empty line (which is consumed too), read at once, when they
        are all here and plain: CRLF-terminated, no other LF among them, none empty or ``.`` and
        none longer than the limit.  Otherwise None and nothing consumed: :meth:`read_line` them.
        A PUBLISH's or NOTIFY's header lines are one such block, each data header another.
        ``fits``: a further test the lines must pass to be consumed."""
        if self._skipping:
            return None
        data, pos = self._data, self._pos
        if data.startswith(b".\r\n", pos):  # the end of a frame, as a rule
            return None
        end = data.find(b"\r\n\r\n", pos)
        if end <= pos:
            return None
        block = bytes(data[pos:end])
        if block.count(b"\n") != block.count(b"\r\n"):  # a bare LF among them
            return None
        lines = block.split(b"\r\n")
        if b"" in lines or b"." in lines or max(map(len, lines)) > self._max:  # "": an empty line first
            return None
        if fits is not None and not fits(lines):
            return None
        self._pos = self._scanned = end + 4
        return lines

    def read_with(self, prefix: bytes,
                  parse: Callable[[bytes | bytearray, int], tuple[_Read, int] | None]) -> _Read | None:
        """What ``parse`` makes of the unread bytes, if they start with ``prefix``: it is given
        the bytes held and the index of the first unread one, and returns what it read and the
        index past it, or None to leave them.  A whole frame is so read where it lies, without
        being copied first (the client's NOTIFY MESSAGE fast path).  Not while an overlong
        line's tail is being dropped (those bytes are not a frame's)."""
        if self._skipping or not self._data.startswith(prefix, self._pos):
            return None
        read = parse(self._data, self._pos)
        if read is None:
            return None
        result, end = read
        self._pos = end
        if self._scanned < end:  # as if read line by line: no LF before ``end`` left to look for
            self._scanned = end
        return result

    def peek(self, size: int) -> bytes:
        """Up to ``size`` bytes that come next, left unread."""
        return bytes(self._data[self._pos:self._pos + size])

    def _await_lf(self) -> Need:
        """No LF yet: wait, unless the line is already too long to keep."""
        self._scanned = len(self._data)
        if len(self._data) - self._pos <= self._max + 1:  # room for the line and its CR
            return Need.DATA
        self._drop_all()
        self._skipping = True
        return Need.LINE_TOO_LONG

    def _drop_all(self) -> None:
        self._data, self._pos, self._scanned = b"", 0, 0

    def _skip_to_lf(self) -> bool:
        """Drop an overlong line's tail; True once its LF has gone too."""
        end = self._data.find(b"\n", self._pos)
        if end < 0:
            self._drop_all()
            return False
        self._pos = self._scanned = end + 1
        self._skipping = False
        return True

    def take(self, limit: int) -> bytes:
        """Up to ``limit`` raw bytes (data, not lines)."""
        pos = self._pos
        chunk = bytes(self._data[pos:pos + limit])
        self._pos = pos = pos + len(chunk)
        if self._scanned < pos:
            self._scanned = pos
        return chunk


# --------------------------------------------------------------------------
# The framing rule


#: A control character other than TAB, as a byte: in UTF-8 text these bytes stand only for
#: themselves (every byte of a multi-byte sequence is >= 0x80), so searching the raw line
#: finds exactly the characters ``ord(c) < 32 and c != "\t" or c == "\x7f"`` of its text.
CONTROL_BYTES = bytes([*range(0x09), *range(0x0a, 0x20), 0x7f])
_CONTROL_BYTE = re.compile(b"[" + re.escape(CONTROL_BYTES) + b"]")


def parse_header(line: bytes) -> tuple[str, str] | None:
    """``Name: value`` → (name, stripped value); None if it is not one."""
    if _CONTROL_BYTE.search(line) is not None:
        return None  # a stray CR could split the line again on the subscriber's side
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return split_header(text)


def split_header(text: str) -> tuple[str, str] | None:
    """:func:`parse_header` of a line already decoded and free of :data:`CONTROL_BYTES`."""
    name, colon, value = text.partition(":")
    if not colon or not name or name != name.strip() or " " in name or "\t" in name:
        return None
    return name, value.strip()


#: Header names (lower case) that start a data header, also among a message's headers (leniency).
DATA_HEADER_STARTS = frozenset({"content-type", "content-length"})


def data_header_fields(headers: Headers) -> tuple[list[str], bool]:
    """A data header's ``Content-Length`` values and whether it has a ``Content-Type``."""
    lengths, typed = [], False
    for name, value in headers:
        name = name.lower()
        if name == "content-length":
            lengths.append(value)
        elif name == "content-type":
            typed = True
    return lengths, typed


def counted_length(lengths: list[str]) -> int | None:
    """The byte count of a data header's ``Content-Length`` values: one, all ASCII digits."""
    if len(lengths) != 1 or not (lengths[0].isascii() and lengths[0].isdigit()):
        return None
    return int(lengths[0])


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
        # the step that reads what comes next (an unbound method, called with self); None once done
        self._state: Callable[[MessageFramer, LineBuffer], bool] | None = MessageFramer._step_headers
        self._header_lines = 0
        self._total = 0
        self._section_headers: Headers = []
        self._chunks: list[bytes] = []
        self._remaining = 0

    @property
    def done(self) -> bool:
        return self._state is None

    def advance(self, buffer: LineBuffer) -> bool:
        """Consume what ``buffer`` holds; True once the frame's ``.`` line is read."""
        while self._state is not None and self._state(self, buffer):
            pass
        return self._state is None

    # -- errors

    def _keep_error(self, reply: Reply) -> None:
        """An error that leaves the byte count intact: read on, drop the data."""
        if self.error is None:
            self.error = reply
        self._keep = False

    def _lose_sync(self, reply: Reply) -> bool:
        """An error after which only the ``.`` line can tell where the frame ends."""
        self._keep_error(reply)
        self._state = MessageFramer._step_discard
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

    def _take_block(self, lines: list[bytes]) -> bool:
        """Header lines read at once (:meth:`LineBuffer.read_block`), then their empty line: what
        the line-by-line steps below would make of them, the lenient start of a data header
        among the message headers included.  A ``.`` line is never among them."""
        for line in lines:
            header = self._parse_counted(line)
            if header is None:
                return True  # lost sync: the rest, read or not, is discarded up to the "." line
            if self._state is not MessageFramer._step_headers:
                self._section_headers.append(header)
            elif header[0].lower() in DATA_HEADER_STARTS:
                self._section_headers = [header]
                self._state = MessageFramer._step_data_headers
            else:
                self.headers.append(header)
        if self._state is MessageFramer._step_headers:
            self._state = MessageFramer._step_between
        else:
            self._start_data()
        return True

    def _step_headers(self, buffer: LineBuffer) -> bool:
        block = buffer.read_block()
        if block is not None:
            return self._take_block(block)
        while True:  # every message header line in the buffer, without returning to advance()
            line = self._header_line(buffer)
            if line is None:
                return self._state is MessageFramer._step_discard
            if line in (b"", b"."):
                self._state = MessageFramer._step_between if line == b"" else None
                return True
            header = self._parse_counted(line)
            if header is None:
                return True
            if header[0].lower() in DATA_HEADER_STARTS:
                self._section_headers = [header]
                self._state = MessageFramer._step_data_headers
                return True
            self.headers.append(header)

    def _step_between(self, buffer: LineBuffer) -> bool:
        block = buffer.read_block()
        if block is not None:  # a data header: its first line is neither empty nor "."
            self._section_headers = []
            self._state = MessageFramer._step_data_headers
            return self._take_block(block)
        line = self._header_line(buffer)
        if line is None:
            return self._state is MessageFramer._step_discard
        if line == b".":
            self._state = None
        elif line != b"":
            header = self._parse_counted(line)
            if header is not None:
                self._section_headers = [header]
                self._state = MessageFramer._step_data_headers
        return True

    def _step_data_headers(self, buffer: LineBuffer) -> bool:
        block = buffer.read_block()
        if block is not None:
            return self._take_block(block)
        while True:  # every data header line in the buffer, without returning to advance()
            line = self._header_line(buffer)
            if line is None:
                return self._state is MessageFramer._step_discard
            if line == b".":
                self._keep_error(Reply.error(BAD_REQUEST, "data header without data"))
                self._state = None
                return True
            if line == b"":
                self._start_data()
                return True
            header = self._parse_counted(line)
            if header is None:
                return True
            self._section_headers.append(header)

    def _start_data(self) -> None:
        """The data header is complete: validate it and count the data to come."""
        lengths, typed = data_header_fields(self._section_headers)
        if not lengths:
            self._lose_sync(Reply.error(LENGTH_REQUIRED, "Content-Length missing"))
            return
        length = counted_length(lengths)
        if length is None:
            self._lose_sync(Reply.error(BAD_REQUEST, "bad Content-Length"))
            return
        if not typed:
            self._keep_error(Reply.error(BAD_REQUEST, "Content-Type missing"))
        self._remaining = length
        self._total += self._remaining
        if self._total > self._max_bytes:
            self._keep_error(Reply.error(ENTITY_TOO_LARGE, f"more than {self._max_bytes} data bytes"))
        self._chunks = []
        self._state = MessageFramer._step_data

    def _step_data(self, buffer: LineBuffer) -> bool:
        if self._remaining:
            chunk = buffer.take(self._remaining)
            if not chunk:
                return False
            self._remaining -= len(chunk)
            if self._keep:
                self._chunks.append(chunk)
        if not self._remaining:
            self._state = MessageFramer._step_data_end
        return True

    def _step_data_end(self, buffer: LineBuffer) -> bool:
        if len(buffer) < 2:
            return False
        if buffer.take(2) != CRLF:
            return self._lose_sync(Reply.error(BAD_REQUEST, "Content-Length does not match the data"))
        if self._keep:
            chunks = self._chunks
            self.sections.append(Section(self._section_headers, chunks[0] if len(chunks) == 1 else b"".join(chunks)))
        self._chunks = []
        self._state = MessageFramer._step_between
        return True

    def _step_discard(self, buffer: LineBuffer) -> bool:
        line = buffer.read_line()
        if line is Need.DATA:
            return False
        if line == b".":
            self._state = None
        return True


# --------------------------------------------------------------------------
# Rendering message bodies


def render_lines(lines: list[str]) -> bytes:
    return "".join([f"{line}\r\n" for line in lines]).encode("utf-8")


def _section_header_lines(section: Section) -> list[str]:
    """The section's header lines with Content-Length set from its data, so the
    frame can never be miscounted."""
    length, counted, lines = str(len(section.data)), False, []
    for name, value in section.headers:
        if name.lower() == "content-length":
            counted, value = True, length
        lines.append(f"{name}: {value}")
    if not counted:
        lines.append(f"Content-Length: {length}")
    return lines


def render_body(headers: Headers, sections: list[Section]) -> bytes:
    """Header lines, empty line, sections (empty line between), then ``.``.

    The inverse of :class:`MessageFramer`; both PUBLISH and NOTIFY use it.
    """
    return _render_body("".join([f"{n}: {v}\r\n" for n, v in headers]), sections)


def _render_body(head: str, sections: list[Section], tail: str = "") -> bytes:
    """:func:`render_body` after ``head`` (lines already ending in CRLF), then ``tail``:
    the text between the data sections is encoded in one piece each."""
    text = head + "\r\n"
    parts = []
    for index, section in enumerate(sections):
        lines = "".join([f"{line}\r\n" for line in _section_header_lines(section)])
        parts += [(text + "\r\n" + lines + "\r\n" if index else text + lines + "\r\n").encode("utf-8"),
                  section.data]
        text = "\r\n"
    parts.append((text + ".\r\n" + tail).encode("utf-8"))
    return b"".join(parts)


_SERVER_AFFIXED = frozenset({"created", "smuid", "cmuid"})


def render_notify(deliver: Deliver, server_host: str) -> bytes:
    """NOTIFY MESSAGE in spec 4.1.11.1's order: Created, Smuid, Cmuid, then the
    publisher's other attributes as sent, the sections, ``.``, an empty line."""
    created, others = None, []
    for name, value in deliver.headers:
        key = name.lower()
        if key not in _SERVER_AFFIXED:
            others.append(f"{name}: {value}\r\n")
        elif key == "created" and created is None:
            created = value
    if created is None:
        created = format_micros(deliver.accepted_at)
    head = (f"NOTIFY MESSAGE {deliver.topic}\r\nCreated: {created}\r\nSmuid: {server_host}/{deliver.smuid}\r\n"
            f"Cmuid: {deliver.publisher}/{deliver.publisher_guid}/{deliver.cmuid}\r\n")
    return _render_body(head + "".join(others), deliver.sections, "\r\n")


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


def _is_boolean(value: str) -> bool:
    return value.upper() in ("YES", "NO")


#: RECEIPT values (2002 revision) and draft-04's YES/NO, as the mode the job acts on.
_RECEIPT_MODES = MappingProxyType({"NONE": "none", "ONE": "one", "ALL": "all", "NO": "none", "YES": "one"})


#: The 2002 revision: "limited to one line of no more than 128 characters" (a header is one line).
MAX_NAME_CHARS = 128

#: What a bad value breaks, where "bad <attribute> value" would not say.
_HEADER_RULES = MappingProxyType({"name": f"Name is limited to one line of at most {MAX_NAME_CHARS} characters"})

#: Message header attributes whose values the gateway validates.
_HEADER_CHECKS = MappingProxyType({
    "priority": _is_count,
    "pri": _is_count,
    "guarantee": _is_boolean,
    "guar": _is_boolean,
    "timeout": _parses(parse_timeout),
    "created": _parses(parse_date_time),
    "receipt": lambda value: value.upper() in _RECEIPT_MODES,
    "delivery": lambda value: value.upper() in ("ALL", "ONE"),
    "name": lambda value: len(value) <= MAX_NAME_CHARS,
})


def check_message_headers(headers: Headers) -> Reply | None:
    """400 naming the first attribute with a bad value, else None."""
    for name, value in headers:
        check = _HEADER_CHECKS.get(name.lower())
        if check is not None and not check(value):
            return Reply.error(BAD_REQUEST, _HEADER_RULES.get(name.lower(), f"bad {name} value"))
    return None


#: Header attributes (lower case) that decide how a message is handled, for :func:`acted_on`.
_ACTED_ON = frozenset({"guarantee", "guar", "receipt", "priority", "pri", "timeout", "delivery"})


def acted_on(headers: Headers) -> Headers:
    """The attributes among ``headers`` that :func:`guaranteed`, :func:`receipt_mode`,
    :func:`message_priority` and a message's timeout and delivery read, names lower-cased, in
    order: those helpers give the same answers on them, without scanning the others each."""
    return [(name.lower(), value) for name, value in headers if name.lower() in _ACTED_ON]


def _first(headers: Headers, name: str) -> str | None:
    """The value of the first attribute called ``name`` (lower case), None if there is none."""
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def guaranteed(headers: Headers) -> bool:
    """``Guarantee``/``Guar`` (2002 revision): YES unless it says NO.  A non-guaranteed
    message gets no reply to its PUB and no two-phase ACK of its NOTIFY."""
    return all(v.upper() != "NO" for n, v in headers if n.lower() in ("guarantee", "guar"))


def receipt_mode(headers: Headers) -> str:
    """``Receipt`` (already validated): "none" (the default), "one" or "all"; draft-04's YES is ONE."""
    return next((_RECEIPT_MODES[v.upper()] for n, v in headers if n.lower() == "receipt"), "none")


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


def _base64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _unbase64(line: bytes) -> str:
    try:
        return base64.b64decode(line.strip(), validate=True).decode("utf-8")
    except ValueError as error:
        raise ScramError("not base64") from error


def same_address(host: str) -> str:
    """``host`` in one spelling per address (``::ffff:10.0.0.5`` is ``10.0.0.5``); names lower-cased."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower()
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def _valid_account(name: str) -> bool:
    """An account owns the topic ``/accounts/<name>``, so its name must make one."""
    try:
        canonical(account_topic(name))
    except TopicError:
        return False
    return "/" not in name


# --------------------------------------------------------------------------
# Rendering other server frames


def render_topic_notify(topic: str, action: str) -> bytes:
    """NOTIFY TOPIC (4.1.11.2): ``Action: ADDED | RENAME <new> | DELETED | KEYWORDS <keywords>``."""
    return render_lines([f"NOTIFY TOPIC {topic}", f"Action: {action}"]) + CRLF


def render_subscribers_notify(topic: str, count: int) -> bytes:
    """NOTIFY SUBSCRIBERS (4.1.11.3), in the spec example's short form."""
    return render_lines([f"NOTIFY SUB {topic}", f"COUNT: {count}"]) + CRLF


def render_server_timeout_notify(timeout: str) -> bytes:
    """NOTIFY SERVER TIMEOUT (4.1.11.4.1): the server's default message timeout."""
    return render_lines([f"NOTIFY SERVER TIMEOUT {timeout}"]) + CRLF


#: What a message read from a Trash carries beside its own attributes: why it died and when
#: (a date-time).  Not SMQP's own attributes, so ``X-`` ones (spec 4.1.8.1).
TRASH_REASON, TRASHED = "X-Trash-Reason", "X-Trashed"


def _trash_attributes(message) -> tuple[str, Headers]:
    """(``Topic:`` value, header attributes) of a stored message; from a Trash, the Trash
    path and the why and when first (any the publisher sent under those names dropped)."""
    if message.trash_reason is None:
        return message.topic, list(message.headers)
    dead = [(TRASH_REASON, message.trash_reason)]
    if message.trashed_at is not None:
        dead.append((TRASHED, format_date_time(from_micros(message.trashed_at))))
    own = [(n, v) for n, v in message.headers if n.lower() not in (TRASH_REASON.lower(), TRASHED.lower())]
    return trash_topic(message.topic), dead + own


def render_stored(message, server_host: str) -> bytes:
    """One message of a GET MESSAGE reply: ``Topic:``, the NOTIFY attributes, body, ``.``;
    from a Trash, ``X-Trash-Reason`` and ``X-Trashed`` follow ``Cmuid``."""
    topic, headers = _trash_attributes(message)
    notify = render_notify(replace(message.to_deliver(message.publisher), headers=headers), server_host)
    return render_lines([f"Topic: {topic}"]) + notify.split(CRLF, 1)[1][:-len(CRLF)]


def format_ranges(smuids: list[int]) -> str:
    """``[1809, 1810, 1811, 1845]`` → ``1809-1811,1845`` (LIST MESSAGE, 4.1.3.2)."""
    parts: list[str] = []
    ordered = sorted(set(smuids))
    start = 0
    for index in range(1, len(ordered) + 1):
        if index == len(ordered) or ordered[index] != ordered[index - 1] + 1:
            first, last = ordered[start], ordered[index - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = index
    return ",".join(parts)


def parse_ranges(text: str) -> Callable[[int], bool] | None:
    """``*``, ``1865``, ``1845-1890,1905`` → a membership test; None if malformed."""
    if text == "*":
        return lambda smuid: True
    bounds: list[tuple[int, int]] = []
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not (first.isascii() and first.isdigit()) or (dash and not (last.isascii() and last.isdigit())):
            return None
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            return None
        bounds.append((low, high))
    return lambda smuid: any(low <= smuid <= high for low, high in bounds)


def parse_keywords(text: str) -> list[str] | None:
    """``(IBM,STOCKS,BIG BLUE)`` → the keywords; None when not parenthesised."""
    text = text.strip()
    if not (text.startswith("(") and text.endswith(")")):
        return None
    return [k.strip() for k in text[1:-1].split(",") if k.strip()]


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
    reply: bool = False  # PUB REPLY


#: Verb (and abbreviation) → handler suffix: ``smqp_<suffix>``.
VERBS = MappingProxyType({
    "LOGIN": "LOGIN",
    "PASS": "PASS", "PASSWORD": "PASS",
    "COUNT": "COUNT",
    "LIST": "LIST",
    "CREATE": "CREATE",
    "REMOVE": "REMOVE", "REM": "REMOVE",
    "SET": "SET",
    "FIND": "FIND",
    "PUB": "PUBLISH", "PUBLISH": "PUBLISH",
    "SUB": "SUBSCRIBE", "SUBSCRIBE": "SUBSCRIBE",
    "UNSUB": "UNSUBSCRIBE", "UNSUBSCRIBE": "UNSUBSCRIBE",
    "GET": "GET",
    "310": "ACK",
    "NOOP": "NOOP",
    "QUIT": "QUIT",
})

#: Verbs served before login.  PUBLISH answers 401 itself, after its body.
_OPEN_VERBS = frozenset({"LOGIN", "PASS", "PASSWORD", "NOOP", "QUIT", "PUB", "PUBLISH"})

_MESSAGE = frozenset({"MESSAGE", "MESS", "MESSAGES"})
_TOPIC = frozenset({"TOPIC", "TOPICS"})
#: The UAL rights that reach a virtual topic's target's messages, so are checked on the target too.
_THROUGH_LINKS = frozenset({"subscribe", "publish", "reply"})
_SUBSCRIBERS = frozenset({"SUBSCRIBERS", "SUBSCRIBER", "SUB"})
_SERVER = frozenset({"SERVER", "SERV"})
_PUBLISH_RESOURCES = _MESSAGE | {"REPLY"}
_PROFILE = MappingProxyType({"NAME": "name", "EMAIL": "email", "ADDRESS": "address", "PHONE": "phone"})
#: CREATE TOPIC's 405 "topic link bad" for a link to an account topic (4.1.4: the server disallows
#: topics by the path of an account's reply topic; a link would be another way in to one).
_ACCOUNT_LINK = "topic link bad: an account topic is never a link target"
_CREATE_ARGS = re.compile(r"^(?P<topic>\S+)(?:\s+(?P<keywords>\([^)]*\)))?(?:\s+>\s*(?P<target>\S+))?\s*$")


class Session:
    """One client connection's SMQP state machine.

    ``registry`` is read only: the gateway's fold of the control log
    (:class:`gateway.registry.Registry`).  Commands that change it become
    :class:`Control` actions, commands that read it :class:`Consult` actions,
    so answers keep command order and see this session's own writes.
    """

    def __init__(self, config: GatewayConfig, authenticate: Callable[[str, str], AuthResult], *,
                 clock: Callable[[], datetime], new_guid: Callable[[str], str],
                 new_smuid: Callable[[], int], registry, new_request: Callable[[], str] = lambda: "",
                 hash_password: Callable[[str], str] = lambda password: password,
                 on_command: Callable[[bytes], None] = lambda line: None,
                 over_capacity: Callable[[], str | None] = lambda: None, access: AccessList = AccessList(),
                 scram_credentials: Callable[[str], Credentials | AuthResult] = lambda user: AuthResult.UNKNOWN_ACCOUNT,
                 login_outcome: Callable[[str, bool], None] = lambda user, ok: None,
                 new_nonce: Callable[[], str] = lambda: "nonce",
                 new_salt: Callable[[], tuple[bytes, int]] = lambda: (b"salt", 4096),
                 store_credentials: Callable[[Credentials], str] = repr,
                 queue_params: Callable[[str], QueueParameters] = lambda topic: QueueParameters(),
                 queued: Callable[[str], tuple[int, int]] = lambda topic: (0, 0),
                 peer: str = "", tls: bool = False,
                 known_message: Callable[[str], tuple[str, str | None] | None] = lambda cmuid: None):
        self._config = config
        self._peer = peer  # the client's address as the I/O layer saw it ("" when unknown)
        self._tls = tls  # the connection is SMQPS
        self._authenticate = authenticate
        self._clock = clock
        self._new_guid = new_guid
        self._new_smuid = new_smuid
        self._registry = registry
        self._new_request = new_request
        self._hash_password = hash_password
        self._on_command = on_command  # sees every command line first (the gateway's counters)
        self._over_capacity = over_capacity  # None: take logins; "host:port": 311 there; "": 503
        self._access = access  # the administrator's User Access Lists (spec section 6)
        self._scram_credentials = scram_credentials  # SCRAM-SHA-256: the account's stored keys
        self._login_outcome = login_outcome  # SCRAM results, for the throttling of failed logins
        self._new_nonce = new_nonce
        self._new_salt = new_salt  # SET LOGIN PASSWORD SCRAM-SHA-256: (salt, iterations) for the new one
        self._store_credentials = store_credentials  # ... and the stored form of what the client derived
        self._queue_params = queue_params  # a topic's effective [topics."/…"] parameters
        self._queued = queued  # (messages, data bytes) waiting in a topic's queue, as this gateway knows
        self._known_message = known_message  # NOTIFY Cmuid → (topic, Reply-Topic) of a message seen lately
        self._buffer = LineBuffer(config.max_line_bytes)
        self._server_host = config.server_host.lower()  # what a 310 ACK <smuid> names
        self._phase = _Phase.NEW
        self._login_user: str | None = None
        self._account: str | None = None
        self._guid: str | None = None
        self._publish: _OpenPublish | None = None
        self._continuation: Callable[[bytes], list[Action]] | None = None
        # SMUIDs of the guaranteed NOTIFYs awaiting the client's 310 ACK, oldest first (a dict keeps order)
        self._awaiting: dict[int, None] = {}
        self._notify_window = 1  # SET NOTIFY WINDOW: how many may await at once (1: the spec's two-phase commit)
        self._bad_commands = 0
        self._line = ""  # the command line being handled, for arguments with spaces
        self._suspended: set[str] = set()  # SET NOTIFY SUSPEND patterns; "*" is everything
        self._resumed: set[str] = set()  # RESUMEd patterns while "*" is suspended
        self.watches_server_timeout = False
        self._handlers = MappingProxyType({verb: getattr(self, f"smqp_{name}") for verb, name in VERBS.items()})

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
        """The SMUID of the oldest NOTIFY awaiting the client's ``310 ACK``, if any."""
        return next(iter(self._awaiting), None)

    @property
    def awaiting(self) -> tuple[int, ...]:
        """The SMUIDs of every NOTIFY awaiting its ``310 ACK``, oldest first."""
        return tuple(self._awaiting)

    def awaits(self, smuid: int) -> bool:
        """The NOTIFY of ``smuid`` awaits its ``310 ACK`` (it is guaranteed and not acknowledged)."""
        return smuid in self._awaiting

    @property
    def notify_window(self) -> int:
        """How many guaranteed NOTIFYs may await their ``310 ACK`` at once (SET NOTIFY WINDOW)."""
        return self._notify_window

    @property
    def in_frame(self) -> bool:
        """True while an unfinished PUBLISH body or command line is buffered:
        the I/O layer's cue to keep its frame timer running."""
        return not self.closed and (self._publish is not None or self._buffer.pending)

    def greeting(self, available: bool = True) -> bytes:
        """The identification the server sends first (spec 4); no empty line follows.
        ``Not Available`` (2002 status) when the server takes no more connections."""
        status = "Ready" if available else "Not Available"
        return f"SMQP/1.0 {status}. {self._config.server_ident}\r\n".encode("utf-8")

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

    def notify(self, deliver: Deliver, frame: bytes | None = None) -> bytes:
        """Render NOTIFY MESSAGE and await its ``310 ACK``: one at a time (4.1.11.1), or up to
        the window the client asked for with SET NOTIFY WINDOW.  ``frame``: the message's NOTIFY
        as :func:`render_notify` made it for another login (it does not depend on the account),
        so a message fanned out to many logins is rendered once."""
        if not self.logged_in:
            raise SessionMisuse("NOTIFY on a session that is not logged in")
        if len(self._awaiting) >= self._notify_window:
            raise SessionMisuse(f"NOTIFY while {len(self._awaiting)} await their 310 ACK "
                                f"(window {self._notify_window}), the oldest SMUID {self.awaiting_ack}")
        if deliver.account.lower() != self._account.lower():
            raise SessionMisuse(f"delivery for {deliver.account!r} on {self._account!r}'s session")
        if guaranteed(deliver.headers):
            self._awaiting[deliver.smuid] = None
        return frame if frame is not None else render_notify(deliver, self._config.server_host)

    def notify_again(self, deliver: Deliver) -> bytes:
        """A NOTIFY awaiting its ``310 ACK`` once more: the retry timeout passed without it."""
        if deliver.smuid not in self._awaiting:
            raise SessionMisuse(f"NOTIFY again of SMUID {deliver.smuid}, which awaits no 310 ACK")
        return render_notify(deliver, self._config.server_host)

    def notify_abandoned(self, smuid: int) -> None:
        """``smuid``'s NOTIFY no longer awaits a ``310 ACK``: lost with its connection (SET NOTIFY
        PORT: it stays pending), or withdrawn because it died (expired, out of retries)."""
        self._awaiting.pop(smuid, None)

    def channel_ack(self, line: bytes) -> list[Action]:
        """A line read on the SET NOTIFY PORT connection: only ``310 ACK`` is expected there."""
        words = line.decode("utf-8", "replace").split()
        if not words:
            return []
        if words[0] != "310":
            return self._reply(Reply.error(BAD_REQUEST, "only 310 ACK is read on the notification port"))
        return self.smqp_ACK("310", words[1:])

    @property
    def suspends(self) -> bool:
        """Whether SET NOTIFY SUSPEND holds anything back (:meth:`suspended` is worth asking)."""
        return bool(self._suspended)

    def suspended(self, topic: str) -> bool:
        """SET NOTIFY SUSPEND holds NOTIFY MESSAGE for ``topic``."""
        def hit(patterns: set[str]) -> bool:
            return any(p == "*" or parse_pattern(p).matches(topic) for p in patterns)
        return hit(self._suspended) and not ("*" in self._suspended and hit(self._resumed))

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
            self._continuation = None
            return self._bad(Reply.error(BAD_REQUEST, "line too long"))
        if self._continuation is not None and line:  # the empty line after a command is not an answer
            continuation, self._continuation = self._continuation, None
            return continuation(line)
        return self._dispatch(line)

    def _dispatch(self, line: bytes) -> list[Action]:
        """One command line → its ``smqp_<VERB>`` handler."""
        self._on_command(line)
        if not line:  # the empty line the spec's clients send after each command
            self._line = ""
            return []
        try:
            self._line = line.decode("utf-8")
        except UnicodeDecodeError:
            return self._bad(Reply.error(BAD_REQUEST, "command is not UTF-8"))
        if _CONTROL_BYTE.search(line) is not None:
            return self._bad(Reply.error(BAD_REQUEST, "control character in command"))
        words = self._line.split()
        if not words:
            return []
        verb = words[0].upper()
        handler = self._handlers.get(verb)
        if handler is None:
            return self._bad(Reply.error(BAD_REQUEST, "unknown command"))
        if not self.logged_in and verb not in _OPEN_VERBS:
            return self._reply(Reply.error(UNAUTHORIZED, "LOGIN first"))
        return handler(verb, words[1:])

    def _rest(self, words: int) -> str:
        """The command line after its first ``words`` words, spaces inside kept."""
        parts = self._line.strip().split(None, words)
        return parts[words].strip() if len(parts) > words else ""

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

    def _topic(self, text: str) -> tuple[Reply | None, str]:
        """(error, canonical topic) for a concrete topic argument."""
        try:
            return None, canonical(text)
        except TopicError as error:
            return topic_error(error), ""

    def _pattern(self, text: str, *, star_is_all: bool = False) -> tuple[Reply | None, str]:
        """(error, canonical pattern) for a topic or ``/a/*`` argument; ``*`` → ``/*`` if allowed."""
        if star_is_all and text in ("*", "/*"):
            return None, "/*"
        try:
            return None, parse_pattern(text).text
        except TopicError as error:
            return topic_error(error), ""

    def _consult(self, decide: Callable[[], list[Action] | None], missing: str) -> list[Action]:
        """:class:`Consult` whose final answer is 404 ``missing`` when ``decide`` finds nothing."""
        def final(is_final: bool) -> list[Action] | None:
            actions = decide()
            if actions is None and is_final:
                return self._reply(Reply.error(NOT_FOUND, missing))
            return actions
        return [Consult(final)]

    def _control(self, event) -> list[Action]:
        return [Control(event)]

    def _exists(self, pattern: str) -> bool:
        """A topic, or a wildcard's parent topic, that exists for this login."""
        base = pattern[:-2] if pattern.endswith("/*") else pattern
        return base == "" or self._registry.live(base)

    def _may(self, action: str, topic: str) -> bool:
        """The UAL's word on ``action`` for ``topic`` (a wildcard: its parent) for this login.

        A virtual topic is a way to its target's messages, so reading, publishing or replying
        through one also needs the right on the target, judged now: a UAL changed after the link
        was made applies at once (admin rights stay the link's own: it is the link that is
        created, renamed or removed)."""
        base = topic[:-2] if topic.endswith("/*") else topic
        allowed = self._access.allows(self._account, action, base or "/")
        target = self._link_target(base) if action in _THROUGH_LINKS and allowed else None
        if target is None:
            return allowed
        if action == "subscribe":
            return self.may_read(target)
        return not is_account_topic(target) and self._access.allows(self._account, action, target)

    def _link_target(self, path: str) -> str | None:
        """The target of ``path`` when it is a live virtual topic, else None."""
        topic = self._registry.topics.get(path)
        return topic.target if topic is not None and topic.target and not topic.removed else None

    def may_read(self, topic: str) -> bool:
        """Whether this login may be sent, or read, the messages of canonical ``topic`` now:
        its own account topic (never another's, never by the UAL), or a topic whose
        ``subscribe`` right it holds (a virtual topic's: on its target too).

        The gateway asks it before each NOTIFY MESSAGE and NOTIFY TOPIC / SUB (spec 6, 4.1.3:
        what LIST would hide is never told), because the rights at SUBSCRIBE time are not enough:
        the job routes by subscription, a subscription made through a virtual topic is one to its
        target, and the UAL may have changed since."""
        if is_account_topic(topic):
            return topic == account_topic(self._account)
        return self._may("subscribe", topic)

    def _denied(self, action: str, topic: str) -> list[Action]:
        return self._reply(Reply.error(UNAUTHORIZED, f"no {action} permission on {topic}"))

    def _seen(self, paths: list[str]) -> list[str]:
        """LIST/COUNT/FIND never reveal a topic the login may not subscribe to."""
        return [p for p in paths if self._may("subscribe", p)]

    def _message_topics(self, topics: list[str]) -> tuple[str, ...]:
        """The topics whose stored messages LIST, GET and COUNT MESSAGE on ``topics`` read: those
        this login may read (a wildcard covers topics it may not), each virtual one as its target
        (4.1.4: another name for it, so it shows what SUB MESSAGE through it delivers), once."""
        return tuple(dict.fromkeys(self._registry.resolve(t) or t for t in self._seen(topics)))

    def _readable(self, topic: str) -> bool:
        """LIST/GET MESSAGE: the topic's messages exist and this login may read them."""
        return self._own_or_public(topic) and self._registry.readable(topic) and self._may("subscribe", topic)

    def _own_or_public(self, topic: str) -> bool:
        """Account topics are private to their account."""
        return not topic.startswith("/accounts/") or topic == account_topic(self._account)

    def _message_path(self, text: str, wildcard: bool = False) -> tuple[Reply | None, str]:
        """(error, path) for LIST/GET/COUNT MESSAGE: ``<topic>/Trash`` (any case) → the canonical
        Trash path (:func:`trash_topic`), anything else as :meth:`_topic` (:meth:`_pattern`)."""
        try:
            owner = trash_of(text)
        except TopicError as error:
            return topic_error(error), ""
        if owner is not None:
            return None, trash_topic(owner)
        return self._pattern(text) if wildcard else self._topic(text)

    def _messages_readable(self, path: str) -> bool:
        """LIST/GET/COUNT MESSAGE: :meth:`_readable` for a topic; a Trash under the topic's own
        access rules, for as long as the registry knows the topic (a removed topic's Trash
        keeps what it held)."""
        owner = trash_of(path)
        if owner is None:
            return self._readable(path)
        known = self._registry.live(owner) or owner in self._registry.topics
        return known and self._own_or_public(owner) and self._may("subscribe", owner)

    # -- handlers: one per verb, abbreviations share them

    def smqp_LOGIN(self, verb: str, args: list[str]) -> list[Action]:
        """``LOGIN <user> <method>/<version>``: CLEAR (then PASS) or SCRAM-SHA-256; 405 otherwise."""
        if self.logged_in:
            return self._bad(Reply.error(BAD_REQUEST, "already logged in"))
        method, slash, version = args[1].partition("/") if len(args) == 2 else ("", "", "")
        if not (method and slash and version):
            return self._usage("LOGIN <user> <method>/<version>")
        if not _valid_account(args[0]):
            return self._bad(Reply.error(BAD_REQUEST, "account name must be a valid topic level"))
        self._phase, self._login_user = _Phase.NEW, None
        redirect = self._over_capacity()
        if redirect:  # 4.1.1 Redirect Request: this gateway is full, another of the farm is not
            return self._reply(Reply(REDIRECT, ("Redirect request", redirect)))
        if redirect is not None:
            return self._reply(Reply.error(SERVICE_UNAVAILABLE, "no more logins on this server"))
        if method.upper() == SCRAM_METHOD:
            return self._scram_login(args[0])
        if method.upper() != "CLEAR":
            return self._reply(Reply.error(NOT_ALLOWED))
        if self._clear_refused():
            return self._reply(self._clear_refusal())
        self._phase, self._login_user = _Phase.AUTHENTICATING, args[0]
        return self._reply(Reply.ok())

    def _clear_refused(self) -> bool:
        """A CLEAR password would cross the plain listener readable while SMQPS is there to carry it."""
        return not self._tls and bool(self._config.tls_port) and self._config.clear_only_over_tls

    def _clear_refusal(self) -> Reply:
        return Reply.error(NOT_ALLOWED, f"CLEAR passwords only over SMQPS (port {self._config.tls_port}); "
                                        f"use {SCRAM_METHOD}/1.0 on this port")

    def _scram_login(self, user: str) -> list[Action]:
        """SCRAM-SHA-256 through ``+`` continuation lines, each message base64:
        ``200 +`` / client-first / ``+ server-first`` / client-final / the login reply, whose
        ``Verifier:`` attribute is the server-final message (the server's proof)."""
        credentials = self._scram_credentials(user)
        if credentials is AuthResult.UNKNOWN_ACCOUNT:
            return self._reply(Reply.error(NOT_FOUND, "account not found"))
        if credentials is AuthResult.THROTTLED:
            return self._reply(Reply.error(UNAUTHORIZED, "too many failed logins; try again later"))
        server = ScramServer(credentials, self._new_nonce())

        def failed(reason: str) -> list[Action]:
            self._login_outcome(user, False)
            return self._reply(Reply.error(UNAUTHORIZED, reason))

        def client_final(line: bytes) -> list[Action]:
            try:
                verifier = server.final(_unbase64(line))
            except ScramError as error:
                return failed(str(error))
            self._login_outcome(user, True)
            return self._log_in(user.lower(), f"Verifier: {_base64(verifier)}")

        def client_first(line: bytes) -> list[Action]:
            try:
                server_first = server.first(_unbase64(line))
            except ScramError as error:
                return failed(str(error))
            self._continuation = client_final
            return [Send(f"+ {_base64(server_first)}\r\n\r\n".encode())]

        self._continuation = client_first
        return self._reply(Reply.ok("+"))

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
        if result is AuthResult.THROTTLED:
            return self._reply(Reply.error(UNAUTHORIZED, "too many failed logins; try again later"))
        if result is not AuthResult.OK:
            return self._reply(Reply.error(UNAUTHORIZED, "password not correct"))
        return self._log_in(user.lower())

    def _log_in(self, user: str, *first: str) -> list[Action]:
        """The 4.1.1 login reply, in the spec example's attribute order (``first`` lines before)."""
        self._phase, self._account, self._guid = _Phase.READY, user, self._new_guid(user)
        timeout = self._registry.server_timeout
        reply = Reply.ok(
            *first,
            f"Topic: {account_topic(user)}",
            f"Timeout: {timeout}",
            f"Time: {format_date_time(self._clock())}",
            f"Guid: {self._guid}",
        )
        return [Send(reply.to_bytes()), LoggedIn(user, self._guid)]

    # COUNT, LIST, FIND, GET: reads

    def smqp_COUNT(self, verb: str, args: list[str]) -> list[Action]:
        """``COUNT TOPIC|MESSAGE|SUBSCRIBERS <topic>``; a wildcard leaf counts every descendant."""
        resource = args[0].upper() if args else ""
        if len(args) != 2 or resource not in _TOPIC | _MESSAGE | _SUBSCRIBERS:
            return self._usage("COUNT TOPIC|MESSAGE|SUBSCRIBERS <topic>")
        error, pattern = (self._message_path(args[1], wildcard=True) if resource in _MESSAGE
                          else self._pattern(args[1], star_is_all=resource in _TOPIC))
        if error is not None:
            return self._error(error)
        registry = self._registry

        def counted(found: list) -> list[Action]:
            return self._reply(Reply.ok(str(len(found))))

        def decide() -> list[Action] | None:
            if trash_of(pattern) is not None:
                if not self._messages_readable(pattern):
                    return None
                return [ReadMessages((pattern,), counted, smuids_only=True, now=self._now())]
            if not self._exists(pattern) or not self._own_or_public(pattern) or not self._may("subscribe", pattern):
                return None
            if resource in _TOPIC:
                count = len(self._seen(registry.descendants(pattern[:-2] or "/") if pattern.endswith("/*")
                                       else registry.children(pattern)))
            elif resource in _SUBSCRIBERS:
                count = registry.subscribers_in_scope(pattern, shown=lambda topic: self._may("subscribe", topic))
            else:
                topics = registry.matching(pattern) if pattern.endswith("/*") else [pattern]
                return [ReadMessages(self._message_topics(topics), counted, smuids_only=True, now=self._now())]
            return self._reply(Reply.ok(str(count)))
        return self._consult(decide, pattern)

    def smqp_LIST(self, verb: str, args: list[str]) -> list[Action]:
        """``LIST TOPIC <topic>``, ``LIST MESSAGE <topic>``, ``LIST SUBSCRIPTIONS``."""
        resource = args[0].upper() if args else ""
        if resource in ("SUBSCRIPTIONS", "SUBSCRIOTIONS", "SUB") and len(args) == 1:
            return [Consult(lambda final: self._reply(Reply.ok(
                *[s.pattern for s in self._registry.account_subscriptions(self._account)])))]
        if len(args) != 2 or resource not in _TOPIC | _MESSAGE:
            return self._usage("LIST TOPIC <topic> | LIST MESSAGE <topic> | LIST SUBSCRIPTIONS")
        if resource in _TOPIC and args[1] == "/":
            return [Consult(lambda final: self._reply(Reply.ok(
                *self._topic_lines(self._seen(self._registry.children("/"))))))]
        error, topic = self._message_path(args[1]) if resource in _MESSAGE else self._topic(args[1])
        if error is not None:
            return self._error(error)
        registry = self._registry

        def decide() -> list[Action] | None:
            if resource in _TOPIC:
                if not registry.visible(topic) or not self._may("subscribe", topic):
                    return None
                return self._reply(Reply.ok(*self._topic_lines(self._seen(registry.children(topic)))))
            if not self._messages_readable(topic):
                return None
            return [ReadMessages(self._message_topics([topic]), self._render_list, now=self._now())]
        return self._consult(decide, topic)

    def _topic_lines(self, paths: list[str]) -> list[str]:
        """``/path`` or, for a virtual topic, ``/path > /target`` (4.1.3.1)."""
        topics = self._registry.topics
        return [f"{p} > {topics[p].target}" if topics[p].target else p for p in paths]

    def _render_list(self, messages: list) -> list[Action]:
        ranges = format_ranges([m.smuid for m in messages])
        return self._reply(Reply.ok(ranges) if ranges else Reply.ok())

    def smqp_FIND(self, verb: str, args: list[str]) -> list[Action]:
        """``FIND TOPIC <topic>|<topic>/* [keyword[,keyword]…]``: topics with their keywords."""
        if len(args) < 2 or args[0].upper() not in _TOPIC:
            return self._usage("FIND TOPIC <topic> [keyword[,keyword]...]")
        error, pattern = self._pattern(args[1])
        if error is not None:
            return self._error(error)
        keywords = [k.strip() for k in self._rest(3).split(",") if k.strip()]
        registry = self._registry

        def decide() -> list[Action] | None:
            if not self._exists(pattern):
                return None
            scope = [pattern] if pattern.endswith("/*") or not keywords else [pattern, pattern + "/*"]
            found = {t.path: t for s in scope for t in registry.find(s, keywords) if self._may("subscribe", t.path)}
            if not found:
                return None
            return self._reply(Reply.ok(*[
                f"{path} ({','.join(found[path].keywords)})" if found[path].keywords else path
                for path in sorted(found)]))
        return self._consult(decide, f"no topic matches {pattern} {','.join(keywords)}".strip())

    def smqp_GET(self, verb: str, args: list[str]) -> list[Action]:
        """``GET MESSAGE <topic> <smuid|ranges|*>`` (non-destructive), ``GET TOPIC KEYWORDS <topic>``."""
        resource = args[0].upper() if args else ""
        if resource in _TOPIC and len(args) == 3 and args[1].upper() in ("KEYWORDS", "KEYWORD", "KEY"):
            error, topic = self._topic(args[2])
            if error is not None:
                return self._error(error)
            return self._consult(lambda: self._reply(Reply.ok(",".join(self._registry.topics[topic].keywords)))
                                 if self._registry.visible(topic) and self._may("subscribe", topic) else None, topic)
        if resource not in _MESSAGE or len(args) != 3:
            return self._usage("GET MESSAGE <topic> <smuid|ranges|*> | GET TOPIC KEYWORDS <topic>")
        error, topic = self._message_path(args[1])
        if error is not None:
            return self._error(error)
        wanted = parse_ranges(args[2])
        if wanted is None:
            return self._usage("GET MESSAGE <topic> <smuid|first-last[,...]|*>")

        def render(messages: list) -> list[Action]:
            chosen = [m for m in messages if wanted(m.smuid)]
            if not chosen:
                return self._reply(Reply.error(NOT_FOUND, f"no such message in {topic}"))
            body = b"".join(render_stored(m, self._config.server_host) for m in chosen)
            return [Send(b"200 OK\r\n" + body + CRLF)]

        def decide() -> list[Action] | None:
            if not self._messages_readable(topic):
                return None
            return [ReadMessages(self._message_topics([topic]), render, now=self._now())]
        return self._consult(decide, topic)

    # CREATE, REMOVE, SET: control

    def smqp_CREATE(self, verb: str, args: list[str]) -> list[Action]:
        """``CREATE TOPIC <topic> [(keyword,…)] [> <target>]``."""
        match = _CREATE_ARGS.match(self._rest(2)) if args and args[0].upper() == "TOPIC" else None
        if match is None:
            return self._usage("CREATE TOPIC <topic> [(keyword,...)] [> <target-topic>]")
        error, topic = self._topic(match["topic"])
        if error is not None:
            return self._error(error)
        if topic.startswith("/accounts"):
            return self._reply(Reply.error(NOT_ALLOWED, "account topics are created with their accounts"))
        target = match["target"]
        if target is not None:
            if not target.startswith("/"):  # spec 6: reaching remote servers is a right of its own
                if not self._may("remote", topic):
                    return self._denied("remote", topic)
                return self._reply(Reply.error(NOT_IMPLEMENTED, "virtual topics on remote servers"))
            error, target = self._topic(target)
            if error is not None:
                return self._error(error)
            if target == topic:
                return self._reply(Reply.error(CONFLICT, "a topic cannot link to itself"))
            if is_account_topic(target):
                return self._reply(Reply.error(NOT_ALLOWED, _ACCOUNT_LINK))
        keywords = parse_keywords(match["keywords"]) if match["keywords"] else []
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        if target is not None and not self._may_link_to(target):
            return self._reply(Reply.error(UNAUTHORIZED, f"no subscribe or publish permission on {target}"))
        return self._control(CreateTopic(self._new_request(), self._account, topic, self._now(), keywords, target))

    def _may_link_to(self, target: str) -> bool:
        """A local virtual topic is made only by a login that may reach its target itself, as the
        spec asks of a remote one (4.1.4: "permission to access the remote topic"): it holds the
        subscribe or the publish right there.  Each use of the link is judged again (:meth:`_may`)."""
        return self._access.allows(self._account, "subscribe", target) or self._access.allows(
            self._account, "publish", target)

    def smqp_REMOVE(self, verb: str, args: list[str]) -> list[Action]:
        """``REMOVE TOPIC <topic>``: ``200 N messages pending``; pending deliveries still go out."""
        if len(args) != 2 or args[0].upper() not in _TOPIC:
            return self._usage("REMOVE TOPIC <topic>")
        error, topic = self._topic(args[1])
        if error is not None:
            return self._error(error)
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        return self._control(RemoveTopic(self._new_request(), self._account, topic, self._now()))

    def smqp_SET(self, verb: str, args: list[str]) -> list[Action]:
        """``SET TOPIC NAME|KEYWORD``, ``SET LOGIN PASSWORD|NAME|EMAIL|ADDRESS|PHONE``,
        ``SET NOTIFY PORT|SUSPEND|RESUME``."""
        resource = args[0].upper() if args else ""
        attribute = args[1].upper() if len(args) > 1 else ""
        if resource == "TOPIC" and attribute == "NAME":
            return self._set_topic_name(args[2:])
        if resource == "TOPIC" and attribute in ("KEYWORD", "KEYWORDS", "KEY"):
            return self._set_topic_keywords(args[2:])
        if resource == "TOPIC" and attribute in ("DELIVERY", "DEL"):
            return self._set_topic_delivery(args[2:])
        if resource == "LOGIN" and attribute in ("PASSWORD", "PASS"):
            return self._set_password(args[2:])
        if resource == "LOGIN" and attribute in _PROFILE and self._rest(3):
            return self._control(SetLogin(self._new_request(), self._account, _PROFILE[attribute],
                                          self._rest(3), self._now()))
        if resource == "NOTIFY" and attribute == "PORT":
            return self._set_notify_port(args[2:])
        if resource == "NOTIFY" and attribute in ("SUSPEND", "SUS", "RESUME", "RES"):
            return self._suspend_or_resume(attribute.startswith("SUS"), args[2:])
        if resource == "NOTIFY" and attribute == "WINDOW":
            return self._set_notify_window(args[2:])
        return self._usage("SET TOPIC NAME|KEYWORD|DELIVERY ... | SET LOGIN PASSWORD|NAME|EMAIL|ADDRESS|PHONE ... "
                           "| SET NOTIFY PORT|SUSPEND|RESUME|WINDOW ...")

    def _set_topic_name(self, args: list[str]) -> list[Action]:
        if len(args) != 2:
            return self._usage("SET TOPIC NAME <topic> <new-topic>")
        error, topic = self._topic(args[0])
        error = error or self._topic(args[1])[0]
        if error is not None:
            return self._error(error)
        new = canonical(args[1])
        if new == topic:
            return self._reply(Reply.error(CONFLICT, "new-topic and topic are the same"))
        if not (self._may("admin", topic) and self._may("admin", new)):
            return self._denied("admin", topic if not self._may("admin", topic) else new)
        return self._control(RenameTopic(self._new_request(), self._account, topic, new, self._now()))

    def _set_topic_keywords(self, args: list[str]) -> list[Action]:
        keywords = parse_keywords(self._rest(4)) if args else None
        if keywords is None:
            return self._usage("SET TOPIC KEYWORD <topic> (keyword,...)")
        error, topic = self._topic(args[0])
        if error is not None:
            return self._error(error)
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        return self._control(SetTopicKeywords(self._new_request(), self._account, topic, keywords, self._now()))

    def _set_topic_delivery(self, args: list[str]) -> list[Action]:
        """``SET TOPIC DELIVERY <topic> ALL|ONE`` (2002 revision); the administrator's right."""
        if len(args) != 2 or args[1].upper() not in ("ALL", "ONE"):
            return self._usage("SET TOPIC DELIVERY <topic> ALL|ONE")
        error, topic = self._topic(args[0])
        if error is not None:
            return self._error(error)
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        return self._control(SetTopicDelivery(self._new_request(), self._account, topic, args[1].lower(),
                                              self._now()))

    def _delivery_mode(self, topic: str, headers: Headers, params: QueueParameters) -> str:
        """The topic's mode (SET TOPIC DELIVERY, else its configured ``delivery``, from ``params``),
        which a message's ``Delivery`` attribute cannot override; else that attribute; else ALL."""
        mode = self._registry.delivery(topic) or params.delivery
        if mode is None:
            mode = _first(headers, "delivery") or "all"
        return mode.lower()

    def _set_password(self, args: list[str]) -> list[Action]:
        """CLEAR: ``200 + old password``, the old one, ``+ new password``, the new one; or SCRAM-SHA-256."""
        if len(args) != 1 or "/" not in args[0]:
            return self._usage("SET LOGIN PASSWORD <method>/<version>")
        method = args[0].split("/", 1)[0].upper()
        if method == SCRAM_METHOD:
            return self._scram_set_password()
        if method != "CLEAR":
            return self._reply(Reply.error(NOT_ALLOWED))
        if self._clear_refused():
            return self._reply(self._clear_refusal())

        def new_password(old: str, line: bytes) -> list[Action]:
            if self._authenticate(self._account, old) is not AuthResult.OK:
                return self._reply(Reply.error(UNAUTHORIZED, "old password not correct"))
            new = line.decode("utf-8", "replace")
            return self._control(SetLogin(self._new_request(), self._account, "password",
                                          self._hash_password(new), self._now()))

        def old_password(line: bytes) -> list[Action]:
            old = line.decode("utf-8", "replace")
            self._continuation = lambda new_line: new_password(old, new_line)
            return [Send(b"+ new password\r\n\r\n")]

        self._continuation = old_password
        return self._reply(Reply.ok("+ old password"))

    def _scram_set_password(self) -> list[Action]:
        """SCRAM-SHA-256, neither password on the wire: ``200 +`` / client-first /
        ``+ server-first`` / client-final (proves the old password; a failure is a failed login) /
        ``+ server-final,s=<new salt>,i=<iterations>`` / ``h=<masked SaltedPassword>,p=<MAC>``
        (see :mod:`gateway.scram`) / ``200 OK`` once the new hash is folded.  Each message base64."""
        account = self._account
        credentials = self._scram_credentials(account)
        if credentials is AuthResult.UNKNOWN_ACCOUNT:
            return self._reply(Reply.error(NOT_ALLOWED, f"{account} has no SCRAM credentials; use CLEAR/1.0"))
        if credentials is AuthResult.THROTTLED:
            return self._reply(Reply.error(UNAUTHORIZED, "too many failed logins; try again later"))
        server = ScramServer(credentials, self._new_nonce())

        def new_credentials(line: bytes) -> list[Action]:
            try:
                stored = self._store_credentials(server.new_credentials(_unbase64(line)))
            except ScramError as error:
                return self._bad(Reply.error(BAD_REQUEST, f"new password: {error}"))
            return self._control(SetLogin(self._new_request(), account, "password", stored, self._now()))

        def client_final(line: bytes) -> list[Action]:
            try:
                server_final = server.final(_unbase64(line))
            except ScramError as error:
                self._login_outcome(account, False)
                return self._reply(Reply.error(UNAUTHORIZED, f"old password not proved: {error}"))
            self._login_outcome(account, True)
            self._continuation = new_credentials
            offer = server.offer_new_password(server_final, *self._new_salt())
            return [Send(f"+ {_base64(offer)}\r\n\r\n".encode())]

        def client_first(line: bytes) -> list[Action]:
            try:
                server_first = server.first(_unbase64(line))
            except ScramError as error:
                return self._bad(Reply.error(BAD_REQUEST, str(error)))
            self._continuation = client_final
            return [Send(f"+ {_base64(server_first)}\r\n\r\n".encode())]

        self._continuation = client_first
        return self._reply(Reply.ok("+"))

    def _set_notify_port(self, args: list[str]) -> list[Action]:
        if not 1 <= len(args) <= 2 or not (args[0].isascii() and args[0].isdigit()) \
                or not 0 < int(args[0]) < 65536:
            return self._usage("SET NOTIFY PORT <ip-port> [ip-address]")
        host = args[1] if len(args) == 2 else None
        if host is not None and not self._notify_host_allowed(host):
            return self._reply(Reply.error(UNAUTHORIZED, f"notifications go only to this session's own address "
                                                         f"{self._peer or '(unknown)'} or a host the "
                                                         f"configuration allows, not {host}"))
        return [ConnectNotify(host, int(args[0]))]

    def _notify_host_allowed(self, host: str) -> bool:
        """The server connects only back to the client, or to hosts ``notify_hosts`` names: else a
        client could make it probe any host and port of its network (404 refused, 408 no answer)."""
        named = same_address(host)
        return named == same_address(self._peer) or named in {same_address(h) for h in self._config.notify_hosts}

    def _set_notify_window(self, args: list[str]) -> list[Action]:
        """``SET NOTIFY WINDOW <n>`` (our extension): up to ``n`` guaranteed NOTIFYs may await their
        ``310 ACK`` at once, so a subscriber is not held to one round trip and one durable Ack per
        message (4.1.11.1: "Implementations MAY vary").  1 is the spec's behaviour, and what a login
        has until it asks.  Lowering it below what awaits now only holds back the next NOTIFYs."""
        most = self._config.max_notify_window
        if len(args) != 1 or not (args[0].isascii() and args[0].isdigit()):
            return self._usage(f"SET NOTIFY WINDOW <n>, 1 <= n <= {most}")
        window = int(args[0])
        if not 1 <= window <= most:
            return self._bad(Reply.error(BAD_REQUEST, f"window {window} is not between 1 and {most}"))
        self._notify_window = window
        return [Send(Reply.ok().to_bytes()), Wake()]

    def _suspend_or_resume(self, suspend: bool, args: list[str]) -> list[Action]:
        if len(args) > 1:
            return self._usage("SET NOTIFY SUSPEND|RESUME [topic]")
        error, pattern = self._pattern(args[0]) if args and args[0] != "*" else (None, "*")
        if error is not None:
            return self._error(error)
        if suspend:
            if pattern == "*":
                self._suspended, self._resumed = {"*"}, set()
            else:
                self._suspended.add(pattern)
                self._resumed.discard(pattern)
            return self._reply(Reply.ok())
        if pattern == "*":
            self._suspended, self._resumed = set(), set()
        elif pattern in self._suspended:
            self._suspended.discard(pattern)
        elif "*" in self._suspended:
            self._resumed.add(pattern)
        return [Send(Reply.ok().to_bytes()), Wake()]

    # PUBLISH

    def smqp_PUBLISH(self, verb: str, args: list[str]) -> list[Action]:
        """``PUB MESSAGE <topic> <cmuid>`` / ``PUB REPLY <topic> <cmuid>`` open a body;
        errors wait for its end."""
        resource = args[0].upper() if args else ""
        if resource not in _PUBLISH_RESOURCES:
            return self._usage("PUBLISH MESSAGE|REPLY <topic> <cmuid>")
        error, topic = self._publish_target(args[1:])
        framer = MessageFramer(max_header_lines=self._config.max_header_lines,
                               max_message_bytes=self._message_limit(self._queue_params(topic)) if error is None
                               else self._config.max_message_bytes, keep_data=error is None)
        self._publish = _OpenPublish(framer, topic, args[2] if len(args) == 3 else "", error, resource == "REPLY")
        return []

    def _publish_target(self, args: list[str]) -> tuple[Reply | None, str]:
        """(error to send after the body, canonical topic)."""
        if not self.logged_in:
            return Reply.error(UNAUTHORIZED, "LOGIN first"), ""
        if len(args) != 2:
            return Reply.error(BAD_REQUEST, "usage: PUBLISH MESSAGE|REPLY <topic> <cmuid>"), ""
        return self._topic(args[0])

    def _finish_publish(self, publish: _OpenPublish) -> list[Action]:
        """The body has ended: the first error, or the durable Publish and its reply."""
        framer = publish.framer
        error = publish.error or framer.error or check_message_headers(framer.headers)
        silent = not guaranteed(framer.headers)  # no acknowledgement of any kind, errors included
        if error is not None:
            return [] if silent else self._error(error)
        if publish.reply:
            return self._finish_reply(publish)
        topic = publish.topic
        if topic.startswith("/accounts/"):
            return [] if silent else self._reply(
                Reply.error(NOT_ALLOWED, "account topics take replies (PUB REPLY), not messages"))

        def decide() -> list[Action] | None:
            target = self._registry.resolve(topic)
            if target is None:
                return None
            if not (self._may("publish", topic) and self._may("publish", target)):
                return [] if silent else self._denied("publish", topic)
            return self._durable_publish(publish, target, framer.headers)
        if silent:
            return [Consult(lambda final: decide() or [])]
        return self._consult(decide, topic)

    def _finish_reply(self, publish: _OpenPublish) -> list[Action]:
        """PUB REPLY: to the account topic of the publisher named by the ``Cmuid`` attribute,
        once :meth:`_replied_to` has found the message it names."""
        original = next((v for n, v in publish.framer.headers if n.lower() == "cmuid"), "")
        account = original.split("/", 1)[0].lower()
        if not original or not _valid_account(account):
            return self._bad(Reply.error(BAD_REQUEST, "PUB REPLY needs the Cmuid attribute of the message replied to"))
        if not self._registry.is_account(account):
            return self._reply(Reply.error(NOT_FOUND, f"account {account}"))
        headers = [(n, v) for n, v in publish.framer.headers if n.lower() not in ("cmuid", "smuid")]
        headers += [("In-Reply-To", original), ("Reply-Topic", publish.topic)]
        if not self._may("reply", publish.topic):
            return self._denied("reply", publish.topic)
        silent = not guaranteed(publish.framer.headers)

        def send() -> list[Action]:
            return self._durable_publish(publish, account_topic(account), headers)

        def refuse() -> list[Action]:
            return [] if silent else self._reply(Reply.error(
                NOT_FOUND, f"no message {original} on {publish.topic} that this login could receive"))
        return self._replied_to(publish.topic, original, send, refuse)

    def _replied_to(self, topic: str, original: str, send: Callable[[], list[Action]],
                    refuse: Callable[[], list[Action]]) -> list[Action]:
        """``send()`` when the message whose NOTIFY ``Cmuid`` is ``original`` exists and this login
        could have received it, else ``refuse()`` (404, and the reply reaches nobody).

        Spec 4.1.8.2: a client replies "to a published message" it received, naming "the topic the
        message was received from".  Our reading: the message must be one of ``topic`` (a virtual
        topic's: of its target) that this login may read now (:meth:`may_read`, as GET MESSAGE
        decides; it need not have been routed to this very login, since it could subscribe or GET
        it), or a message on this login's own account topic (a reply or receipt it was sent) when
        ``topic`` is that account topic or the reply's ``Reply-Topic``, the way back of the two-way
        exchange the section ends with.  Whether the login was a recipient is not enough: a UAL
        changed since then applies.  The gateway's memory of the messages routed lately answers
        first (the job may not have committed one just NOTIFYed); else the ``messages`` table."""
        mine = account_topic(self._account)

        def accepts(found: str, reply_topic: str | None) -> bool:
            if found == mine:
                return topic in (mine, reply_topic)
            return found == self._registry.resolve(topic) and self.may_read(topic)

        def from_store(messages: list) -> list[Action]:
            if any(f"{m.publisher}/{m.publisher_guid}/{m.cmuid}" == original
                   and accepts(m.topic, _first(m.headers, "reply-topic")) for m in messages):
                return send()
            return refuse()

        def decide(final: bool) -> list[Action] | None:
            known = self._known_message(original)
            if known is not None and accepts(*known):
                return send()
            target = self._registry.resolve(topic)
            if target is None and not final:
                return None  # a topic another gateway created a moment ago: sync, then look again
            topics = (mine,) if target in (None, mine) else (target, mine)
            return [ReadMessages(topics, from_store)]
        return [Consult(decide)]

    def _durable_publish(self, publish: _OpenPublish, topic: str, headers: Headers) -> list[Action]:
        params = self._queue_params(topic)
        refused = self._queue_limits(topic, publish.framer.sections, params)
        acted = acted_on(headers)  # each helper below scans these few instead of every header
        sure = guaranteed(acted)
        if refused is not None:
            return self._reply(refused) if sure else []
        now = self._now()
        event = Publish(
            smuid=self._new_smuid(), topic=topic, cmuid=publish.cmuid,
            account=self._account, guid=self._guid, accepted_at=now,
            priority=message_priority(acted), headers=headers, sections=publish.framer.sections,
            expires_at=self._expiry(acted, now, params), receipt=receipt_mode(acted),
            delivery=self._delivery_mode(topic, acted, params),
        )
        reply = Reply.ok(f"{publish.cmuid} {event.smuid}").to_bytes() if sure else b""
        return [Durable(event, topic.encode("utf-8"), reply)]

    def _message_limit(self, params: QueueParameters) -> int:
        """Data bytes one message to a topic of ``params`` may carry: its ``max_message_bytes``,
        else the gateway's."""
        return params.max_message_bytes or self._config.max_message_bytes

    def _queue_limits(self, topic: str, sections: list[Section], params: QueueParameters) -> Reply | None:
        """Spec section 6's per-queue maximum message size, count and total size.

        A message larger than its topic allows is 413 Entity too large, as for the gateway-wide
        limit.  A full queue is 414 Resource too large: Appendix A has no "queue full", and
        of its codes 414 names the thing that is too large here, the topic's queue (413 is the
        message itself); it is a 4yz code, a transient refusal the publisher may repeat
        unchanged once subscribers have drained the queue (503 would say the server is down,
        and 510 is a permanent 5yz code outside Appendix A).  The queue is what this gateway's
        delivery book holds pending for the topic, so publishes accepted within the job's
        routing delay (about one micro-batch) are not counted yet and may overshoot it.
        """
        size = sum([len(section.data) for section in sections])
        limit = self._message_limit(params)
        if size > limit:
            return Reply.error(ENTITY_TOO_LARGE, f"more than {limit} data bytes")
        messages, queued_bytes = self._queued(topic)
        if params.max_messages and messages >= params.max_messages:
            return Reply.error(RESOURCE_TOO_LARGE, f"queue of {topic} full: {messages} messages waiting")
        if params.max_queue_bytes and queued_bytes + size > params.max_queue_bytes:
            return Reply.error(RESOURCE_TOO_LARGE, f"queue of {topic} full: {queued_bytes} of "
                                                   f"{params.max_queue_bytes} bytes waiting")
        return None

    def _expiry(self, headers: Headers, now: int, params: QueueParameters) -> int | None:
        """The message's ``Timeout`` (already validated), else the topic's default (``params``),
        else the server's, from ``now``."""
        text = _first(headers, "timeout") or params.timeout or self._registry.server_timeout
        timeout = parse_timeout(text)  # cached: most publishes read their topic's default
        return None if timeout is None else now + int(timeout.total_seconds() * 1_000_000)

    # SUBSCRIBE, UNSUBSCRIBE

    def smqp_SUBSCRIBE(self, verb: str, args: list[str]) -> list[Action]:
        """``SUB MESSAGE <topic> [SINCE d] [UNTIL d]``, ``SUB TOPIC|SUBSCRIBER <topic>``,
        ``SUB SERVER TIMEOUT``."""
        resource = args[0].upper() if args else ""
        if resource in _SERVER:
            if [a.upper() for a in args[1:]] != ["TIMEOUT"]:
                return self._usage("SUBSCRIBE SERVER TIMEOUT")
            self.watches_server_timeout = True
            return [Send(Reply.ok().to_bytes()),
                    Send(render_server_timeout_notify(self._registry.server_timeout))]
        if resource in _MESSAGE:
            return self._subscribe_message(args[1:])
        if resource in _TOPIC | _SUBSCRIBERS and len(args) == 2:
            error, pattern = self._pattern(args[1])
            if error is not None:
                return self._error(error)
            watch = Watch(self._new_request(), self._account,
                          TOPIC_WATCH if resource in _TOPIC else SUBSCRIBERS_WATCH, pattern, self._now())
            if not self._own_or_public(pattern):  # as SUB MESSAGE: nobody watches another's account topic
                return self._reply(Reply.error(FORBIDDEN, "another account's topic"))
            if not self._may("subscribe", pattern):
                return self._denied("subscribe", pattern)
            return self._consult(lambda: self._control(watch) if self._exists(pattern) else None, pattern)
        return self._usage("SUBSCRIBE MESSAGE|TOPIC|SUBSCRIBER <topic> | SUBSCRIBE SERVER TIMEOUT")

    def _subscribe_message(self, args: list[str]) -> list[Action]:
        if not args:
            return self._usage("SUBSCRIBE MESSAGE <topic> [SINCE <date-time>] [UNTIL <date-time>]")
        error, pattern = self._pattern(args[0])
        if error is not None:
            return self._error(error)
        bounds: dict[str, int] = {}
        rest = args[1:]
        while rest:
            keyword = rest[0].upper()
            if keyword not in ("SINCE", "UNTIL") or keyword in bounds or len(rest) < 2:
                return self._usage("SUBSCRIBE MESSAGE <topic> [SINCE <date-time>] [UNTIL <date-time>]")
            try:
                bounds[keyword] = to_micros(parse_date_time(rest[1]))
            except ValueError:
                return self._bad(Reply.error(BAD_REQUEST, f"bad {keyword} date-time"))
            rest = rest[2:]
        since, until = bounds.get("SINCE"), bounds.get("UNTIL")
        if since is not None and until is not None and until < since:
            return self._reply(Reply.error(CONFLICT, "UNTIL time precedes SINCE time"))

        request, now = self._new_request(), self._now()

        def decide() -> list[Action] | None:
            if not self._own_or_public(pattern):
                return self._reply(Reply.error(FORBIDDEN, "another account's topic"))
            if not self._may("subscribe", pattern):
                return self._denied("subscribe", pattern)
            target = pattern if pattern.endswith("/*") else self._registry.resolve(pattern)
            if target is None or not self._exists(pattern):
                return None
            refused = self._subscription_limits(target)
            if refused is not None:
                return self._reply(refused)
            return self._control(Subscribe(self._account, self._guid, target, now, since, until, request))
        return self._consult(decide, pattern)

    def _subscription_limits(self, pattern: str) -> Reply | None:
        """5.1 (7) and (8): topics one request may reach, subscriptions per account: both 414
        (4.1.9.1 "cannot subscribe to any more"); 510 is for ``SUB MESSAGE /*`` alone."""
        reached = len(self._registry.matching(pattern)) if pattern.endswith("/*") else 1
        if reached > self._config.max_topics_per_subscribe:
            return Reply.error(RESOURCE_TOO_LARGE, f"{pattern} reaches {reached} topics, "
                                                   f"more than {self._config.max_topics_per_subscribe}")
        mine = self._registry.subscriptions.get(self._account, {})
        if pattern not in mine and len(mine) >= self._config.max_subscriptions:
            return Reply.error(RESOURCE_TOO_LARGE, f"cannot subscribe to any more: {len(mine)} subscriptions "
                                                   f"already, the most one account may have")
        return None

    def smqp_UNSUBSCRIBE(self, verb: str, args: list[str]) -> list[Action]:
        """``UNSUB MESSAGE|TOPIC|SUBSCRIBER <topic>|<topic>/*|*``, ``UNSUB SERVER TIMEOUT``, ``UNSUB *``."""
        resource = args[0].upper() if args else ""
        if resource == "*" and len(args) == 1:
            return self._control(Unsubscribe(self._account, self._guid, "/*", self._now(), self._new_request(),
                                             everything=True))
        if resource in _SERVER and [a.upper() for a in args[1:]] == ["TIMEOUT"]:
            self.watches_server_timeout = False
            return self._reply(Reply.ok("SERVER TIMEOUT"))
        if len(args) != 2 or resource not in _MESSAGE | _TOPIC | _SUBSCRIBERS:
            return self._usage("UNSUBSCRIBE MESSAGE|TOPIC|SUBSCRIBER <topic>|<topic>/*|* | UNSUBSCRIBE *")
        error, pattern = self._pattern(args[1], star_is_all=True)
        if error is not None:
            return self._error(error)
        registry, account, request, now = self._registry, self._account, self._new_request(), self._now()
        if resource in _MESSAGE:
            def decide() -> list[Action] | None:
                if not registry.subscribed(account, pattern):
                    return None
                return self._control(Unsubscribe(account, self._guid, pattern, now, request))
        else:
            kind = TOPIC_WATCH if resource in _TOPIC else SUBSCRIBERS_WATCH

            def decide() -> list[Action] | None:
                if not registry.watching(account, kind, pattern):
                    return None
                return self._control(Unwatch(request, account, kind, pattern, now))
        return self._consult(decide, f"not subscribed to {pattern}")

    # the rest

    def smqp_ACK(self, verb: str, args: list[str]) -> list[Action]:
        """The client's ``310 ACK`` of a NOTIFY awaiting it: durable Ack, then ``310 ACK``.

        ``310 ACK`` (the spec's form) acknowledges the oldest NOTIFY awaiting one: the only one
        at window 1.  ``310 ACK <smuid>`` (our extension, any window) names the NOTIFY by its
        ``Smuid:`` value verbatim and is answered ``310 ACK <smuid>``; one naming a NOTIFY that
        awaits no ACK (never sent, already acknowledged, withdrawn) gets 404 and acknowledges nothing."""
        if not args or args[0].upper() != "ACK" or len(args) > 2:
            return self._usage("310 ACK [smuid]")
        if len(args) == 2:
            smuid, reply = self._named_smuid(args[1]), Reply.ack(args[1])
            if smuid not in self._awaiting:
                return self._reply(Reply.error(NOT_FOUND, f"no NOTIFY of Smuid {args[1]} awaits acknowledgement"))
        elif self._awaiting:
            smuid, reply = next(iter(self._awaiting)), Reply.ack()
        else:
            return self._bad(Reply.error(BAD_REQUEST, "no NOTIFY awaits acknowledgement"))
        del self._awaiting[smuid]
        event = Ack(account=self._account, guid=self._guid, smuid=smuid, accepted_at=self._now())
        return [Durable(event, self._account.encode("utf-8"), reply.to_bytes())]

    def _named_smuid(self, text: str) -> int | None:
        """The number of a ``Smuid:`` value as this server renders it (``<server_host>/<number>``)."""
        host, _, number = text.rpartition("/")
        if host.lower() != self._server_host or not (number.isascii() and number.isdigit()):
            return None
        return int(number)

    def smqp_NOOP(self, verb: str, args: list[str]) -> list[Action]:
        """``NOOP``: ``200 OK``, nothing else."""
        return self._usage("NOOP") if args else self._reply(Reply.ok())

    def smqp_QUIT(self, verb: str, args: list[str]) -> list[Action]:
        """``QUIT``: ``200 OK``, then close; subscriptions stay (4.1.14)."""
        if args:
            return self._usage("QUIT")
        self._close()
        return [Send(Reply.ok().to_bytes()), Close()]
