"""Bytes to frames: lines, headers and PUBLISH / NOTIFY MESSAGE bodies.

The one framing rule of SMQP, shared by the server's session and the reference client
(:mod:`gateway.client`), so that both sides read a frame the same way.
"""

from __future__ import annotations

import enum
import re
from typing import Callable, TypeVar

from gateway.replies import BAD_REQUEST, ENTITY_TOO_LARGE, LENGTH_REQUIRED, Reply
from schemas.events import Headers, Section


CRLF = b"\r\n"


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
CONTROL_BYTE = re.compile(b"[" + re.escape(CONTROL_BYTES) + b"]")


def parse_header(line: bytes) -> tuple[str, str] | None:
    """``Name: value`` → (name, stripped value); None if it is not one."""
    if CONTROL_BYTE.search(line) is not None:
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
