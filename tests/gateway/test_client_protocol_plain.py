"""NOTIFY MESSAGE read at once (``gateway.client.wire._PlainNotify``) yields exactly what the
framer read line by line yields, and leaves every other frame, error and edge case to it.

Each stream is read twice: by a :class:`ServerReader` as built, and by one with the plain
reading turned off (``_read_plain = False``: every NOTIFY MESSAGE through
:class:`gateway.protocol.framing.MessageFramer`, the path this one must equal).  Both get the same
chunks (whole, split at every byte, random pieces) and must return the same frames, raise
the same :class:`ServerProtocolError` after the same frames, and end in the same state.
The frames are the gateway's own (:func:`gateway.protocol.rendering.render_notify`), then bytes
written by hand for what it never sends, and mutations of both.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client import wire as cp
from gateway.client import Message, Notification
from gateway.protocol.rendering import render_notify
from schemas.events import Deliver, Section

pytestmark = pytest.mark.timeout(60)

GREETING = b"SMQP/1.0 Ready. Plain test\r\n"
BINARY = bytes(range(256)) + b"\r\n.\r\n\r\n" + b"\n.\n" + b"NOTIFY MESSAGE /x\r\n" + b"\x00\r\n.\r\n\r\n"


def deliver(smuid: int, headers=(), sections=(), topic: str = "/bench/fo0") -> Deliver:
    return Deliver(account="sub1", smuid=smuid, topic=topic, cmuid=f"C{smuid}", publisher="benchpub",
                   publisher_guid="benchpub0a1b", accepted_at=1_764_170_000_000_000 + smuid,
                   headers=list(headers), sections=list(sections))


def text(data: bytes, content_type: str = "text/plain") -> Section:
    return Section([("Content-Type", content_type), ("Content-Length", str(len(data)))], data)


#: NOTIFY MESSAGE as the gateway renders it, in the shapes it takes.
RENDERED = [
    render_notify(deliver(1, sections=[text(bytes(range(32, 232)))]), "gw1.example.com"),  # the benchmark's
    render_notify(deliver(2), "h"),  # an empty message: no sections
    render_notify(deliver(3, sections=[text(b"")]), "h"),  # an empty section
    render_notify(deliver(4, [("Priority", "3"), ("Guarantee", "NO"), ("X-Tag", "a: b:c"), ("Empty", "")],
                          [text(b"one"), text(BINARY, "application/octet-stream"), text(b"\r\n.\r\n")]), "h"),
    render_notify(deliver(5, [("Sujet", "café ☕ \t"), ("X", "\u00a0padded\u2003")], [text("é".encode())]), "h"),
    render_notify(deliver(6, sections=[Section([("content-type", "a/b"), ("CONTENT-LENGTH", "1"),
                                                 ("Content-ID", "i1")], b"x")]), "h"),
    render_notify(deliver(7, [(".dotted", "v"), ("a\u00a0b", "nbsp inside a name")], [text(b"7")]), "h"),
    render_notify(deliver(8, [("Created", "D20010823T14451246Z"), ("Reply-Topic", "/r")],
                          [text(b"x" * 5000)]), "h"),  # longer than a 4 KiB read
    render_notify(deliver(9, sections=[text(b"a"), text(b"b")], topic="/a/é"), "h"),
]

#: What the gateway never sends, but reads at once all the same.
PLAIN_BY_HAND = [
    b"NOTIFY MESSAGE /t\r\n\r\n.\r\n\r\n",  # no headers, no sections
    b"NOTIFY MESSAGE /t\r\n\r\nContent-Type: a/b\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n",  # no empty line after
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\n\r\n\r\nContent-Type: a\r\nContent-Length: 1\r\n\r\nx\r\n\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE   /t  \r\nSmuid: h/1\r\n\r\n.\r\n",  # spaces around the topic
    b"NOTIFY MESSAGE \r\nSmuid: h/1\r\n\r\n.\r\n",  # no topic
    "NOTIFY MESSAGE /t\u0085\u3000\r\nA: b\r\n\r\n.\r\n".encode(),  # Unicode spaces after the topic
    b"NOTIFY MESSAGE /t\r\nSmuid:\th/1\t\r\n\r\n.\r\n",  # TABs around a value
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length:  01 \r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nX: \r\nY:\r\n\r\n.\r\n",  # empty values
]

#: What the framer reads leniently, or refuses: never read at once.
FRAMERS = [
    b"NOTIFY MESSAGE /t\xff\xfe\r\nA: b\r\n\r\n.\r\n",  # bad UTF-8 in the topic: replaced, not refused
    b"NOTIFY MESSAGE /t\x01x\r\nA: b\r\n\r\n.\r\n",  # a control byte in the topic
    b"NOTIFY MESSAGE /t\rx\r\nA: b\r\n\r\n.\r\n",  # a bare CR in the NOTIFY line
    b"notify message /t\r\nA: b\r\n\r\n.\r\n",
    b"NOTIFY MESS /t\r\nA: b\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE\t/t\r\nA: b\r\n\r\n.\r\n",
    # leniency: a data header among the message headers, "." right after them
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\nContent-Type: a/b\r\nContent-Length: 2\r\n\r\nxy\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\ncontent-length: 2\r\n\r\nxy\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n.\r\n\r\n",
    b"NOTIFY MESSAGE /t\r\nContent-Type: a\r\nContent-Length: 0\r\n\r\n\r\n.\r\n",  # read as a section
    b"NOTIFY MESSAGE /t\r\nCONTENT-TYPE: a\r\ncontent-LENGTH: 0\r\n\r\n\r\n.\r\n",
    # bare LFs
    b"NOTIFY MESSAGE /t\nSmuid: h/1\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\nContent-Type: a\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\nContent-Length: 1\r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: 1\r\n\r\nx\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: 1\r\n\r\nx\r\n.\n\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\n.\n",
    # header lines parse_header refuses
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\x00\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\x7f\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h\r/1\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: \xc3\x28\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nBad Name: x\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nBad\tName: x\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\n: x\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\n Lead: x\r\n\r\n.\r\n",
    "NOTIFY MESSAGE /t\r\nTrail\u00a0: x\r\n\r\n.\r\n".encode(),
    "NOTIFY MESSAGE /t\r\n\u2003Lead: x\r\n\r\n.\r\n".encode(),
    b"NOTIFY MESSAGE /t\r\nno colon\r\n\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nBad Name: 1\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\n.\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n",
    # Content-Length and Content-Type
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n"
    b"x\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: x\r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: -1\r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: +1\r\n\r\nx\r\n.\r\n",
    "NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: \u0661\r\n\r\nx\r\n.\r\n".encode(),
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: 2\r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: 0\r\n\r\nx\r\n.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: 1\r\n\r\nxy.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: 1\r\n\r\nxyz.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: 1\r\n\r\nx\r\r.\r\n",
    b"NOTIFY MESSAGE /t\r\nSmuid: h/1\r\n\r\nContent-Type: a\r\nContent-Length: 1\r\n\r\nx\r\nnot a header\r\n.\r\n",
]
HAND_WRITTEN = PLAIN_BY_HAND + FRAMERS


def stream_of(*frames: bytes) -> bytes:
    """The frames between replies, other NOTIFY kinds and a GET MESSAGE reply, after a greeting."""
    return (GREETING + b"200 OK\r\n\r\n" + b"".join(frames) + b"310 ACK h/1\r\n\r\n"
            + b"NOTIFY TOPIC /t\r\nAction: ADDED\r\n\r\n" + b"NOTIFY SERVER BYE\r\n\r\n"
            + b"200 OK\r\nTopic: /a\r\nSmuid: h/2\r\n\r\nContent-Type: a\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n\r\n"
            + b"200-OK\r\n200 2\r\n\r\n")


EXPECT = (False, False, True, False)  # the replies stream_of's frames are read after


def read(chunks: list[bytes], plain: bool, expect: tuple[bool, ...] = EXPECT, **limits) -> tuple:
    """Frames, the error raised (after those frames) and the reader's state at the end."""
    reader = cp.ServerReader(**limits)
    reader._read_plain = reader._read_plain and plain
    for messages in expect:
        reader.expect_reply(messages=messages)
    frames, error = [], None
    try:
        for chunk in chunks:
            frames += reader.feed(chunk)
    except cp.ServerProtocolError as raised:
        error = str(raised)
    return frames, error, reader.in_frame, list(reader._expected)


