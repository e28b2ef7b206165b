"""The client reader parses the server's own renderings, fed three ways; the
client renderers produce what the server session parses."""

from __future__ import annotations

import pytest

from gateway import client_protocol as cp
from gateway.protocol import Durable, render_notify
from gateway.replies import NOT_IMPLEMENTED, Reply
from schemas.events import Deliver, Section
from tests.gateway.test_feeding import feed_three_ways, logged_in, make_session, random_chunks, transcript, wire
from tests.gateway.test_spec_examples import NOTIFY_EXAMPLE

BINARY = bytes(range(256)) + b"\r\n.\r\n" + b"\n.\n" + b"\x00\r\n.\r\n\r\n"


def two_section_deliver() -> Deliver:
    return Deliver(
        account="jtegen", smuid=77, topic="/pics", cmuid="C9", publisher="ann", publisher_guid="ann01",
        accepted_at=998577912460000, headers=[("Name", "two parts"), ("X-Tag", "a: b")],
        sections=[Section([("Content-Type", "text/plain"), ("Content-Length", "5")], b"hello"),
                  Section([("Content-Type", "image/gif"), ("Content-ID", "img1"),
                           ("Content-Length", str(len(BINARY)))], BINARY)],
    )


def read_three_ways(data: bytes) -> list:
    """Frames from ``data`` fed whole, byte by byte and randomly split: all equal."""
    def collect(chunks):
        reader, frames = cp.ServerReader(), []
        for chunk in chunks:
            frames += reader.feed(chunk)
        assert not reader.in_frame
        return frames
    whole = collect([data])
    assert collect([data[i:i + 1] for i in range(len(data))]) == whole
    for seed in range(4):
        assert collect(random_chunks(data, seed)) == whole
    return whole


def test_greeting_replies_notify_and_bye():
    session = logged_in()
    stream = (session.greeting() + Reply.ok().to_bytes()
              + wire(session.receive_data(b"SUB MESSAGE /pics\r\n"))
              + session.notify(two_section_deliver())
              + Reply.error(NOT_IMPLEMENTED, "COUNT").to_bytes()
              + Reply.ok("Topic: /accounts/jtegen", "Guid: g1").to_bytes()
              + session.server_bye())
    frames = read_three_ways(stream)
    assert frames == [
        cp.Greeting("SMQP/1.0 Ready. OmicronSoft SMQP Server/1.0 (c) 2001"),
        cp.ReplyFrame(200, ["OK"]),
        cp.ReplyFrame(200, ["OK", "/pics"]),
        cp.NotifyFrame("MESSAGE", "/pics",
                       [("Created", "D20010823T14451246Z"), ("Smuid", "www.host.com/77"), ("Cmuid", "ann/ann01/C9"),
                        ("Name", "two parts"), ("X-Tag", "a: b")],
                       two_section_deliver().sections),
        cp.ReplyFrame(501, ["Not implemented (COUNT)"]),
        cp.ReplyFrame(200, ["OK", "Topic: /accounts/jtegen", "Guid: g1"]),
        cp.NotifyFrame("SERVER", "BYE"),
    ]


def test_spec_notify_example_and_other_notify_kinds():
    _, notify = transcript(NOTIFY_EXAMPLE)
    frames = read_three_ways(b"SMQP/1.0 Ready.\r\n" + notify
                             + b"NOTIFY TOPIC /stocks/quotes/ibm\r\nACTION: RENAME /stocks/quotes/big_blue\r\n\r\n"
                             + b"NOTIFY SUB /stocks/quotes/ibm\r\nCOUNT: 34\r\n\r\n"
                             + b"NOTIFY SERVER BYE 00:05:00\r\n\r\n310 ACK\r\n\r\n")
    message = frames[1]
    assert (message.resource, message.topic) == ("MESSAGE", "/stocks/quotes/ibm")
    assert message.headers[2] == ("Cmuid", "jtegen/jtegen3454654/A004")
    assert message.sections == [Section([("Content-Type", "text/plain"), ("Content-Length", "6")], b"34.456")]
    assert frames[2:] == [
        cp.NotifyFrame("TOPIC", "/stocks/quotes/ibm", [("ACTION", "RENAME /stocks/quotes/big_blue")]),
        cp.NotifyFrame("SUBSCRIBERS", "/stocks/quotes/ibm", [("COUNT", "34")]),
        cp.NotifyFrame("SERVER", "BYE 00:05:00"),
        cp.ReplyFrame(310, ["ACK"]),
    ]


