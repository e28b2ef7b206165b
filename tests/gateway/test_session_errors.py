"""Bad input gets a reply code, never a crash, and the next command parses."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.protocol.actions import Close, Durable, LoggedIn, Send, SessionMisuse
from tests.gateway.test_feeding import feed_three_ways, logged_in, make_config, make_session, wire
from tests.gateway.test_spec_examples import example_deliver

NOOP = b"NOOP\r\n"
OK = b"200 OK\r\n\r\n"


def pub(body: bytes, *, topic: bytes = b"/stocks/quotes/ibm", data: bytes = b"24.567",
        length: bytes | None = None, headers: bytes = b"Priority: 1\r\n") -> bytes:
    """A PUB MESSAGE frame with one text/plain section (``length`` overrides the true one)."""
    length = str(len(data)).encode() if length is None else length
    return (b"PUB MESSAGE " + topic + b" A004\r\n" + headers + b"\r\nContent-Type: text/plain\r\n"
            b"Content-Length: " + length + b"\r\n\r\n" + data + b"\r\n.\r\n" + body)


def durables(actions) -> list[Durable]:
    return [a for a in actions if isinstance(a, Durable)]


def test_unknown_command():
    assert wire(feed_three_ways(b"FROB /x\r\n" + NOOP)) == b"400 Bad request (unknown command)\r\n\r\n" + OK


def test_unknown_command_before_login_is_400_not_401():
    assert wire(feed_three_ways(b"FROB\r\n", make_session)) == b"400 Bad request (unknown command)\r\n\r\n"


def test_commands_before_login_are_unauthorized():
    actions = feed_three_ways(b"SUB MESSAGE /a\r\nCOUNT TOPIC /a\r\n310 ACK\r\n", make_session)
    assert wire(actions) == b"401 Unauthorized (LOGIN first)\r\n\r\n" * 3
    assert not durables(actions)


def test_publish_before_login_consumes_the_frame_then_401():
    actions = feed_three_ways(pub(NOOP), make_session)
    assert wire(actions) == b"401 Unauthorized (LOGIN first)\r\n\r\n" + OK
    assert not durables(actions)


def test_content_length_longer_than_the_data_leaves_the_frame_open():
    session = logged_in()
    assert session.receive_data(pub(NOOP, length=b"100")) == []
    assert session.in_frame
    assert session.frame_timeout() == [Send(b"408 Request timeout\r\n\r\n"), Close()]
    assert session.receive_data(NOOP) == []


def test_frame_timeout_when_idle_does_nothing():
    session = logged_in()
    assert not session.in_frame
    assert session.frame_timeout() == []
    assert session.receive_data(NOOP) == [Send(OK)]


def test_partial_command_line_counts_as_unfinished():
    session = logged_in()
    session.receive_data(b"NO")
    assert session.in_frame
    assert session.frame_timeout()[-1] == Close()


def test_content_length_shorter_than_the_data_is_400_and_next_command_parses():
    actions = feed_three_ways(pub(NOOP, length=b"3"))
    assert wire(actions) == b"400 Bad request (Content-Length does not match the data)\r\n\r\n" + OK
    assert not durables(actions)


def test_spec_miscounted_content_length_is_rejected():
    """4.1.8.1 as printed (``Content-Length: 5`` for ``24.567``) is a framing error."""
    actions = feed_three_ways(pub(NOOP, length=b"5"))
    assert wire(actions).startswith(b"400 Bad request (Content-Length does not match")
    assert wire(actions).endswith(OK)


def test_missing_content_length_is_410():
    frame = b"PUB MESSAGE /a A1\r\n\r\nContent-Type: text/plain\r\n\r\nhello\r\n.\r\n"
    assert wire(feed_three_ways(frame + NOOP)) == b"410 Length required (Content-Length missing)\r\n\r\n" + OK


@pytest.mark.parametrize("length", [b"abc", b"-1", b"5 5", b"\xd9\xa5"])
def test_bad_content_length_is_400(length):
    actions = feed_three_ways(pub(NOOP, length=length))
    assert wire(actions).startswith(b"400 Bad request (")
    assert wire(actions).endswith(OK)


def test_duplicate_content_length_is_400():
    frame = (b"PUB MESSAGE /a A1\r\n\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n"
             b"hello\r\n.\r\n")
    assert wire(feed_three_ways(frame + NOOP)) == b"400 Bad request (bad Content-Length)\r\n\r\n" + OK


def test_missing_content_type_is_400():
    frame = b"PUB MESSAGE /a A1\r\n\r\nContent-Length: 5\r\n\r\nhello\r\n.\r\n"
    assert wire(feed_three_ways(frame + NOOP)) == b"400 Bad request (Content-Type missing)\r\n\r\n" + OK


def test_oversized_message_is_413_after_the_frame_and_next_command_parses():
    config = make_config(max_message_bytes=100)
    data = b"\r\n.\r\n".join([b"x" * 60] * 3)
    frame = (b"PUB MESSAGE /a A1\r\n\r\nContent-Type: a/b\r\nContent-Length: 60\r\n\r\n" + b"y" * 60 + b"\r\n"
             b"Content-Type: a/b\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data + b"\r\n.\r\n")
    actions = feed_three_ways(frame + NOOP, lambda: logged_in(config))
    assert wire(actions) == b"413 Entity too large (more than 100 data bytes)\r\n\r\n" + OK


def test_oversized_message_is_not_buffered():
    """20 MiB of data against a 1 MiB limit, fed in 64 KiB chunks: memory stays flat."""
    session = logged_in(make_config(max_message_bytes=1 << 20))
    size, chunk = 20 << 20, b"z" * (64 << 10)
    head = b"PUB MESSAGE /a A1\r\n\r\nContent-Type: a/b\r\nContent-Length: " + str(size).encode() + b"\r\n\r\n"
    assert session.receive_data(head) == []
    tracemalloc.start()
    try:
        for _ in range(size // len(chunk)):
            assert session.receive_data(chunk) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert session.receive_data(b"\r\n.\r\n" + NOOP) == [
        Send(b"413 Entity too large (more than 1048576 data bytes)\r\n\r\n"), Send(OK)]


def test_line_over_the_limit_is_400_then_next_command_works():
    actions = feed_three_ways(b"NOOP " + b"x" * 9000 + b"\r\n" + NOOP)
    assert wire(actions) == b"400 Bad request (line too long)\r\n\r\n" + OK


def test_header_line_over_the_limit_is_400_after_the_frame():
    config = make_config(max_line_bytes=64)
    actions = feed_three_ways(pub(NOOP, headers=b"Name: " + b"n" * 100 + b"\r\n"), lambda: logged_in(config))
    assert wire(actions) == b"400 Bad request (line too long)\r\n\r\n" + OK


def test_header_line_without_colon_is_400_and_discards_to_dot():
    actions = feed_three_ways(pub(NOOP, headers=b"Priority 1\r\n"))
    assert wire(actions) == b"400 Bad request (malformed header line)\r\n\r\n" + OK


def test_too_many_header_lines():
    config = make_config(max_header_lines=5)
    actions = feed_three_ways(pub(NOOP, headers=b"X-A: 1\r\n" * 5), lambda: logged_in(config))
    assert wire(actions) == b"400 Bad request (too many header lines)\r\n\r\n" + OK


@pytest.mark.parametrize("headers, reply", [
    (b"Priority: high\r\n", b"400 Bad request (bad Priority value)"),
    (b"Pri: -1\r\n", b"400 Bad request (bad Pri value)"),
    (b"Timeout: soon\r\n", b"400 Bad request (bad Timeout value)"),
    (b"Created: yesterday\r\n", b"400 Bad request (bad Created value)"),
])
def test_bad_attribute_values(headers, reply):
    actions = feed_three_ways(pub(NOOP, headers=headers))
    assert wire(actions) == reply + b"\r\n\r\n" + OK
    assert not durables(actions)


def test_pri_abbreviation_and_infinite_timeout_are_accepted():
    [durable] = feed_three_ways(pub(b"", headers=b"Pri: 7\r\nTimeout: INFINITE\r\n"))
    assert durable.event.priority == 7


@pytest.mark.parametrize("topic, reply", [
    (b"stocks", b"400 Bad request (must start with '/')"),
    (b"/stocks/9lives", b"400 Bad request (level '9lives' must be alphanumeric and not start with a digit)"),
    (b"/" + b"a" * 33, b"402 Topic too long (level '" + b"a" * 33 + b"' longer than 32)"),
])
def test_bad_topics(topic, reply):
    actions = feed_three_ways(pub(NOOP, topic=topic))
    assert wire(actions) == reply + b"\r\n\r\n" + OK


def test_bad_subscription_topics():
    actions = feed_three_ways(b"SUB MESSAGE /" + b"b" * 40 + b"\r\nSUB MESSAGE /a/Trash\r\nSUB MESSAGE\r\n")
    assert [a.data[:3] for a in actions] == [b"402", b"400", b"400"]


def test_eof_mid_frame_never_publishes():
    session = logged_in()
    assert session.receive_data(pub(b"")[:-5]) == []
    assert session.receive_data(b"") == []
    assert session.closed and not session.in_frame
    assert session.receive_data(b"\r\n.\r\n") == []


@pytest.mark.parametrize("smuggled", [
    b"\r\n.\r\nPUB MESSAGE /evil X1\r\n\r\n.\r\n",
    b"\n.\r\nQUIT\r\n",
    b"\n.\nQUIT\n",
    b"\r\n.\r\n",
])
def test_dot_inside_data_does_not_end_the_frame(smuggled):
    """Like aiosmtpd's test_smtpsmuggling: data is counted, never scanned."""
    data = b"before" + smuggled + b"after"
    actions = feed_three_ways(pub(NOOP, data=data))
    assert len(durables(actions)) == 1
    assert durables(actions)[0].event.sections[0].data == data
    assert wire(actions).endswith(OK)


