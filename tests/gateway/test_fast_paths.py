"""The per-message fast paths write and read exactly what the straightforward code they
replaced did.  Each reference below is that code, kept here verbatim as the specification:

* :class:`ReferenceLineBuffer` — the line reader that cut a bytearray per line;
* :func:`reference_parse_header` — the header check that tested every character;
* :func:`reference_render_notify` — NOTIFY MESSAGE built line by line, with ``Created``
  formatted from a datetime;
* :func:`reference_canonical` — topic validation level by level.

Inputs are fed whole, byte by byte and in random pieces, as h11's tests do.
"""

from __future__ import annotations

import enum
import random
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol.framing import CRLF, LineBuffer, MessageFramer, Need, parse_header
from gateway.protocol.rendering import render_body, render_lines, render_notify
from schemas.events import Deliver, Section
from schemas.timefmt import format_date_time, format_micros
from schemas.topics import MAX_LEVEL_LENGTH, TopicError, canonical

# --------------------------------------------------------------------------
# References


class ReferenceLineBuffer:
    def __init__(self, max_line_bytes: int):
        self._max = max_line_bytes
        self._data = bytearray()
        self._scanned = 0
        self._skipping = False

    def __len__(self) -> int:
        return len(self._data)

    @property
    def pending(self) -> bool:
        return bool(self._data) or self._skipping

    def feed(self, data: bytes) -> None:
        self._data += data

    def read_line(self):
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

    def _await_lf(self):
        self._scanned = len(self._data)
        if len(self._data) <= self._max + 1:
            return Need.DATA
        self._data.clear()
        self._scanned = 0
        self._skipping = True
        return Need.LINE_TOO_LONG

    def _skip_to_lf(self) -> bool:
        end = self._data.find(b"\n")
        if end < 0:
            self._data.clear()
            return False
        del self._data[: end + 1]
        self._skipping = False
        return True

    def take(self, limit: int) -> bytes:
        chunk = bytes(self._data[:limit])
        del self._data[:limit]
        self._scanned = 0
        return chunk


def reference_parse_header(line: bytes):
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(c) < 32 and c != "\t" or c == "\x7f" for c in text):
        return None
    name, colon, value = text.partition(":")
    if not colon or not name or name != name.strip() or " " in name or "\t" in name:
        return None
    return name, value.strip()


def _reference_section_header_lines(section: Section) -> list[str]:
    length = str(len(section.data))
    lines = [f"{n}: {length if n.lower() == 'content-length' else v}" for n, v in section.headers]
    if not any(n.lower() == "content-length" for n, _ in section.headers):
        lines.append(f"Content-Length: {length}")
    return lines


def reference_render_body(headers, sections) -> bytes:
    parts = [render_lines([f"{n}: {v}" for n, v in headers]), CRLF]
    for index, section in enumerate(sections):
        if index:
            parts.append(CRLF)
        parts += [render_lines(_reference_section_header_lines(section)), CRLF, section.data, CRLF]
    parts.append(b".\r\n")
    return b"".join(parts)


def reference_render_notify(deliver: Deliver, server_host: str) -> bytes:
    created = next((v for n, v in deliver.headers if n.lower() == "created"), None)
    if created is None:
        moment = datetime.fromtimestamp(deliver.accepted_at // 1_000_000, timezone.utc).replace(
            microsecond=deliver.accepted_at % 1_000_000)
        created = format_date_time(moment)
    head = [
        f"NOTIFY MESSAGE {deliver.topic}",
        f"Created: {created}",
        f"Smuid: {server_host}/{deliver.smuid}",
        f"Cmuid: {deliver.publisher}/{deliver.publisher_guid}/{deliver.cmuid}",
    ]
    others = [(n, v) for n, v in deliver.headers if n.lower() not in ("created", "smuid", "cmuid")]
    return render_lines(head) + reference_render_body(others, deliver.sections) + CRLF


def reference_canonical(topic: str) -> str:
    import re
    level_re = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
    if not topic.startswith("/"):
        raise TopicError(topic, "must start with '/'")
    levels = topic[1:].split("/")
    if topic == "/" or any(level == "" for level in levels):
        raise TopicError(topic, "empty level")
    for level in levels:
        if len(level) > MAX_LEVEL_LENGTH:
            raise TopicError(topic, f"level {level!r} longer than {MAX_LEVEL_LENGTH}", too_long=True)
        if not level_re.match(level):
            raise TopicError(topic, f"level {level!r} must be alphanumeric and not start with a digit")
        if level.lower() == "trash":
            raise TopicError(topic, "'Trash' is reserved")
    return topic.lower()


# --------------------------------------------------------------------------
# LineBuffer


class Op(enum.Enum):
    LINE = "line"
    TAKE = "take"