def both(chunks: list[bytes], **options) -> tuple:
    """What the plain reading yields, once checked equal to the framer's."""
    plain = read(chunks, True, **options)
    assert plain == read(chunks, False, **options)
    return plain


def random_pieces(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(1, 20))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def cuts(data: bytes) -> range | list[int]:
    """Every place to split ``data``; in a long one, every byte but far inside the data."""
    if len(data) <= 3000:
        return range(1, len(data))
    return sorted({*range(1, 1000), *range(1000, len(data) - 1000, 41), *range(len(data) - 1000, len(data))})


def counting(reader: cp.ServerReader) -> list[int]:
    """Count the frames the reader reads at once."""
    read_at_once, plain = [0], reader._plain_notify

    def counted(data, pos):
        found = plain(data, pos)
        read_at_once[0] += found is not None
        return found
    reader._plain_notify = counted
    return read_at_once


# -- the gateway's frames


def test_rendered_frames_are_read_at_once_and_equal_the_framers():
    stream = GREETING + b"".join(RENDERED)
    reader = cp.ServerReader()
    read_at_once = counting(reader)
    frames = reader.feed(stream)
    assert read_at_once == [len(RENDERED)] and not reader.in_frame
    assert frames == read([stream], False, ())[0]
    first = frames[1]
    assert (first.resource, first.topic) == ("MESSAGE", "/bench/fo0")
    assert first.headers[1:] == [("Smuid", "gw1.example.com/1"), ("Cmuid", "benchpub/benchpub0a1b/C1")]
    assert first.sections == [text(bytes(range(32, 232)))]
    assert [s.data for s in frames[4].sections] == [b"one", BINARY, b"\r\n.\r\n"]
    assert frames[5].headers[3:] == [("Sujet", "café ☕"), ("X", "padded")]
    assert frames[9].topic == "/a/é"