def test_reply_without_trailing_empty_line_is_still_a_frame():
    """The spec's abbreviated LOGIN transcript sends ``200 OK`` with no empty line."""
    reader = cp.ServerReader()
    assert reader.feed(b"SMQP/1.0 Ready.\r\n200 OK\r\n") == [cp.Greeting("SMQP/1.0 Ready."), cp.ReplyFrame(200, ["OK"])]


def test_incomplete_frame_is_reported_at_eof():
    reader = cp.ServerReader()
    reader.feed(b"SMQP/1.0 Ready.\r\n" + render_notify(two_section_deliver(), "h")[:-40])
    assert reader.feed(b"") == [] and reader.closed and reader.in_frame


@pytest.mark.parametrize("garbage", [b"hello there\r\n", b"200-OK\r\n404 Not found\r\n",
                                     b"NOTIFY MESSAGE /a\r\n\r\nContent-Type: a/b\r\n\r\nx\r\n.\r\n"])
def test_garbage_from_the_server_raises(garbage):
    reader = cp.ServerReader()
    with pytest.raises(cp.ServerProtocolError):
        reader.feed(b"SMQP/1.0 Ready.\r\n" + garbage)


def test_render_publish_is_what_the_session_parses():
    sections = [Section([("Content-Type", "application/octet-stream")], BINARY),
                Section([("Content-Type", "text/plain"), ("Content-Length", "999")], b"fixed length")]
    data = cp.render_publish("/pics", "C1", [("Name", "n"), ("Priority", "3")], sections)
    [durable] = feed_three_ways(data + cp.render_command("NOOP"))[:1]
    assert isinstance(durable, Durable)
    event = durable.event
    assert (event.topic, event.cmuid, event.priority) == ("/pics", "C1", 3)
    assert [s.data for s in event.sections] == [BINARY, b"fixed length"]
    assert event.sections[0].headers == [("Content-Type", "application/octet-stream"),
                                         ("Content-Length", str(len(BINARY)))]
    assert event.sections[1].headers[1] == ("Content-Length", "12")


def test_render_command_and_ack():
    assert cp.render_command("LOGIN", "jtegen", "CLEAR/1.0") == b"LOGIN jtegen CLEAR/1.0\r\n\r\n"
    session = logged_in()
    session.notify(Deliver("jtegen", 5, "/a", "c", "p", "g", 0))
    assert wire(session.receive_data(cp.ACK)) == b"310 ACK\r\n\r\n"
    assert session.awaiting_ack is None


def test_full_conversation_through_both_sides():
    """Client renderings → session → server bytes → client reader."""
    session, reader = make_session(), cp.ServerReader()
    frames = reader.feed(session.greeting())
    for words in (["LOGIN", "jtegen", "CLEAR/1.0"], ["PASS", "jtegen", "rowe7kuy"], ["SUB", "MESS", "/a/*"]):
        frames += reader.feed(wire(session.receive_data(cp.render_command(*words))))
    frames += reader.feed(session.notify(Deliver("jtegen", 9, "/a/b", "c1", "ann", "g", 0,
                                                 sections=[Section([("Content-Type", "a/b")], b"\r\n.\r\n")])))
    frames += reader.feed(wire(session.receive_data(cp.ACK + cp.render_command("QUIT"))))
    assert [type(f).__name__ for f in frames] == [
        "Greeting", "ReplyFrame", "ReplyFrame", "ReplyFrame", "NotifyFrame", "ReplyFrame", "ReplyFrame"]
    assert frames[2].lines[1] == "Topic: /accounts/jtegen"
    assert frames[4].sections[0].data == b"\r\n.\r\n"
    assert (frames[5].code, frames[6].code) == (310, 200)
    assert session.closed
