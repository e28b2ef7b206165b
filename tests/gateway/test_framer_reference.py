"""MessageFramer against the framer it replaced, kept below verbatim (with the line reader it
read from, :class:`ReferenceLineBuffer`): random PUBLISH/NOTIFY bodies, well-formed and
broken, fed whole, byte by byte and in random pieces, must give the same headers, sections,
error, end and leftover bytes.  The framer now takes a block of header lines at once
(:meth:`LineBuffer.read_block`) where the reference read them one by one."""

from __future__ import annotations

import enum
import random
from types import MappingProxyType

import pytest

from gateway.protocol.framing import CRLF, LineBuffer, MessageFramer, Need, parse_header
from gateway.replies import BAD_REQUEST, ENTITY_TOO_LARGE, LENGTH_REQUIRED, Reply
from schemas.events import Headers, Section
from tests.gateway.test_fast_paths import ReferenceLineBuffer

_DATA_HEADER_STARTS = frozenset({"content-type", "content-length"})


class _State(enum.Enum):
    HEADERS = "message header lines"
    BETWEEN = "between data sections"
    DATA_HEADERS = "data header lines"
    DATA = "data bytes"
    DATA_END = "CRLF after data"
    DISCARD = "discarding up to the '.' line"
    DONE = "done"


class ReferenceFramer:
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
# Random bodies


def _random_body(rng: random.Random) -> bytes:
    """Header lines, data sections and a "." line, with the mistakes a client can make."""
    eol = lambda: rng.choice([b"\r\n"] * 8 + [b"\n"])  # noqa: E731
    parts = []
    for _ in range(rng.randint(0, 4)):
        parts.append(rng.choice([b"Priority: 3", b"X-Trace:  abc ", b"Guarantee: NO", b"bad header", b"A b: c",
                                 b"Content-Type: text/plain", b"Name: \x01", b"X" * rng.randint(5, 40) + b": v",
                                 "Sujet: caf\u00e9".encode()]) + eol())
    if rng.random() < 0.9:
        parts.append(eol())
    for index in range(rng.randint(0, 3)):
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.3:
            data += b"\r\n.\r\n" + data  # smuggling attempt: counted, never a "." line
        if index and rng.random() < 0.5:
            parts.append(eol())
        headers = [b"Content-Type: text/plain"] if rng.random() < 0.9 else []
        length = len(data) + rng.choice([0] * 8 + [1, -1])
        headers.append(rng.choice([b"Content-Length: %d" % length] * 8 + [b"Content-Length: x",
                                                                          b"Content-Length:%d" % length, b""]))
        if rng.random() < 0.2:
            headers.append(b"X-Part: %d" % index)
        rng.shuffle(headers)
        parts += [h + eol() for h in headers if h]
        parts.append(eol())
        parts.append(data + rng.choice([b"\r\n"] * 9 + [b"\n"]))
    if rng.random() < 0.1:
        parts.append(b"Content-Type: text/plain\r\n")  # a data header without data
    parts.append(b".\r\n" if rng.random() < 0.95 else b".\n")
    parts.append(rng.choice([b"", b"NEXT COMMAND\r\n", b"\r\n"]))
    return b"".join(parts)


def _split(data: bytes, rng: random.Random, way: int) -> list[bytes]:
    if way == 0 or len(data) < 2:
        return [data]
    if way == 1:
        return [data[i:i + 1] for i in range(len(data))]
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(1, 10))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def _frame(buffer, framer, chunks: list[bytes]):
    done = False
    for chunk in chunks:
        buffer.feed(chunk)
        if not done:
            done = framer.advance(buffer)
    rest = []
    while (line := buffer.read_line()) is not Need.DATA:
        rest.append(line)
    return (done, framer.headers, [(s.headers, s.data) for s in framer.sections],
            framer.error and framer.error.to_bytes(), rest)


@pytest.mark.parametrize("seed", range(400))
def test_the_framer_reads_what_the_line_by_line_framer_read(seed):
    rng = random.Random(seed)
    body = _random_body(rng)
    limits = dict(max_header_lines=rng.choice([3, 256]), max_message_bytes=rng.choice([20, 1 << 20]),
                  keep_data=rng.random() < 0.9)
    max_line = rng.choice([16, 8192])
    for way in range(3):
        chunks = _split(body, rng, way)
        expected = _frame(ReferenceLineBuffer(max_line), ReferenceFramer(**limits), chunks)
        assert _frame(LineBuffer(max_line), MessageFramer(**limits), chunks) == expected, (body, way)


def test_a_block_of_headers_is_read_at_once_and_the_same_as_line_by_line():
    body = b"Priority: 3\r\nX-Trace: abc\r\n\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello\r\n.\r\n"
    buffer = LineBuffer(100)
    buffer.feed(body)
    assert buffer.read_block() == [b"Priority: 3", b"X-Trace: abc"]
    assert buffer.read_block() == [b"Content-Type: text/plain", b"Content-Length: 5"]
    assert buffer.read_block() is None  # data next: "hello" then ".": not a block of header lines
    assert buffer.take(5) == b"hello"


@pytest.mark.parametrize("data", [
    b"\r\n\r\n",  # an empty first line
    b"\r\nA: b\r\n\r\n",  # an empty line between sections, then a data header
    b"A: b\nC: d\r\n\r\n",  # a bare LF among the lines
    b"A: b\r\n.\r\nC: d\r\n\r\n",  # a "." line ends the frame: read line by line
    b"A: " + b"x" * 20 + b"\r\n\r\n",  # too long for the limit
    b"A: b\r\nC: d\r\n",  # no empty line yet
])
def test_read_block_leaves_anything_unusual_to_read_line(data):
    buffer = LineBuffer(16)
    buffer.feed(data)
    assert buffer.read_block() is None
    assert len(buffer) == len(data)