def test_content_type_among_message_headers_starts_the_data_header():
    frame = b"PUB MESSAGE /a A1\r\nName: n\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi\r\n.\r\n"
    [durable] = feed_three_ways(frame)
    assert durable.event.headers == [("Name", "n")]
    assert durable.event.sections[0].data == b"hi"


def test_message_without_data_sections():
    [durable] = feed_three_ways(b"PUB MESSAGE /a A1\r\nName: n\r\n\r\n.\r\n")
    assert durable.event.sections == []
    [durable] = feed_three_ways(b"PUB MESSAGE /a A1\r\n.\r\n")
    assert durable.event.headers == []


def test_bare_lf_on_command_and_header_lines():
    frame = b"PUB MESSAGE /a A1\nName: n\n\nContent-Type: a/b\nContent-Length: 2\n\nhi\r\n.\n"
    [durable] = feed_three_ways(frame)
    assert durable.event.sections[0].data == b"hi"


def test_dot_in_data_header_ends_the_frame_with_400():
    frame = b"PUB MESSAGE /a A1\r\n\r\nContent-Type: a/b\r\n.\r\n"
    assert wire(feed_three_ways(frame + NOOP)) == b"400 Bad request (data header without data)\r\n\r\n" + OK


def test_too_many_bad_commands_closes():
    config = make_config(max_bad_commands=3)
    actions = feed_three_ways(b"BAD\r\n" * 5 + NOOP, lambda: logged_in(config))
    assert wire(actions) == (b"400 Bad request (unknown command)\r\n\r\n" * 3
                             + b"400 Bad request (too many bad commands, closing)\r\n\r\n")
    assert actions[-1] == Close()


