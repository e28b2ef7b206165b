"""The client reader parses every server frame of the protocol surface, fed whole,
byte by byte and randomly split; the client renderers produce what the server's
framing rule parses.

The server side is written here as literal bytes (the decided formats) or
with the server's own body renderer (:func:`gateway.protocol.rendering.render_notify`),
never through a server :class:`Session`, so these tests pin the client alone.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from gateway.client import wire as cp
from gateway.protocol.framing import LineBuffer, MessageFramer
from gateway.protocol.rendering import render_notify
from gateway.replies import NOT_IMPLEMENTED, Reply
from schemas.events import Deliver, Section

pytestmark = pytest.mark.timeout(60)

BINARY = bytes(range(256)) + b"\r\n.\r\n" + b"\n.\n" + b"\x00\r\n.\r\n\r\n"
GREETING = b"SMQP/1.0 Ready. OmicronSoft SMQP Server/1.0 (c) 2001\r\n"


def two_section_deliver() -> Deliver:
    return Deliver(
        account="jtegen", smuid=77, topic="/pics", cmuid="C9", publisher="ann", publisher_guid="ann01",
        accepted_at=998577912460000, headers=[("Name", "two parts"), ("X-Tag", "a: b")],
        sections=[Section([("Content-Type", "text/plain"), ("Content-Length", "5")], b"hello"),
                  Section([("Content-Type", "image/gif"), ("Content-ID", "img1"),
                           ("Content-Length", str(len(BINARY)))], BINARY)],
    )


def random_chunks(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    if len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(1, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def read_three_ways(data: bytes, expect: tuple[bool, ...] = (), greeting: bool = True) -> list:
    """Frames from ``data`` fed whole, byte by byte and randomly split: all equal.
    ``expect`` is announced first: one entry per request, True for GET MESSAGE."""
    def collect(chunks):
        reader, frames = cp.ServerReader(greeting=greeting), []
        for messages in expect:
            reader.expect_reply(messages=messages)
        for chunk in chunks:
            frames += reader.feed(chunk)
        assert not reader.in_frame
        return frames
    whole = collect([data])
    assert collect([data[i:i + 1] for i in range(len(data))]) == whole
    for seed in range(4):
        assert collect(random_chunks(data, seed)) == whole
    return whole


# -- replies, NOTIFY MESSAGE, BYE (as before)


def test_greeting_replies_notify_and_bye():
    stream = (GREETING + Reply.ok().to_bytes()
              + b"200-OK\r\n200 /pics\r\n\r\n"
              + render_notify(two_section_deliver(), "www.host.com")
              + Reply.error(NOT_IMPLEMENTED, "COUNT").to_bytes()
              + Reply.ok("Topic: /accounts/jtegen", "Guid: g1").to_bytes()
              + b"NOTIFY SERVER BYE\r\n\r\n")
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


SPEC_NOTIFY = (b"NOTIFY MESSAGE /stocks/quotes/ibm\r\nCreated: D20010815T08032445Z\r\nSmuid: www.host.com/1835\r\n"
               b"Cmuid: jtegen/jtegen3454654/A004\r\nPriority: 1\r\nReceipt: yes\r\nReply: NO\r\n"
               b"Timeout: 00:01:00\r\nDepth: 1\r\nSequence: 34\r\n\r\n"
               b"Content-Type: text/plain\r\nContent-Length: 6\r\n\r\n34.456\r\n.\r\n\r\n")


def test_spec_notify_example_and_other_notify_kinds():
    frames = read_three_ways(b"SMQP/1.0 Ready.\r\n" + SPEC_NOTIFY
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
                                     b"NOTIFY MESSAGE /a\r\n\r\nContent-Type: a/b\r\n\r\nx\r\n.\r\n",
                                     b"NOTIFY\r\n\r\n", b"NOTIFY TOPIC /a\r\nno colon here\r\n\r\n"])
def test_garbage_from_the_server_raises(garbage):
    reader = cp.ServerReader()
    with pytest.raises(cp.ServerProtocolError):
        reader.feed(b"SMQP/1.0 Ready.\r\n" + garbage)


# -- every reply shape of the protocol surface


def test_replies_of_count_list_find_keywords_remove_sub_unsub():
    stream = (GREETING
              + b"200-OK\r\n200 2\r\n\r\n"                                            # COUNT TOPIC
              + b"200-OK\r\n200-/stocks\r\n200-/news > /info/news/cnn\r\n200 /weather\r\n\r\n"  # LIST TOPIC
              + b"200 OK\r\n\r\n"                                                     # LIST TOPIC, no children
              + b"200-OK\r\n200 1809-1812,1845\r\n\r\n"                               # LIST MESSAGE
              + b"200-OK\r\n200-/stocks/ibm (IBM,STOCKS,BIG BLUE)\r\n200 /stocks/floral\r\n\r\n"  # FIND
              + b"200-OK\r\n200 IBM,BIG BLUE\r\n\r\n"                                 # GET TOPIC KEYWORDS
              + b"200-OK\r\n200 12 messages pending\r\n\r\n"                          # REMOVE TOPIC
              + b"200-OK\r\n200-MESSAGE /a\r\n200-TOPIC /a\r\n200 SUB /a\r\n\r\n")    # UNSUB *
    frames = read_three_ways(stream)
    assert frames[1:] == [
        cp.ReplyFrame(200, ["OK", "2"]),
        cp.ReplyFrame(200, ["OK", "/stocks", "/news > /info/news/cnn", "/weather"]),
        cp.ReplyFrame(200, ["OK"]),
        cp.ReplyFrame(200, ["OK", "1809-1812,1845"]),
        cp.ReplyFrame(200, ["OK", "/stocks/ibm (IBM,STOCKS,BIG BLUE)", "/stocks/floral"]),
        cp.ReplyFrame(200, ["OK", "IBM,BIG BLUE"]),
        cp.ReplyFrame(200, ["OK", "12 messages pending"]),
        cp.ReplyFrame(200, ["OK", "MESSAGE /a", "TOPIC /a", "SUB /a"]),
    ]
    assert cp.leading_int(frames[1].lines[-1]) == 2
    assert [cp.parse_topic_entry(line) for line in cp.payload(frames[2])] == [
        ("/stocks", None), ("/news", "/info/news/cnn"), ("/weather", None)]
    assert cp.payload(frames[3]) == []
    assert cp.parse_ranges(frames[4].lines[-1]) == [1809, 1810, 1811, 1812, 1845]
    assert [cp.parse_found_topic(line) for line in cp.payload(frames[5])] == [
        ("/stocks/ibm", ["IBM", "STOCKS", "BIG BLUE"]), ("/stocks/floral", [])]
    assert cp.parse_keywords(frames[6].lines[-1]) == ["IBM", "BIG BLUE"]
    assert cp.leading_int(frames[7].lines[-1]) == 12


def test_password_exchange_continuations():
    """SET LOGIN PASSWORD: ``200 + old password``, then a bare ``+ new password`` frame, then 200."""
    stream = GREETING + b"200-OK\r\n200 + old password\r\n\r\n+ new password\r\n\r\n200 OK\r\n\r\n"
    frames = read_three_ways(stream, expect=(False, False, False))
    assert frames[1:] == [cp.ReplyFrame(200, ["OK", "+ old password"]), cp.Continuation("new password"),
                          cp.ReplyFrame(200, ["OK"])]
    # the spec's KERBEROS-style continuation, no space after '+'
    assert read_three_ways(GREETING + b"+or//EoAADZI\r\n")[1:] == [cp.Continuation("or//EoAADZI")]


def test_every_notify_kind_and_abbreviation():
    stream = (GREETING
              + b"NOTIFY TOPIC /t\r\nAction: ADDED\r\n\r\n"
              + b"NOTIFY TOPIC /t\r\nAction: RENAME /new\r\n\r\n"
              + b"NOTIFY TOPIC /t\r\nAction: DELETED\r\n\r\n"
              + b"NOTIFY TOPIC /t\r\nAction: KEYWORDS A,B\r\n\r\n"
              + b"NOTIFY SUB /t\r\nCOUNT: 34\r\n\r\n"
              + b"NOTIFY SUBSCRIBERS /t\r\nCOUNT: 0\r\n\r\n"
              + b"NOTIFY SERVER TIMEOUT 00:05:00\r\n\r\n"
              + b"NOTIFY SERV BYE\r\n\r\n"
              + b"NOTIFY MESS /t\r\nSmuid: h/5\r\n\r\nContent-Type: a/b\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n\r\n")
    frames = read_three_ways(stream)[1:]
    assert [(f.resource, f.topic, f.headers) for f in frames] == [
        ("TOPIC", "/t", [("Action", "ADDED")]),
        ("TOPIC", "/t", [("Action", "RENAME /new")]),
        ("TOPIC", "/t", [("Action", "DELETED")]),
        ("TOPIC", "/t", [("Action", "KEYWORDS A,B")]),
        ("SUBSCRIBERS", "/t", [("COUNT", "34")]),
        ("SUBSCRIBERS", "/t", [("COUNT", "0")]),
        ("SERVER", "TIMEOUT 00:05:00", []),
        ("SERVER", "BYE", []),
        ("MESSAGE", "/t", [("Smuid", "h/5")]),
    ]
    assert frames[-1].sections == [Section([("Content-Type", "a/b"), ("Content-Length", "1")], b"x")]


# -- GET MESSAGE


def stored(topic: str, smuid: int, sections: list[Section], *extra: tuple[str, str]) -> bytes:
    """One message of a GET MESSAGE reply as the server renders it (decided format)."""
    deliver = Deliver(account="me", smuid=smuid, topic=topic, cmuid=f"A{smuid}", publisher="ann",
                      publisher_guid="g1", accepted_at=998577912460000, headers=list(extra), sections=sections)
    notify = render_notify(deliver, "host")
    return f"Topic: {topic}\r\n".encode() + notify.split(b"\r\n", 1)[1][:-2]


TEXT = [Section([("Content-Type", "text/plain"), ("Content-Length", "6")], b"34.456")]
# data that looks like the frame's own delimiters: '.' lines, an empty line, a Topic: line
TRICKY = [Section([("Content-Type", "text/plain")], b"Topic: /not/a/header\r\n\r\n.\r\n"),
          Section([("Content-Type", "application/octet-stream")], BINARY)]


def test_get_message_reply_with_several_messages():
    body = stored("/stocks/quotes/ibm", 1845, TEXT, ("Priority", "1")) + stored("/stocks/quotes/ibm", 1905, TRICKY)
    assert body.startswith(b"Topic: /stocks/quotes/ibm\r\nCreated: D20010823T14451246Z\r\nSmuid: host/1845\r\n"
                           b"Cmuid: ann/g1/A1845\r\nPriority: 1\r\n\r\nContent-Type: text/plain\r\n"
                           b"Content-Length: 6\r\n\r\n34.456\r\n.\r\nTopic: /stocks/quotes/ibm\r\n")
    stream = GREETING + b"200 OK\r\n" + body + b"\r\n" + b"200 OK\r\n\r\n"
    frames = read_three_ways(stream, expect=(True, False))
    reply, after = frames[1:]
    assert (reply.code, reply.lines, after) == (200, ["OK"], cp.ReplyFrame(200, ["OK"]))
    first, second = reply.messages
    assert first.headers == [("Topic", "/stocks/quotes/ibm"), ("Created", "D20010823T14451246Z"),
                             ("Smuid", "host/1845"), ("Cmuid", "ann/g1/A1845"), ("Priority", "1")]
    assert first.sections == TEXT
    assert second.headers[2] == ("Smuid", "host/1905")
    assert [s.data for s in second.sections] == [b"Topic: /not/a/header\r\n\r\n.\r\n", BINARY]


def test_get_message_spec_example_and_notifications_around_it():
    """4.1.12.1's example (no Z on Created) between two notifications; the reply's
    expectation is the second of three pipelined requests."""
    spec = (b"200 OK\r\nTopic: /stocks/quotes/ibm\r\nCreated: D20010815T08032445\r\nSMUID: host.com/1835\r\n"
            b"CMUID: jtegen/jtegen005/A004\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\n"
            b"34.456      \r\n.\r\n\r\n")
    stream = (GREETING + b"200 OK\r\n\r\n" + b"NOTIFY SUB /t\r\nCOUNT: 3\r\n\r\n" + spec
              + b"NOTIFY SERVER TIMEOUT 00:05:00\r\n\r\n" + b"404 Not found\r\n\r\n")
    frames = read_three_ways(stream, expect=(False, True, True))
    assert [type(f).__name__ for f in frames] == ["Greeting", "ReplyFrame", "NotifyFrame", "ReplyFrame",
                                                  "NotifyFrame", "ReplyFrame"]
    [message] = frames[3].messages
    assert message.headers[:3] == [("Topic", "/stocks/quotes/ibm"), ("Created", "D20010815T08032445"),
                                   ("SMUID", "host.com/1835")]
    # the spec example's data header sits with the message header (no empty line): the framer's leniency
    assert message.sections[0].data == b"34.456      "
    assert frames[5] == cp.ReplyFrame(404, ["Not found"])  # zero matches: no body, expectation used up


def test_get_message_refused_leaves_the_next_reply_plain():
    frames = read_three_ways(GREETING + b"404 Not found\r\n\r\n200 OK\r\n\r\n", expect=(True, False))
    assert frames[1:] == [cp.ReplyFrame(404, ["Not found"]), cp.ReplyFrame(200, ["OK"])]


def test_get_message_with_an_empty_line_right_after_ok_has_no_messages():
    frames = read_three_ways(GREETING + b"200 OK\r\n\r\n", expect=(True,))
    assert frames[1:] == [cp.ReplyFrame(200, ["OK"], [])]


@pytest.mark.parametrize("garbage", [
    b"200 OK\r\n" + b"Topic: /a\r\n\r\nContent-Type: a/b\r\nContent-Length: 1\r\n\r\nx\r\n.\r\n200 OK\r\n",
    b"200 OK\r\n" + b"Topic: /a\r\n\r\nContent-Type: a/b\r\nContent-Length: 5\r\n\r\nx\r\n.\r\n\r\n",
    b"200 OK\r\nnot a header\r\n",
])
def test_bad_get_message_bodies_raise(garbage):
    reader = cp.ServerReader()
    reader.expect_reply(messages=True)
    with pytest.raises(cp.ServerProtocolError):
        reader.feed(GREETING + garbage + b"\r\n.\r\n\r\n")


def test_unannounced_get_message_body_is_not_understood():
    """Without ``expect_reply(messages=True)`` a message header after ``200 OK`` fits no frame."""
    with pytest.raises(cp.ServerProtocolError):
        cp.ServerReader().feed(GREETING + b"200 OK\r\n" + stored("/a", 1, TEXT) + b"\r\n")


# -- the SET NOTIFY PORT connection


def test_notify_connection_has_no_greeting():
    stream = SPEC_NOTIFY + b"310 ACK\r\n\r\n" + b"NOTIFY TOPIC /t\r\nAction: DEL\r\n\r\n"
    frames = read_three_ways(stream, greeting=False)
    assert [type(f).__name__ for f in frames] == ["NotifyFrame", "ReplyFrame", "NotifyFrame"]
    # a server that greets there anyway is understood too
    assert read_three_ways(b"SMQP/1.0 Ready.\r\n" + SPEC_NOTIFY, greeting=False)[0] == cp.Greeting("SMQP/1.0 Ready.")


# -- rendering and payload helpers


def test_render_publish_is_what_the_servers_framing_rule_parses():
    sections = [Section([("Content-Type", "application/octet-stream")], BINARY),
                Section([("Content-Type", "text/plain"), ("Content-Length", "999")], b"fixed length")]
    data = cp.render_publish("/pics", "C1", [("Name", "n"), ("Priority", "3")], sections)
    command, body = data.split(b"\r\n", 1)
    assert command == b"PUB MESSAGE /pics C1"
    for chunks in ([body], [body[i:i + 1] for i in range(len(body))], random_chunks(body, 7)):
        buffer, framer = LineBuffer(1 << 20), MessageFramer(max_header_lines=100, max_message_bytes=1 << 20)
        for chunk in chunks:
            buffer.feed(chunk)
            framer.advance(buffer)
        assert framer.done and framer.error is None
        assert framer.headers == [("Name", "n"), ("Priority", "3")]
        assert [s.data for s in framer.sections] == [BINARY, b"fixed length"]
        assert framer.sections[0].headers == [("Content-Type", "application/octet-stream"),
                                              ("Content-Length", str(len(BINARY)))]
        assert framer.sections[1].headers[1] == ("Content-Length", "12")
        assert buffer.read_line() == b""  # the empty line after the '.'


def test_render_publish_reply():
    data = cp.render_publish("/stocks/quotes/ibm", "CF0456", [("Cmuid", "jtegen/jtegen497549/A004")],
                             [Section([("Content-Type", "text/plain")], b"Thank you")], "REPLY")
    assert data == (b"PUB REPLY /stocks/quotes/ibm CF0456\r\nCmuid: jtegen/jtegen497549/A004\r\n\r\n"
                    b"Content-Type: text/plain\r\nContent-Length: 9\r\n\r\nThank you\r\n.\r\n\r\n")


def test_render_command_line_and_ack():
    assert cp.render_command("LOGIN", "jtegen", "CLEAR/1.0") == b"LOGIN jtegen CLEAR/1.0\r\n\r\n"
    assert cp.render_line("") == b"\r\n"
    assert cp.render_line("s3cret word") == b"s3cret word\r\n"
    assert cp.ACK == b"310 ACK\r\n\r\n"
    for bad in ("/a\r\nQUIT", "/a\n"):
        with pytest.raises(ValueError):
            cp.render_command("SUB", "MESSAGE", bad)
    with pytest.raises(ValueError):
        cp.render_line("pw\r\nQUIT")
    with pytest.raises(ValueError):
        cp.render_publish("/a", "C1", [("X-Evil", "a\r\nQUIT")], [])


def test_ranges_both_ways():
    assert cp.parse_ranges("1809-1812,1845,1850-1851") == [1809, 1810, 1811, 1812, 1845, 1850, 1851]
    assert cp.parse_ranges("") == []
    with pytest.raises(cp.ServerProtocolError):
        cp.parse_ranges("12-x")
    assert cp.format_ranges([1905, 1845, 1846, 1847, 1890]) == "1845-1847,1890,1905"
    assert cp.format_ranges(range(1845, 1891)) == "1845-1890"
    assert cp.format_ranges([range(1, 3), 7]) == "1-2,7"
    assert cp.format_ranges(1865) == "1865"
    assert cp.format_ranges("*") == "*"
    assert cp.format_ranges("1845-1890,1905") == "1845-1890,1905"
    for bad in ("", "1845-", "a", "1,,2", "1 2", []):
        with pytest.raises(ValueError):
            cp.format_ranges(bad)


def test_keywords_and_dates():
    assert cp.format_keywords(["IBM", " BIG BLUE "]) == "(IBM,BIG BLUE)"
    for bad in (["A,B"], ["(A)"], [""], ["A\r\nB"]):
        with pytest.raises(ValueError):
            cp.format_keywords(bad)
    assert cp.parse_keywords("(IBM, BIG BLUE)") == ["IBM", "BIG BLUE"]
    assert cp.parse_keywords("") == []
    assert cp.format_date_time(datetime(2001, 9, 15, 8, 0, 0, 120000)) == "D20010915T08000012Z"
    eastern = timezone(timedelta(hours=-5))
    assert cp.format_date_time(datetime(2001, 9, 15, 3, 0, tzinfo=eastern)) == "D20010915T08000000Z"
    assert cp.format_date_time("D20010915T080000") == "D20010915T080000"


def test_leading_int_refuses_non_numbers():
    assert cp.leading_int("45") == 45
    for bad in ("OK", "", "-1 messages"):
        with pytest.raises(cp.ServerProtocolError):
            cp.leading_int(bad)