@pytest.mark.parametrize("frame", RENDERED, ids=range(len(RENDERED)))
def test_a_rendered_frame_split_anywhere_reads_as_the_framer_reads_it(frame):
    stream = stream_of(frame, frame)
    whole = both([stream])
    assert whole[1] is None and len(whole[0]) == 9
    for cut in cuts(stream):
        assert both([stream[:cut], stream[cut:]]) == whole
    assert both([stream[i:i + 1] for i in range(len(stream))]) == whole


def test_many_frames_in_socket_sized_reads():
    rng = random.Random(23)
    frames = [RENDERED[rng.randrange(len(RENDERED))] for _ in range(300)]
    stream = GREETING + b"".join(frames)
    whole = both([stream], expect=())
    assert len(whole[0]) == 301 and whole[1] is None
    for size in (7, 100, 4096, 65536):  # (1: in the test above)
        assert both([stream[i:i + size] for i in range(0, len(stream), size)], expect=()) == whole
    for seed in range(5):
        assert both(random_pieces(stream, random.Random(seed)), expect=()) == whole
    lists = [id(section.headers) for frame in whole[0][1:] for section in frame.sections]
    assert len(set(lists)) == len(lists)  # each section its own list, though most read alike


def test_more_data_headers_than_a_reader_keeps():
    frames = [render_notify(deliver(i, sections=[text(b"d" * (i % 150))]), "h") for i in range(400)]
    stream = GREETING + b"".join(frames)
    reader = cp.ServerReader()
    read_at_once = counting(reader)
    got = reader.feed(stream)
    assert read_at_once == [400] and got == read([stream], False, ())[0]
    assert [len(frame.sections[0].data) for frame in got[1:]] == [i % 150 for i in range(400)]


