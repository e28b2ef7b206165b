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

from deploy.frame_strategies import frames
from gateway.protocol.actions import Close, Control, Durable, Send
from schemas.events import CONTROL_TYPES

from tests.gateway.test_feeding import logged_in, make_config, run


def well_formed(reply: bytes) -> bool:
    return (reply[:3].isdigit() and reply.endswith(b"\r\n\r\n")) or reply == b"+ new password\r\n\r\n" \
        or reply.startswith(b"NOTIFY SERVER TIMEOUT ")


@settings(max_examples=2500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(frames, max_size=12), st.integers(1, 7))
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