def test_ack_with_nothing_pending_is_400():
    assert wire(feed_three_ways(b"310 ACK\r\n\r\n")) == b"400 Bad request (no NOTIFY awaits acknowledgement)\r\n\r\n"


def test_second_notify_before_the_ack_is_our_bug():
    session = logged_in()
    session.notify(example_deliver())
    with pytest.raises(SessionMisuse):
        session.notify(example_deliver())
    with pytest.raises(SessionMisuse):
        make_session().notify(example_deliver())


@pytest.mark.parametrize("commands, codes", [
    (b"LOGIN jtegen\r\n", [b"400"]),
    (b"LOGIN a/b CLEAR/1.0\r\n", [b"400"]),
    (b"LOGIN jtegen CLEAR\r\n", [b"400"]),
    (b"PASS jtegen rowe7kuy\r\n", [b"400"]),
    (b"LOGIN jtegen CLEAR/1.0\r\nPASS other rowe7kuy\r\n", [b"200", b"400"]),
    (b"LOGIN nobody CLEAR/1.0\r\nPASS nobody x\r\n", [b"200", b"404"]),
    (b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen wrong\r\nPASS jtegen rowe7kuy\r\n", [b"200", b"401", b"400"]),
    (b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen a b\r\n", [b"200", b"400"]),
])
def test_login_errors(commands, codes):
    actions = feed_three_ways(commands, make_session)
    assert [a.data[:3] for a in actions] == codes


def test_login_commands_after_login_are_400():
    actions = feed_three_ways(b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\nNOOP x\r\nQUIT now\r\n")
    assert wire(actions) == (b"400 Bad request (already logged in)\r\n\r\n" * 2
                             + b"400 Bad request (usage: NOOP)\r\n\r\n400 Bad request (usage: QUIT)\r\n\r\n")


def test_commands_are_case_insensitive_and_pipelined():
    actions = feed_three_ways(b"login jtegen clear/1.0\r\npass jtegen rowe7kuy\r\n"
                              b"create topic /a/b\r\nsub mess /A/b\r\nunsubscribe message /a/B\r\nnoop\r\nquit\r\nNOOP\r\n", make_session)
    kinds = [type(a).__name__ for a in actions]
    assert kinds == ["Send", "Send", "LoggedIn", "Control", "Send", "Control", "Send", "Control", "Send",
                     "Send", "Send", "Close"]
    assert actions[2] == LoggedIn("jtegen", "jtegen0456")
    assert actions[5].event.pattern == "/a/b"


@settings(max_examples=300, deadline=None, database=None)
@example([b"SUB SERVER TIMEOUT\r\n"])  # its NOTIFY SERVER TIMEOUT is a notification, not a reply
@example([b"SET LOGIN PASSWORD CLEAR/\n", b"SET LOGIN PASSWORD CLEAR/\n"])  # "+ new password": a continuation
@given(st.lists(st.one_of(st.binary(max_size=40),
                          st.sampled_from([b"\r\n", b".\r\n", b"PUB MESSAGE /a A1\r\n", b"Content-Length: 3\r\n",
                                           b"Content-Type: a/b\r\n", b"310 ACK\r\n", b"SUB MESS /a\r\n"])),
                max_size=30))
def test_arbitrary_input_only_ever_gets_well_formed_replies(pieces):
    session = logged_in(make_config(max_line_bytes=32, max_header_lines=8, max_message_bytes=64))
    for action in session.receive_data(b"".join(pieces)) + session.frame_timeout():
        reply = action.data if isinstance(action, Send) else action.reply if isinstance(action, Durable) else None
        if reply is not None and not reply.startswith(b"NOTIFY "):
            # a reply code, or a continuation the exchange asks for ("+ new password", spec 4.1.6.2)
            assert (reply[:3].isdigit() or reply.startswith(b"+ ")) and reply.endswith(b"\r\n\r\n")


def test_control_characters_in_header_lines_are_refused():
    """A bare CR inside a value could split the line again when a NOTIFY is rendered."""
    actions = feed_three_ways(pub(NOOP, headers=b"Name: a\rSmuid: forged\r\n"))
    assert wire(actions) == b"400 Bad request (malformed header line)\r\n\r\n" + OK


def test_control_characters_in_a_command_line_are_refused():
    """Found by the fuzz: a stray CR inside a command must never reach a reply line."""
    actions = feed_three_ways(b"FIND TOPIC /a BL\rUE\r\nNOOP\x00\r\nNOOP\r\n")
    assert wire(actions) == b"400 Bad request (control character in command)\r\n\r\n" * 2 + b"200 OK\r\n\r\n"