def test_notify_frames_between_acks_in_a_notify_window():
    """NOTIFYs and the 310 ACK replies to ACKs sent meanwhile, interleaved as they arrive."""
    frames = [render_notify(deliver(i, sections=[text(b"%d" % i * 30)]), "h") for i in range(40)]
    stream = GREETING + b"".join(f + (b"310 ACK h/%d\r\n\r\n" % i if i % 3 else b"") for i, f in enumerate(frames))
    expect = tuple(False for i in range(40) if i % 3)
    whole = both([stream], expect=expect)
    assert [type(f).__name__ for f in whole[0]].count("ReplyFrame") == len(expect) and not whole[3]
    for seed in range(5):
        assert both(random_pieces(stream, random.Random(seed)), expect=expect) == whole


# -- frames the gateway never sends: the framer's, errors included


@pytest.mark.parametrize("frame", HAND_WRITTEN, ids=range(len(HAND_WRITTEN)))
def test_hand_written_frames_read_and_fail_as_the_framer_reads_them(frame):
    """Split anywhere too (where an error loses the frames of the feed that raised it, so the
    frames differ from one split to the next: each is compared with the framer's alone)."""
    stream = stream_of(frame)
    both([stream])
    for cut in cuts(stream):
        both([stream[:cut], stream[cut:]])
    both([stream[i:i + 1] for i in range(len(stream))])


@pytest.mark.parametrize("frames, at_once", [(PLAIN_BY_HAND, 1), (FRAMERS, 0)], ids=["plain", "framers"])
def test_which_frames_are_read_at_once(frames, at_once):
    for frame in frames:
        reader = cp.ServerReader()
        read_at_once = counting(reader)
        try:
            reader.feed(GREETING + frame)
        except cp.ServerProtocolError:
            pass
        assert read_at_once == [at_once], frame


def test_errors_are_the_framers():
    stream = stream_of(b"NOTIFY MESSAGE /t\r\nA: b\r\n\r\nContent-Type: a\r\nContent-Length: 2\r\n\r\nx\r\n.\r\n")
    first = len(GREETING + b"200 OK\r\n\r\n")
    frames, error, _, _ = both([stream[:first], stream[first:]])
    assert error == "bad NOTIFY MESSAGE body: Bad request (Content-Length does not match the data)"
    assert len(frames) == 2  # the greeting and the 200 OK came in the feed before
    _, error, _, _ = both([stream_of(b"NOTIFY MESSAGE /t\r\nBad Name: x\r\n\r\n.\r\n")])
    assert error == "bad NOTIFY MESSAGE body: Bad request (malformed header line)"
    _, error, _, _ = both([stream_of(b"NOTIFY MESSAGE /t\r\nA: b\r\n\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n")])
    assert error == "bad NOTIFY MESSAGE body: Bad request (Content-Type missing)"


# -- the reader's limits


@pytest.mark.parametrize("limits", [
    {"max_line_bytes": 0}, {"max_line_bytes": 1}, {"max_line_bytes": 30}, {"max_line_bytes": 40},
    {"max_line_bytes": 5100}, {"max_header_lines": 0}, {"max_header_lines": 2}, {"max_header_lines": 5},
    {"max_header_lines": 6}, {"max_message_bytes": 0}, {"max_message_bytes": 199}, {"max_message_bytes": 200},
])
def test_limits_are_the_framers(limits):
    for frame in (RENDERED[0], RENDERED[3], RENDERED[7], PLAIN_BY_HAND[0]):
        stream = stream_of(frame)
        both([stream], **limits)
        for seed in range(3):
            both(random_pieces(stream, random.Random(seed)), **limits)


def test_the_tail_of_an_overlong_line_is_not_read_as_a_notify():
    """A line too long raises, and its tail is dropped as it arrives, up to its LF, should the
    caller feed on: a tail that reads ``NOTIFY MESSAGE …`` is the line's, not a frame."""
    chunks = [GREETING + b"x" * 60, b"NOTIFY MESSAGE /t\r\nA: b\r\n\r\n.\r\n", RENDERED[0]]
    outcomes = []
    for plain in (True, False):
        reader, out = cp.ServerReader(max_line_bytes=50), []
        reader._read_plain = plain
        for chunk in chunks:
            try:
                out.append(reader.feed(chunk))
            except cp.ServerProtocolError as error:
                out.append(str(error))
        outcomes.append(out)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][:2] == ["server line too long", "not a reply line: 'A: b'"]


