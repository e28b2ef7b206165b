"""SET NOTIFY WINDOW (our pipelining extension) in the sans-I/O session: up to n guaranteed
NOTIFYs await their 310 ACK, ``310 ACK <smuid>`` names the one acknowledged; window 1 stays
the spec's two-phase commit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.protocol.actions import Durable, Send, SessionMisuse, Wake
from gateway.protocol.rendering import render_notify
from schemas.events import Ack
from tests.gateway.test_feeding import feed_three_ways, logged_in, make_config, make_session, wire
from tests.gateway.test_spec_examples import SPEC_MICROS, example_deliver


def deliver(smuid: int, guaranteed: bool = True):
    return replace(example_deliver(headers=[] if guaranteed else [("Guarantee", "NO")]), smuid=smuid)


def windowed(n: int, notified=()):
    """A logged-in session at window ``n`` that has sent the NOTIFYs of ``notified``."""
    session = logged_in()
    assert wire(session.receive_data(f"SET NOTIFY WINDOW {n}\r\n".encode())) == b"200 OK\r\n\r\n"
    for smuid in notified:
        session.notify(deliver(smuid))
    return session


def ack_of(smuid: int, reply: bytes) -> Durable:
    return Durable(Ack("jtegen", "jtegen0456", smuid, SPEC_MICROS), b"jtegen", reply)


def test_set_notify_window_replies_200_and_wakes_the_sender():
    """The reply, then a Wake so the I/O layer sends what the larger window now allows."""
    actions = feed_three_ways(b"SET NOTIFY WINDOW 100\r\n")
    assert actions == [Send(b"200 OK\r\n\r\n"), Wake()]


def test_n_notifies_go_out_before_any_ack_and_no_more():
    session = windowed(3, [11, 12, 13])
    assert session.awaiting == (11, 12, 13)
    with pytest.raises(SessionMisuse):
        session.notify(deliver(14))


def test_acks_by_smuid_in_any_order_acknowledge_exactly_the_named_notify():
    def session():
        return windowed(3, [11, 12, 13])

    client = b"310 ACK www.host.com/12\r\n\r\n310 ACK www.host.com/11\r\n\r\n"
    actions = feed_three_ways(client, session)
    assert actions == [ack_of(12, b"310 ACK www.host.com/12\r\n\r\n"),
                       ack_of(11, b"310 ACK www.host.com/11\r\n\r\n")]
    state = session()
    state.receive_data(client)
    assert state.awaiting == (13,)
    state.notify(deliver(14))  # two free places in the window again
    state.notify(deliver(15))
    assert state.awaiting == (13, 14, 15)


def test_a_plain_ack_in_a_window_acknowledges_the_oldest():
    session = windowed(3, [11, 12, 13])
    assert session.receive_data(b"310 ACK www.host.com/11\r\n") == [ack_of(11, b"310 ACK www.host.com/11\r\n\r\n")]
    assert session.receive_data(b"310 ACK\r\n") == [ack_of(12, b"310 ACK\r\n\r\n")]
    assert session.awaiting == (13,)


@pytest.mark.parametrize("named", ["www.host.com/99", "www.host.com/11x", "other.host/12", "12"])
def test_an_ack_naming_a_notify_that_awaits_none_is_404_and_acknowledges_nothing(named):
    session = windowed(3, [11, 12])
    actions = session.receive_data(f"310 ACK {named}\r\n".encode())
    assert wire(actions) == f"404 Not found (no NOTIFY of Smuid {named} awaits acknowledgement)\r\n\r\n".encode()
    assert session.awaiting == (11, 12)


def test_an_ack_of_an_already_acknowledged_smuid_is_404():
    session = windowed(2, [11])
    session.receive_data(b"310 ACK www.host.com/11\r\n")
    assert wire(session.receive_data(b"310 ACK www.host.com/11\r\n")).startswith(b"404 Not found")


def test_window_one_is_unchanged_and_takes_the_smuid_form_too():
    """Without SET NOTIFY WINDOW: one NOTIFY at a time, the plain ACK answered plainly; the
    SMUID form works there as well and is answered in kind."""
    session = logged_in()
    assert session.notify_window == 1
    session.notify(deliver(11))
    with pytest.raises(SessionMisuse):
        session.notify(deliver(12))
    assert session.receive_data(b"310 ACK\r\n") == [ack_of(11, b"310 ACK\r\n\r\n")]
    session.notify(deliver(12))
    assert session.receive_data(b"310 ACK www.host.com/12\r\n") == [ack_of(12, b"310 ACK www.host.com/12\r\n\r\n")]
    assert session.awaiting == ()


def test_unguaranteed_notifies_do_not_take_a_place_in_the_window():
    session = windowed(2, [11])
    session.notify(deliver(12, guaranteed=False))
    session.notify(deliver(13))
    assert session.awaiting == (11, 13)


def test_lowering_the_window_below_what_awaits_holds_back_the_next_notify():
    session = windowed(3, [11, 12, 13])
    session.receive_data(b"SET NOTIFY WINDOW 2\r\n")
    session.receive_data(b"310 ACK www.host.com/11\r\n")
    with pytest.raises(SessionMisuse):  # still two await: the window is full
        session.notify(deliver(14))
    session.receive_data(b"310 ACK www.host.com/13\r\n")
    session.notify(deliver(14))


@pytest.mark.parametrize("line, reply", [
    (b"SET NOTIFY WINDOW\r\n", b"400 Bad request (usage: SET NOTIFY WINDOW <n>, 1 <= n <= 50)\r\n\r\n"),
    (b"SET NOTIFY WINDOW ten\r\n", b"400 Bad request (usage: SET NOTIFY WINDOW <n>, 1 <= n <= 50)\r\n\r\n"),
    (b"SET NOTIFY WINDOW -3\r\n", b"400 Bad request (usage: SET NOTIFY WINDOW <n>, 1 <= n <= 50)\r\n\r\n"),
    (b"SET NOTIFY WINDOW 5 6\r\n", b"400 Bad request (usage: SET NOTIFY WINDOW <n>, 1 <= n <= 50)\r\n\r\n"),
    (b"SET NOTIFY WINDOW 0\r\n", b"400 Bad request (window 0 is not between 1 and 50)\r\n\r\n"),
    (b"SET NOTIFY WINDOW 51\r\n", b"400 Bad request (window 51 is not between 1 and 50)\r\n\r\n"),
])
def test_set_notify_window_errors_leave_the_window_as_it_was(line, reply):
    """A bad n (not a number, outside 1..[gateway] max_notify_window) is a 400 syntax error."""
    config = make_config(max_notify_window=50)
    assert wire(feed_three_ways(line, lambda: logged_in(config))) == reply
    session = logged_in(config)
    session.receive_data(line)
    assert session.notify_window == 1


def test_set_notify_window_before_login_is_401():
    assert wire(feed_three_ways(b"SET NOTIFY WINDOW 10\r\n", make_session)).startswith(b"401 ")


def test_max_notify_window_must_be_positive():
    with pytest.raises(ValueError, match="max_notify_window"):
        make_config(max_notify_window=0)


def test_a_notify_rendered_for_another_login_is_sent_as_is_and_awaits_its_ack_all_the_same():
    """The gateway renders a message fanned out to many logins once: the frame does not depend on
    the account, and the session takes it instead of rendering again."""
    other = windowed(2, [11])
    frame = other.notify(deliver(12))
    session = windowed(2)
    assert session.notify(deliver(12), frame) is frame
    assert session.awaiting == (12,)
    assert frame == render_notify(deliver(12), make_config().server_host)
