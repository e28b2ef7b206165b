"""Federation in the sans-I/O core (issue 33): what a forwarded message looks like in a NOTIFY and
how it is acknowledged, Depth and Hops on PUB, remote virtual topics, CONNECTTO.

The sessions run on the real :class:`gateway.registry.Registry` and :class:`gateway.ual.AccessList`;
a :class:`CheckRemote` is answered by the test, as the gateway would after asking the other farm."""

from __future__ import annotations

from gateway.protocol.actions import CheckRemote, Control, Durable, Send
from gateway.protocol.rendering import render_notify, render_stored
from gateway.replies import NOT_FOUND, Reply, UNAUTHORIZED
from gateway.server.message_store import StoredMessage
from gateway.ual import AccessList
from schemas.config import FederationConfig, LinkConfig
from schemas.events import CreateTopic, Deliver, Section

from tests.gateway.test_feeding import make_registry, make_session, resolve, run, wire

LOGINS = {"jtegen": b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n",
          "guest": b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n"}
#: jtegen may reach other servers; nobody else may.  Everything else is open.
ACCESS = AccessList({"/": {"remote": ["jtegen"]}})
FEDERATION = FederationConfig(links=[LinkConfig("b.example", "127.0.0.1:7721", account="afarm",
                                                accounts={"jtegen": "JTEGEN_AT_B"})])


def session_as(account: str, registry=None, access=ACCESS, federation=FEDERATION):
    session = make_session(registry=registry or make_registry(), access=access, federation=federation)
    run(session, [LOGINS[account]])
    assert session.account == account
    return session


def answer(session, command: bytes) -> bytes:
    return wire(run(session, [command]))


def forwarded(**fields) -> Deliver:
    """Smuid 5 here, a message farm b.example forwarded (its SMUID there 77), one farm to go."""
    values = dict(account="jtegen", smuid=5, topic="/stocks/ibm", cmuid="A1", publisher="b.example",
                  publisher_guid="link", accepted_at=0, headers=[("Guarantee", "YES")],
                  sections=[Section([("Content-Length", "2")], b"42")], depth=1, hops=["b.example"],
                  origin="b.example/77", origin_topic="b.example/stocks/ibm")
    values.update(fields)
    return Deliver(**values)


# -- NOTIFY MESSAGE of a forwarded message, and its 310 ACK


def test_a_forwarded_message_is_notified_by_its_origin_name_with_its_route():
    lines = render_notify(forwarded(), "www.host.com").split(b"\r\n")
    assert lines[0] == b"NOTIFY MESSAGE b.example/stocks/ibm"  # spec 2.3: the origin server's domain first
    assert lines[2] == b"Smuid: b.example/77"
    assert lines[4:7] == [b"Depth: 1", b"Hops: b.example", b"Guarantee: YES"]


def test_a_local_message_shows_its_depth_only_when_it_may_leave_and_no_hops():
    local = forwarded(origin=None, origin_topic=None, hops=[], depth=0, headers=[("Depth", "0")])
    lines = render_notify(local, "www.host.com").split(b"\r\n")
    assert lines[0] == b"NOTIFY MESSAGE /stocks/ibm" and lines[2] == b"Smuid: www.host.com/5"
    assert not [line for line in lines if line.startswith((b"Depth", b"Hops"))]
    lines = render_notify(forwarded(origin=None, origin_topic=None, hops=[], depth=-1), "www.host.com").split(b"\r\n")
    assert lines[4] == b"Depth: -1"


def test_a_notify_of_a_forwarded_message_is_acknowledged_by_the_smuid_it_showed():
    session = session_as("jtegen")
    session.notify(forwarded())
    assert answer(session, b"310 ACK c.example/77\r\n") == \
        b"404 Not found (no NOTIFY of Smuid c.example/77 awaits acknowledgement)\r\n\r\n"
    [ack] = run(session, [b"310 ACK b.example/77\r\n"])
    assert isinstance(ack, Durable) and ack.event.smuid == 5  # the delivery here is acknowledged
    assert ack.reply == b"310 ACK b.example/77\r\n\r\n"
    assert session.awaiting_ack is None


def test_a_stored_forwarded_message_shows_its_origin_too():
    message = StoredMessage(5, "/quotes/ibm", "A1", "b.example", "link", 0, 0, [], [],
                            depth=0, hops=("b.example",), origin="b.example/77", origin_topic="b.example/stocks/ibm")
    text = render_stored(message, "www.host.com").split(b"\r\n")
    assert text[0] == b"Topic: b.example/stocks/ibm"
    assert text[2:5] == [b"Smuid: b.example/77", b"Cmuid: b.example/link/A1", b"Hops: b.example"]


# -- Depth and Hops on PUB


def pub(headers: bytes) -> bytes:
    return (b"PUB MESSAGE /news A1\r\n" + headers
            + b"\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi\r\n.\r\n")


def test_depth_is_a_number_of_servers_and_hops_are_the_servers_own():
    jtegen = session_as("jtegen")
    for bad in (b"Depth: x\r\n", b"Depth: -2\r\n", b"Depth: 1.5\r\n"):
        assert answer(jtegen, pub(bad)) == (b"400 Bad request (Depth is a whole number of servers: 0 (this one "
                                            b"only, the default), n, or -1 (no limit))\r\n\r\n")
    assert answer(jtegen, pub(b"Hops: a.example\r\n")) == \
        b"400 Bad request (Hops is set by the servers a message passes, never by its publisher)\r\n\r\n"


def test_a_depth_other_than_0_needs_the_remote_right_and_is_carried_by_the_publish():
    guest = session_as("guest")
    assert run(guest, [pub(b"Depth: 2\r\n")]) == [Send(
        b"401 Unauthorized (no remote permission on /news: a Depth other than 0 forwards beyond this server)\r\n\r\n")]
    [durable] = run(guest, [pub(b"Depth: 0\r\n")])  # stays here: anyone may
    assert durable.event.depth == 0
    jtegen = session_as("jtegen")
    for text, depth in ((b"2", 2), (b"-1", -1)):
        [durable] = run(jtegen, [pub(b"Depth: " + text + b"\r\n")])
        assert durable.event.depth == depth and durable.event.hops == [] and durable.event.origin is None
    [durable] = run(jtegen, [pub(b"")])
    assert durable.event.depth == 0  # spec: no Depth attribute is 0


# -- remote virtual topics


def create_remote(session, line: bytes = b"CREATE TOPIC /quotes/ibm > B.Example/stocks/IBM\r\n"):
    return resolve(session, session.receive_data(line))


def test_a_remote_link_is_made_once_the_other_farm_lets_the_login_read_its_target():
    session = session_as("jtegen")
    [check] = create_remote(session)
    assert isinstance(check, CheckRemote)
    assert (check.domain, check.topic, check.account) == ("b.example", "/stocks/ibm", "jtegen")
    created = resolve(session, check.then(Reply.ok()))
    assert wire(created) == b"200 OK\r\n\r\n"
    assert isinstance(created[0], Control) and created[0].event.target == "b.example/stocks/ibm"
    assert answer(session, b"LIST TOPIC /quotes\r\n") == b"200-OK\r\n200 /quotes/ibm > b.example/stocks/ibm\r\n\r\n"
    assert session.registry.remote_links() == [("/quotes/ibm", "b.example", "/stocks/ibm", "jtegen")]


def test_the_other_farms_refusal_is_the_reply_and_nothing_is_created():
    for refusal in (Reply.error(UNAUTHORIZED, "jtegen may not read /stocks/ibm at b.example"),
                    Reply.error(NOT_FOUND, "no topic /stocks/ibm at b.example")):
        session = session_as("jtegen")
        [check] = create_remote(session)
        assert resolve(session, check.then(refusal)) == [Send(refusal.to_bytes())]
        assert not session.registry.live("/quotes/ibm")


def test_a_remote_link_needs_the_remote_right_a_configured_link_and_a_good_target():
    assert answer(session_as("guest"), b"CREATE TOPIC /quotes/ibm > b.example/stocks/ibm\r\n") == \
        b"401 Unauthorized (no remote permission on /quotes/ibm)\r\n\r\n"
    jtegen = session_as("jtegen")
    assert answer(jtegen, b"CREATE TOPIC /quotes/ibm > c.example/stocks/ibm\r\n") == \
        b"404 Not found (c.example: no link to that farm is configured here)\r\n\r\n"
    assert answer(jtegen, b"CREATE TOPIC /quotes/ibm > b_example!/stocks/ibm\r\n").startswith(b"400 ")
    assert answer(jtegen, b"CREATE TOPIC /quotes/ibm > b.example/stocks/*\r\n").startswith(b"400 ")


def linked_session(account: str = "jtegen", access=ACCESS):
    registry = make_registry(["/news"])
    registry.apply(CreateTopic("r", "jtegen", "/quotes/ibm", 0, target="b.example/stocks/ibm"), registry.applied + 1)
    return session_as(account, registry=registry, access=access)


def test_a_remote_link_is_subscribed_to_itself_and_never_published_to():
    # a UAL with entries: a remote target must never be judged as a local path
    access = AccessList({"/": {"remote": ["jtegen"]}, "/quotes": {"subscribe": ["jtegen", "guest"]}})
    session = linked_session(access=access)
    assert answer(session, b"SUB MESSAGE /quotes/ibm\r\n") == b"200-OK\r\n200 /quotes/ibm\r\n\r\n"
    assert session.may_read("/quotes/ibm")
    assert answer(session, pub(b"").replace(b"/news", b"/quotes/ibm")) == (
        b"405 Not allowed (/quotes/ibm links to another farm: publishing to a remote topic is not supported)\r\n\r\n")


# -- CONNECTTO (2002)


def test_connectto_answers_for_a_configured_link_only_and_never_takes_a_password():
    jtegen = session_as("jtegen")
    assert answer(jtegen, b"CONNECTTO afarm/b.example 127.0.0.1:7721\r\n") == (
        b"200-OK\r\n200 link to b.example as afarm at 127.0.0.1:7721 is configured; "
        b"the link process keeps it up\r\n\r\n")
    assert answer(jtegen, b"CONNECTTO afarm/B.EXAMPLE 7721\r\n").startswith(b"200-OK")
    for unknown in (b"CONNECTTO other/b.example 7721\r\n", b"CONNECTTO afarm/c.example 7721\r\n",
                    b"CONNECTTO afarm/b.example 10.0.0.9:7721\r\n", b"CONNECTTO afarm/b.example 7722\r\n"):
        assert answer(jtegen, unknown).startswith(b"404 Not found (no link to ")
    for bad in (b"CONNECTTO afarm 7721\r\n", b"CONNECTTO afarm/b.example\r\n", b"CONNECTTO /b.example 7721\r\n",
                b"CONNECTTO afarm/b.example host:port\r\n", b"CONNECTTO afarm/b.example 70000\r\n"):
        assert answer(jtegen, bad) == (b"400 Bad request (usage: CONNECTTO <account>/<channel> "
                                       b"[<address>:]<port>)\r\n\r\n")
    assert answer(session_as("guest"), b"CONNECTTO afarm/b.example 7721\r\n") == \
        b"401 Unauthorized (no remote permission: linking to other servers)\r\n\r\n"