def _drive(buffer, chunks: list[bytes], ops: list[tuple[Op, int]]) -> list:
    """Feed ``chunks`` one by one; after each, run ops until one needs more data."""
    out, queue = [], list(ops)
    for chunk in chunks:
        buffer.feed(chunk)
        while queue:
            op, limit = queue[0]
            if op is Op.LINE:
                result = buffer.read_line()
                out.append(result)
                if result is Need.DATA:
                    break
            else:
                result = buffer.take(limit)
                out.append(result)
                if not result:
                    break
            queue.pop(0)
        out.append((len(buffer), buffer.pending))
    return out


def _split(data: bytes, rng: random.Random) -> list[bytes]:
    mode = rng.randrange(3)
    if mode == 0 or len(data) < 2:
        return [data, b""] if data else [data]
    if mode == 1:
        return [data[i:i + 1] for i in range(len(data))]
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(1, 8))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


_pieces = st.lists(st.sampled_from([b"a", b"bc", b"\r", b"\n", b"\r\n", b".", b"xyzxyzxyz", b"\x00", b"\xff"]),
                   max_size=40)


@settings(max_examples=400, deadline=None)
@given(_pieces, st.lists(st.tuples(st.sampled_from(list(Op)), st.integers(0, 6)), max_size=30),
       st.integers(1, 8), st.randoms(use_true_random=False))
def test_line_buffer_reads_what_the_bytearray_reader_read(pieces, ops, limit, rng):
    data = b"".join(pieces)
    chunks = _split(data, rng)
    assert _drive(LineBuffer(limit), chunks, ops) == _drive(ReferenceLineBuffer(limit), chunks, ops)


@pytest.mark.parametrize("data, expected", [
    (b"one\r\ntwo\nthree\r\n", [b"one", b"two", b"three"]),  # bare LF accepted
    (b"\r\n\n", [b"", b""]),
    (b"a\rb\r\n", [b"a\rb"]),  # a CR inside a line stays (parse_header refuses it)
])
def test_lines_whole_and_byte_by_byte(data, expected):
    for chunks in ([data], [data[i:i + 1] for i in range(len(data))]):
        buffer, lines = LineBuffer(100), []
        for chunk in chunks:
            buffer.feed(chunk)
            while (line := buffer.read_line()) is not Need.DATA:
                lines.append(line)
        assert lines == expected and not buffer.pending


def test_an_overlong_line_is_reported_once_and_its_tail_dropped_across_chunks():
    buffer = LineBuffer(4)
    buffer.feed(b"abcdefgh")
    assert buffer.read_line() is Need.LINE_TOO_LONG
    buffer.feed(b"ijk")
    assert buffer.read_line() is Need.DATA
    buffer.feed(b"lm\r\nok\r\n")
    assert buffer.read_line() == b"ok"
    assert not buffer.pending


def test_a_line_of_exactly_the_limit_passes_one_more_byte_does_not():
    buffer = LineBuffer(4)
    buffer.feed(b"abcd\r\nabcde\r\nx\n")
    assert [buffer.read_line() for _ in range(3)] == [b"abcd", Need.LINE_TOO_LONG, b"x"]


def test_a_partial_line_left_in_one_chunk_is_completed_by_the_next():
    buffer = LineBuffer(100)
    buffer.feed(b"first\r\nsec")
    assert buffer.read_line() == b"first"
    assert buffer.read_line() is Need.DATA
    buffer.feed(b"ond\r\n")
    buffer.feed(b"thi")
    buffer.feed(b"rd\r\n")
    assert [buffer.read_line(), buffer.read_line(), buffer.read_line()] == [b"second", b"third", Need.DATA]


# --------------------------------------------------------------------------
# parse_header


@pytest.mark.parametrize("line", [
    b"Name: value", b"Name:value", b"Name:   padded  ", b"Name:", b"X-A: b: c", b"Name : v", b" Name: v",
    b"Na me: v", b"Na\tme: v", b"Name: tab\tinside", b"Name: cr\r inside", b"Name: nul\x00", b"Name: del\x7f",
    b"Name: \x1f", b"no colon", b"", b":", b": v", "Nåme: välue".encode(), b"Name: \xff\xfe",
    "Name: \u2028".encode(), "Name\u00a0: v".encode(), "\u2003Name: v".encode(), "Name: \x85".encode(),
])
def test_parse_header_agrees_with_the_character_by_character_check(line):
    assert parse_header(line) == reference_parse_header(line)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=30) | st.text(max_size=20).map(lambda t: t.encode("utf-8")))
def test_parse_header_agrees_on_any_bytes(line):
    assert parse_header(line) == reference_parse_header(line)


# --------------------------------------------------------------------------
# NOTIFY MESSAGE rendering and the Created date-time


def _deliver(headers, sections, accepted_at=998577912460000) -> Deliver:
    return Deliver("bob", 2001083408341156, "/stocks/quotes/ibm", "C1", "ann", "ann0456", accepted_at, 0,
                   headers, sections)


TEXT = Section([("Content-Type", "text/plain"), ("Content-Length", "5")], b"hello")
BINARY = Section([("Content-Type", "application/octet-stream")], b"\r\n.\r\n\x00\xff")  # no Content-Length