# -- mutations


@st.composite
def mutated_stream(draw) -> bytes:
    """A stream of rendered frames with a few bytes flipped, cut, doubled or inserted."""
    frames = draw(st.lists(st.sampled_from(RENDERED[:7] + PLAIN_BY_HAND), min_size=1, max_size=3))
    data = bytearray(stream_of(*frames))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(len(GREETING), len(data) - 1))
        kind = draw(st.sampled_from(["flip", "cut", "double", "insert"]))
        if kind == "flip":
            data[at] = draw(st.sampled_from([0, 9, 10, 13, 32, 46, 58, 127, 0xc3, 0xff, draw(st.integers(0, 255))]))
        elif kind == "cut":
            del data[at:at + draw(st.integers(1, 8))]
        elif kind == "double":
            data[at:at] = data[at:at + draw(st.integers(1, 8))]
        else:
            data[at:at] = draw(st.sampled_from([b"\r\n", b"\n", b"\r", b".\r\n", b":", b" ", b"\t",
                                                b"Content-Length: 3\r\n", b"\xc2\xa0", b"\x00"]))
    return bytes(data)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(mutated_stream(), st.randoms(use_true_random=False))
def test_mutated_streams_read_as_the_framer_reads_them(stream, rng):
    both([stream])
    both(random_pieces(stream, rng))


# -- the client's own per-notification helpers


@pytest.mark.parametrize("smuid", ["gw1.example.com/2001083408341156", "h/1", "", "caf\u00e9/1", None, 17])
def test_render_ack_is_render_command(smuid):
    assert cp.render_ack(smuid) == cp.render_command("310", "ACK", smuid)


@pytest.mark.parametrize("smuid", ["h/1\r\nQUIT", "h\n", "\r"])
def test_render_ack_refuses_a_line_break_as_render_command_does(smuid):
    with pytest.raises(ValueError):
        cp.render_command("310", "ACK", smuid)
    with pytest.raises(ValueError):
        cp.render_ack(smuid)


HEADER_SETS = [
    [],
    [("Created", "D1"), ("Smuid", "h/1"), ("Cmuid", "a/g/C1")],
    [("SMUID", "h/2"), ("smuid", "h/3"), ("Guar", "no"), ("Guarantee", "yes")],
    [("Guarantee", ""), ("Guar", "NO"), ("X", None), ("x", "second")],
    [("Guarantee", None), ("guarantee", "No"), ("Smuid", None), ("Smuid", "h/4")],
    [("K\u212a", "kelvin"), ("\u0130", "dotted"), ("Stra\u00dfe", "sharp s")],
]


@pytest.mark.parametrize("headers", HEADER_SETS)
def test_header_is_the_one_pass_lookup(headers):
    note, message = Notification("MESSAGE", "/t", headers), Message(headers)
    for name in ("Smuid", "SMUID", "guar", "Guarantee", "x", "X", "kk", "k\u212a", "i\u0307", "strasse",
                 "stra\u00dfe", "missing"):
        expected = message._attributes(name.lower())[0]  # the one-pass lookup of several names
        assert note.header(name) == message.header(name) == expected


@pytest.mark.parametrize("headers", HEADER_SETS)
def test_ack_fields_are_read_once_and_as_before(headers):
    guarantee, guar, smuid = Message(headers)._attributes("guarantee", "guar", "smuid")
    expected = ((guarantee or guar or "YES").upper() != "NO", smuid)
    note = Notification("MESSAGE", "/t", headers)
    assert note._ack_smuid() == expected and note.needs_ack == expected[0]
    assert note._ack_fields == expected  # kept: acknowledge() does not read the headers again
    note._acked = True
    assert note._ack_smuid() == (False, None) and not note.needs_ack
    assert Notification("TOPIC", "/t", headers)._ack_smuid() == (False, None)
