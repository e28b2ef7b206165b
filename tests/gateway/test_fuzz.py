"""A bounded property-based fuzz of the sans-I/O core.

Random bytes and mutations of valid commands (every verb and resource) are fed
to a logged-in session whose registry answers as the gateway's would.  The
core must never raise, must answer everything with a well-formed reply (a
reply code, or the ``+`` continuation of SET LOGIN PASSWORD) or a clean
close, and must stay usable: a few NOOPs afterwards get ``200 OK`` unless
the session was closed.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.protocol import Close, Control, Durable, Send
from schemas.events import CONTROL_TYPES

from tests.gateway.test_feeding import logged_in, make_config, run

VALID = [
    b"COUNT TOPIC /news\r\n", b"COUNT MESSAGE /stocks/quotes/ibm\r\n", b"COUNT SUB /stocks/*\r\n",
    b"LIST TOPIC /\r\n", b"LIST MESSAGES /stocks/quotes/ibm\r\n", b"LIST SUBSCRIPTIONS\r\n",
    b"CREATE TOPIC /stocks/ibm (IBM,BIG BLUE) > /stocks/quotes/ibm\r\n", b"CREATE TOPIC /x/y\r\n",
    b"REMOVE TOPIC /x/y\r\n", b"REM TOPIC /news\r\n", b"SET TOPIC NAME /chat /talk\r\n",
    b"SET TOPIC KEYWORD /news (A,B)\r\n", b"SET LOGIN NAME Jayne Smith\r\n", b"SET LOGIN PASSWORD CLEAR/1.0\r\n",
    b"rowe7kuy\r\n", b"SET NOTIFY SUSPEND\r\n", b"SET NOTIFY RESUME /news\r\n", b"SET NOTIFY PORT 7000\r\n",
    b"FIND TOPIC /stocks/* BLUE\r\n", b"GET MESSAGE /stocks/quotes/ibm 1845-1890,1905\r\n",
    b"GET TOPIC KEYWORDS /news\r\n", b"SUB MESSAGE /stocks/quotes/ibm SINCE D20010915T080000\r\n",
    b"SUB TOPIC /stocks/*\r\n", b"SUB SUB /news\r\n", b"SUB SERVER TIMEOUT\r\n", b"UNSUB MESSAGE *\r\n",
    b"UNSUB TOPIC /stocks/*\r\n", b"UNSUB *\r\n", b"310 ACK\r\n", b"NOOP\r\n", b"QUIT\r\n",
    b"PUB MESSAGE /stocks/quotes/ibm A1\r\nPriority: 3\r\n\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nabc\r\n.\r\n",
    b"PUB REPLY /news R1\r\nCmuid: jtegen/g/A1\r\n\r\n.\r\n",
    b"\r\n",
]


@st.composite
def mutated(draw) -> bytes:
    """A valid command with a few bytes flipped, cut, doubled or case-swapped."""
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "cut", "double", "case", "insert"]))
        if kind == "flip":
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:]
        elif kind == "double":
            data[at:at] = data[at:]
        elif kind == "case":
            data[at:at + 1] = bytes(data[at:at + 1]).swapcase()
        else:
            data[at:at] = draw(st.sampled_from([b"\r\n", b" ", b"/*", b"-", b",", b"(", b">", b".\r\n", b"\x00"]))
    return bytes(data)


def well_formed(reply: bytes) -> bool:
    return (reply[:3].isdigit() and reply.endswith(b"\r\n\r\n")) or reply == b"+ new password\r\n\r\n" \
        or reply.startswith(b"NOTIFY SERVER TIMEOUT ")


@settings(max_examples=2500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(mutated(), st.binary(max_size=24)), max_size=12), st.integers(1, 7))
def test_mutated_frames_only_ever_get_reply_codes_or_a_clean_close(pieces, chunk):
    session = logged_in(make_config(max_line_bytes=128, max_header_lines=8, max_message_bytes=64))
    data = b"".join(pieces)
    actions = run(session, [data[i:i + chunk] for i in range(0, len(data), chunk)])
    actions += session.frame_timeout()
    for action in actions:
        if isinstance(action, Send):
            assert well_formed(action.data), action.data
        elif isinstance(action, Durable):
            assert well_formed(action.reply)
    closes = [i for i, a in enumerate(actions) if isinstance(a, Close)]
    assert closes in ([], [len(actions) - 1]), "nothing may follow a close"
    assert session.closed == bool(closes)
    if not session.closed:
        after = run(session, [b"NOOP\r\n" * 3])
        assert after[-1] == Send(b"200 OK\r\n\r\n") or session.closed
    assert all(type(a.event) in CONTROL_TYPES for a in actions if isinstance(a, Control))