@pytest.mark.parametrize("deliver", [
    _deliver([], []),
    _deliver([], [TEXT]),
    _deliver([("Priority", "3"), ("X-Trace", "abc")], [TEXT, BINARY, Section([("Content-Length", "9")], b"")]),
    _deliver([("Created", "D20010823T14451246Z"), ("created", "second"), ("Smuid", "x/1"), ("CMUID", "y")], [TEXT]),
    _deliver([("Sujet", "café ☕")], [TEXT]),
    _deliver([], [TEXT], accepted_at=0),
    _deliver([], [TEXT], accepted_at=-1),  # before the epoch: floor division, as from_micros
    _deliver([], [TEXT], accepted_at=1_700_000_000_999_999),
])
def test_render_notify_equals_the_line_by_line_rendering(deliver):
    assert render_notify(deliver, "www.host.com") == reference_render_notify(deliver, "www.host.com")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.text("abcCDSmuidreatX-", min_size=1, max_size=8), st.text(max_size=8)), max_size=5),
       st.lists(st.builds(Section, st.lists(st.tuples(st.sampled_from(["Content-Type", "content-length", "X"]),
                                                      st.text(max_size=5)), max_size=3),
                          st.binary(max_size=20)), max_size=3),
       st.integers(-2 ** 40, 2 ** 52))
def test_render_notify_equals_the_line_by_line_rendering_for_any_message(headers, sections, accepted_at):
    deliver = _deliver(headers, sections, accepted_at)
    assert render_notify(deliver, "h") == reference_render_notify(deliver, "h")
    assert render_body(headers, sections) == reference_render_body(headers, sections)


@pytest.mark.parametrize("micros", [0, 1, 9_999, 10_000, 999_999, 1_000_000, -1, -10_001, 998577912460000,
                                    253402300799999999])
def test_format_micros_equals_format_date_time(micros):
    moment = datetime.fromtimestamp(micros // 1_000_000, timezone.utc).replace(microsecond=micros % 1_000_000)
    assert format_micros(micros) == format_date_time(moment)


def test_a_notify_frame_reads_back_through_the_framer():
    deliver = _deliver([("Priority", "3")], [TEXT, BINARY])
    frame = render_notify(deliver, "h")
    buffer, framer = LineBuffer(1000), MessageFramer(max_header_lines=10, max_message_bytes=1000)
    buffer.feed(frame.split(b"\r\n", 1)[1])
    assert framer.advance(buffer) and framer.error is None
    assert [(s.data) for s in framer.sections] == [TEXT.data, BINARY.data]
    assert framer.headers[3:] == [("Priority", "3")]


# --------------------------------------------------------------------------
# Topics


@pytest.mark.parametrize("topic", [
    "/a", "/A/b_1", "/a/Trash", "/a/trash/b", "/TRASH", "/trashx", "/a/" + "x" * 32, "/a/" + "x" * 33, "/1a",
    "/a//b", "/", "", "a", "/a\n", "/a/b ", "/a/", "/_a", "/é", "/a/b/c/d/e/f",
])
def test_canonical_agrees_with_the_level_by_level_check(topic):
    try:
        expected = reference_canonical(topic)
    except TopicError as error:
        with pytest.raises(TopicError) as raised:
            canonical(topic)
        assert (raised.value.reason, raised.value.too_long) == (error.reason, error.too_long)
    else:
        assert canonical(topic) == expected


# --------------------------------------------------------------------------
# Client replies read as a block


def _client_frames(data: bytes, expect: tuple[bool, ...], chunks: list[bytes]):
    from gateway.client import wire as cp
    reader = cp.ServerReader(greeting=False)
    for messages in expect:
        reader.expect_reply(messages=messages)
    frames = []
    try:
        for chunk in chunks:
            frames += reader.feed(chunk)
    except cp.ServerProtocolError as error:
        frames.append(("error", str(error)))
    return frames


@pytest.mark.parametrize("data, expect", [
    (b"200-OK\r\n200 C1 2001083408341157\r\n\r\n", (False,)),
    (b"200\r\n\r\n310 ACK www.host.com/5\r\n\r\n", (False, False)),
    (b"200-OK\r\n404 Not found\r\n\r\n", (False,)),  # the code changes inside the reply: an error
    (b"200-OK\r\n200-more\r\n\r\n200 end\r\n\r\n", (False,)),  # an empty line inside a reply
    (b"200 OK\r\nNOTIFY SERVER BYE\r\n\r\n", (False,)),  # no empty line after the reply
    (b"200 OK\r\n\r\n", (True,)),  # GET MESSAGE: read line by line
    (b"+ go on\r\n\r\n200 OK\r\n\r\n", (False, False)),
    (b"2x0 OK\r\n\r\n", (False,)),
    ("200 caf\u00e9 \udcff".encode("utf-8", "surrogateescape") + b"\r\n\r\n", (False,)),
])
def test_client_replies_read_whole_equal_those_read_byte_by_byte(data, expect):
    whole = _client_frames(data, expect, [data])
    assert whole == _client_frames(data, expect, [data[i:i + 1] for i in range(len(data))])
