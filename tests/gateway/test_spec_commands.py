"""Spec section 4.1's example exchanges for the commands that read or change the
registry (COUNT, LIST, CREATE, REMOVE, SET, FIND, GET, SUB/UNSUB TOPIC and
SUBSCRIBER, SUB SERVER), each fed three ways, plus every reply code their
sections list.  The registry is the real :class:`gateway.registry.Registry`,
folded by the test driver as the gateway folds it."""

from __future__ import annotations

import copy

import pytest

from gateway.server.message_store import StoredMessage
from gateway.protocol.actions import ConnectNotify, Control, Send, Wake
from gateway.protocol.arguments import parse_ranges
from gateway.protocol.rendering import format_ranges
from gateway.registry import SubscribersChanged, TopicChanged
from schemas.events import CreateTopic, Deliver, RemoveTopic, Section, SetLogin, Subscribe
from schemas.queue_params import TopicSettings

from tests.gateway.test_feeding import (
    feed_three_ways,
    logged_in,
    make_registry,
    make_session,
    run,
    transcript,
    wire,
)

OK = b"200 OK\r\n\r\n"


def session_with(*topics: str, registry=None):
    """A logged-in session whose registry holds ``topics`` (and nothing else)."""
    registry = registry or make_registry(topics)
    return lambda: _logged_in(copy.deepcopy(registry))


def _logged_in(registry):
    session = make_session(registry=registry)
    run(session, [b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n"])
    return session


def exchange(text: str, factory) -> bytes:
    """Feed a transcript's client side three ways; return what the server wrote."""
    client, server = transcript(text)
    got = wire(feed_three_ways(client, factory))
    assert got == server
    return got


# -- COUNT (4.1.2)


def test_count_topic_example():
    """4.1.2.1: ``COUNT TOPIC /news`` → 2 (Trash and other system topics never count)."""
    exchange("""
        C: COUNT TOPIC /news
        C:
        S: 200-OK
        S: 200 2
        S:
    """, session_with("/news/us", "/news/europe", "/stocks"))


def test_count_topic_wildcard_traverses_all_descendants():
    factory = session_with("/news/us/ca", "/news/us/ny", "/news/europe")
    assert wire(feed_three_ways(b"COUNT TOPIC /news/*\r\n", factory)) == b"200-OK\r\n200 4\r\n\r\n"


def test_count_message_example():
    """4.1.2.2: the messages the server holds for the topic (the Delta messages table)."""
    def factory():
        session = session_with("/stock/quote/ibm")()
        session.stored["/stock/quote/ibm"] = [stored(n, "/stock/quote/ibm") for n in range(45)]
        return session
    exchange("""
        C: COUNT MESSAGE /stock/quote/ibm
        C:
        S: 200-OK
        S: 200 45
        S:
    """, factory)


def test_count_subscribers_example():
    """4.1.2.3 (``COUNT SUB``): accounts subscribed, exactly or by a wildcard."""
    registry = make_registry(["/stock/quote/ibm"])
    for n, pattern in enumerate(["/stock/quote/ibm", "/stock/*", "/stock/quote/ibm"]):
        registry.apply(Subscribe(f"user{n}", "g", pattern, 0), registry.applied + 1)
    exchange("""
        C: COUNT SUB /stock/quote/ibm
        C:
        S: 200-OK
        S: 200 3
        S:
    """, session_with(registry=registry))


@pytest.mark.parametrize("command, reply", [
    (b"COUNT TOPIC /nowhere", b"404 Not found (/nowhere)"),
    (b"COUNT TOPIC", b"400 Bad request (usage: COUNT TOPIC|MESSAGE|SUBSCRIBERS <topic>)"),
    (b"COUNT PEOPLE /news", b"400 Bad request (usage: COUNT TOPIC|MESSAGE|SUBSCRIBERS <topic>)"),
    (b"COUNT TOPIC /1news", b"400 Bad request (level '1news' must be alphanumeric and not start with a digit)"),
])
def test_count_reply_codes(command, reply):
    assert wire(feed_three_ways(command + b"\r\n", session_with("/news"))) == reply + b"\r\n\r\n"


def test_count_before_login_is_401():
    assert wire(feed_three_ways(b"COUNT TOPIC /news\r\n", make_session)) == b"401 Unauthorized (LOGIN first)\r\n\r\n"


# -- LIST (4.1.3)


def test_list_topic_example_with_a_virtual_topic():
    """4.1.3.1: children of ``/``, a virtual topic shown as ``path > target``."""
    registry = make_registry(["/stocks", "/info/news/cnn", "/weather"])
    registry.apply(CreateTopic("r", "admin", "/news", 0, target="/info/news/cnn"), registry.applied + 1)
    exchange("""
        C: LIST TOPIC /
        C:
        S: 200-OK
        S: 200-/info
        S: 200-/news > /info/news/cnn
        S: 200-/stocks
        S: 200 /weather
        S:
    """, session_with(registry=registry))


def test_list_message_example_prints_ranges():
    """4.1.3.2: ``1809-1812,1845,1850-1890``."""
    smuids = [*range(1809, 1813), 1845, *range(1850, 1891)]

    def factory():
        session = session_with("/stocks/quotes/ibm")()
        session.stored["/stocks/quotes/ibm"] = [stored(n, "/stocks/quotes/ibm") for n in smuids]
        return session
    exchange("""
        C: LIST MESSAGES /stocks/quotes/ibm
        C:
        S: 200-OK
        S: 200 1809-1812,1845,1850-1890
        S:
    """, factory)


def test_list_subscriptions_example():
    """4.1.3.2 (LIST SUBSCRIPTIONS): what this account is subscribed to, kept across QUIT."""
    factory = session_with("/stocks/quotes/ibm", "/stocks/quotes/msft")

    def subscribed():
        session = factory()
        run(session, [b"SUB MESSAGE /stocks/quotes/msft\r\nSUB MESSAGE /stocks/quotes/ibm\r\n"])
        return session
    exchange("""
        C: LIST SUBSCRIPTIONS
        C:
        S: 200-OK
        S: 200-/stocks/quotes/ibm
        S: 200 /stocks/quotes/msft
        S:
    """, subscribed)


def test_list_reply_codes():
    factory = session_with("/news")
    assert wire(feed_three_ways(b"LIST TOPIC /nope\r\nLIST MESSAGE /nope\r\nLIST\r\nLIST TOPIC /news\r\n", factory)) == (
        b"404 Not found (/nope)\r\n\r\n404 Not found (/nope)\r\n\r\n"
        b"400 Bad request (usage: LIST TOPIC <topic> | LIST MESSAGE <topic> | LIST SUBSCRIPTIONS)\r\n\r\n" + OK)


# -- CREATE (4.1.4)


def test_create_topic_examples():
    """4.1.4: plain, with keywords, virtual, virtual with keywords.  (Keywords first: creating
    ``/stocks/ibm/quote`` creates its missing parent ``/stocks/ibm``, which then exists.)"""
    client, server = transcript("""
        C: CREATE TOPIC /stocks/quotes/ibm
        C:
        S: 200 OK
        S:
        C: CREATE TOPIC /stocks/ibm (IBM,STOCKS,QUOTE,BIG BLUE)
        C:
        S: 200 OK
        S:
        C: CREATE TOPIC /stocks/ibm/quote > /stocks/quotes/ibm
        C:
        S: 200 OK
        S:
        C: CREATE TOPIC /stocks/bigblue (BIG BLUE) > /stocks/quotes/ibm
        C:
        S: 200 OK
        S:
    """)
    actions = feed_three_ways(client, session_with())
    assert wire(actions) == server
    events = [a.event for a in actions if isinstance(a, Control)]
    assert events[1] == CreateTopic("r2", "jtegen", "/stocks/ibm", 998577912460000, ["IBM", "STOCKS", "QUOTE", "BIG BLUE"])
    assert events[2].target == "/stocks/quotes/ibm"
    assert (events[3].keywords, events[3].target) == (["BIG BLUE"], "/stocks/quotes/ibm")


@pytest.mark.parametrize("command, reply", [
    (b"CREATE TOPIC /news", b"409 Conflict (/news exists)"),
    (b"CREATE TOPIC /x > /x", b"409 Conflict (a topic cannot link to itself)"),
    (b"CREATE TOPIC /x > /missing", b"404 Not found (destination topic /missing)"),
    (b"CREATE TOPIC /x > /link", b"405 Not allowed (topic link bad: the target is itself virtual)"),
    (b"CREATE TOPIC /accounts/jtegen", b"405 Not allowed (account topics are created with their accounts)"),
    (b"CREATE TOPIC /news/Trash", b"400 Bad request ('Trash' is reserved)"),
    (b"CREATE TOPIC /news/9lives", b"400 Bad request (level '9lives' must be alphanumeric and not start with a digit)"),
    (b"CREATE TOPIC /news/" + b"a" * 33, b"402 Topic too long (level '" + b"a" * 33 + b"' longer than 32)"),
    (b"CREATE TOPIC news", b"400 Bad request (must start with '/')"),
    (b"CREATE QUEUE /x", b"400 Bad request (usage: CREATE TOPIC <topic> [(keyword,...)] [> <target-topic>])"),
])
def test_create_topic_reply_codes(command, reply):
    registry = make_registry(["/news"])
    registry.apply(CreateTopic("r", "admin", "/link", 0, target="/news"), registry.applied + 1)
    assert wire(feed_three_ways(command + b"\r\n", session_with(registry=registry))) == reply + b"\r\n\r\n"


def test_create_topic_beyond_the_children_limit_is_414():
    registry = make_registry(["/a/b", "/a/c"])
    registry.max_children = 2
    assert wire(feed_three_ways(b"CREATE TOPIC /a/d\r\n", session_with(registry=registry))) == \
        b"414 Resource too large (too many topics under /a)\r\n\r\n"


def test_create_makes_missing_ancestors_and_announces_each():
    registry = make_registry([])
    changes = registry.apply(CreateTopic("r", "a", "/x/y/z", 0), 0)
    assert changes == [TopicChanged("/x", "ADDED"), TopicChanged("/x/y", "ADDED"), TopicChanged("/x/y/z", "ADDED")]
    assert registry.children("/") == ["/x"]


# -- REMOVE (4.1.5)


def test_remove_topic_example_counts_pending_deliveries():
    registry = make_registry(["/stocks/quotes/ibm"])
    registry.pending_for_topic = lambda topic: 12 if topic == "/stocks/quotes/ibm" else 0
    exchange("""
        C: REMOVE TOPIC /stocks/quotes/ibm
        S: 200-OK
        S: 200 12 messages pending
        S:
    """, session_with(registry=registry))


def test_publishing_to_a_removed_topic_fails_as_if_it_never_existed():
    factory = session_with("/stocks/quotes/ibm")
    actions = feed_three_ways(b"REM TOPIC /stocks/quotes/ibm\r\nREM TOPIC /stocks/quotes/ibm\r\n"
                              b"PUB MESSAGE /stocks/quotes/ibm A1\r\n\r\n.\r\n", factory)
    assert wire(actions) == (b"200-OK\r\n200 0 messages pending\r\n\r\n404 Not found (/stocks/quotes/ibm)\r\n\r\n"
                             b"404 Not found (/stocks/quotes/ibm)\r\n\r\n")
    assert [type(a.event) for a in actions if isinstance(a, Control)] == [RemoveTopic, RemoveTopic]


def test_remove_refuses_account_topics():
    assert wire(feed_three_ways(b"REMOVE TOPIC /accounts/jtegen\r\n", session_with())) == \
        b"405 Not allowed (account topics cannot be removed)\r\n\r\n"


# -- SET TOPIC (4.1.6.1)


def test_set_topic_name_example_moves_the_topic():
    factory = session_with("/stocks/quotes/ibm")
    actions = feed_three_ways(b"SET TOPIC NAME /stocks/quotes/ibm /stocks/ibm/quote\r\n\r\n"
                              b"PUB MESSAGE /stocks/quotes/ibm A1\r\n\r\n.\r\nLIST TOPIC /stocks/ibm\r\n", factory)
    assert wire(actions) == OK + b"404 Not found (/stocks/quotes/ibm)\r\n\r\n200-OK\r\n200 /stocks/ibm/quote\r\n\r\n"


@pytest.mark.parametrize("command, reply", [
    (b"SET TOPIC NAME /a /a", b"409 Conflict (new-topic and topic are the same)"),
    (b"SET TOPIC NAME /a /b", b"409 Conflict (/b exists)"),
    (b"SET TOPIC NAME /missing /c", b"404 Not found (/missing)"),
    (b"SET TOPIC NAME /accounts/jtegen /c", b"405 Not allowed (account topics cannot be renamed)"),
    (b"SET TOPIC NAME /a", b"400 Bad request (usage: SET TOPIC NAME <topic> <new-topic>)"),
])
def test_set_topic_name_reply_codes(command, reply):
    assert wire(feed_three_ways(command + b"\r\n", session_with("/a", "/b"))) == reply + b"\r\n\r\n"


def test_set_topic_keyword_example_then_get_and_find():
    """4.1.6.1.2, 4.1.12.2 and 4.1.7's examples against the same topics."""
    factory = session_with("/stocks/ibm", "/stocks/floral")
    client, server = transcript("""
        C: SET TOPIC KEYWORD /stocks/ibm (IBM,STOCKS,BIG BLUE)
        C:
        S: 200 OK
        S:
        C: SET TOPIC KEYWORD /stocks/floral (FLOWERS,BLUE CARNATIONS)
        C:
        S: 200 OK
        S:
        C: SET TOPIC KEYWORD /stocks (STOCKS,TICKERS)
        C:
        S: 200 OK
        S:
        C: GET TOPIC KEYWORDS /stocks/ibm
        C:
        S: 200-OK
        S: 200 IBM,STOCKS,BIG BLUE
        S:
        C: FIND TOPIC /stocks
        C:
        S: 200-OK
        S: 200 /stocks (STOCKS,TICKERS)
        S:
        C: FIND TOPIC /stocks BLUE
        C:
        S: 200-OK
        S: 200-/stocks/floral (FLOWERS,BLUE CARNATIONS)
        S: 200 /stocks/ibm (IBM,STOCKS,BIG BLUE)
        S:
        C: FIND TOPICS /stocks/* blue
        C:
        S: 200-OK
        S: 200-/stocks/floral (FLOWERS,BLUE CARNATIONS)
        S: 200 /stocks/ibm (IBM,STOCKS,BIG BLUE)
        S:
        C: FIND TOPIC /stocks/* tulip,ibm
        C:
        S: 200-OK
        S: 200 /stocks/ibm (IBM,STOCKS,BIG BLUE)
        S:
        C: FIND TOPIC /stocks/* TULIP
        C:
        S: 404 Not found (no topic matches /stocks/* TULIP)
        S:
    """)
    assert wire(feed_three_ways(client, factory)) == server


# -- SET LOGIN (4.1.6.2)


def test_set_login_attributes():
    actions = feed_three_ways(b"SET LOGIN NAME Jayne Smith\r\nSET LOGIN EMAIL js@example.com\r\n"
                              b"SET LOGIN ADDRESS 1 Main St, Springfield\r\nSET LOGIN PHONE +1 555 0100\r\n",
                              session_with())
    assert wire(actions) == OK * 4
    assert [(a.event.attribute, a.event.value) for a in actions if isinstance(a, Control)] == [
        ("name", "Jayne Smith"), ("email", "js@example.com"), ("address", "1 Main St, Springfield"),
        ("phone", "+1 555 0100")]


def test_set_login_password_over_clear_stores_only_a_hash():
    """4.1.6.2.1's negotiation with CLEAR: 405 for a method not offered, then old and new."""
    client, server = transcript("""
        C: SET LOGIN PASSWORD KABEROS/4.0
        S: 405 Not allowed
        S:
        C: SET LOGIN PASSWORD CLEAR/1.0
        S: 200-OK
        S: 200 + old password
        S:
        C: rowe7kuy
        S: + new password
        S:
        C: s3cret
        S: 200 OK
        S:
    """)
    actions = feed_three_ways(client, session_with())
    assert wire(actions) == server
    [control] = [a for a in actions if isinstance(a, Control)]
    assert control.event == SetLogin("r1", "jtegen", "password", "hashed:s3cret", 998577912460000)


def test_set_login_password_with_a_wrong_old_password_is_401():
    actions = feed_three_ways(b"SET LOGIN PASS CLEAR/1.0\r\nwrong\r\nnew\r\n", session_with())
    assert wire(actions).endswith(b"401 Unauthorized (old password not correct)\r\n\r\n")
    assert not [a for a in actions if isinstance(a, Control)]


def scram_session(outcomes: list, credentials=None, password: str = "rowe7kuy"):
    """A factory of jtegen sessions whose account has SCRAM credentials for ``password``."""
    import hashlib

    from gateway.protocol.actions import AuthResult
    from gateway.scram import Credentials

    salt = b"0123456789abcdef"
    credentials = credentials or Credentials(salt, 4096, hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 4096))

    def factory():
        from gateway.accounts import stored_hash
        session = make_session(scram_credentials=lambda user: credentials if user == "jtegen"
                               else AuthResult.UNKNOWN_ACCOUNT, new_nonce=lambda: "SERVER",
                               login_outcome=lambda user, ok: outcomes.append(ok),
                               new_salt=lambda: (b"fresh-salt-bytes", 4096), store_credentials=stored_hash)
        run(session, [b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n"])
        return session
    return factory


def b64_line(text: str) -> bytes:
    import base64
    return base64.b64encode(text.encode()) + b"\r\n"


def scram_proof(old: str):
    """The first SCRAM steps against jtegen's stored hash, with fixed nonces (so every server
    message is known in advance): (client, server, client-first, server-first, client-final)."""
    from gateway.accounts import Accounts, hash_password
    from gateway.scram import ScramClient, ScramServer
    stored = Accounts({"jtegen": hash_password("rowe7kuy", iterations=4096, salt=b"0123456789abcdef")})
    server = ScramServer(stored.scram_credentials("jtegen"), "SERVER")  # the gateway's side, to know its lines
    client = ScramClient("jtegen", old, "CLIENT")
    server_first = server.first(client.first())
    return client, server, client.first(), server_first, client.final(server_first)


def scram_change(old: str, new: str) -> tuple[bytes, bytes]:
    """The client's bytes of a whole SET LOGIN PASSWORD SCRAM-SHA-256 exchange and the server's replies."""
    import base64
    client, server, first, server_first, client_final = scram_proof(old)
    offer = server.offer_new_password(server.final(client_final), b"fresh-salt-bytes", 4096)
    sent = (b"SET LOGIN PASSWORD SCRAM-SHA-256/1.0\r\n\r\n" + b64_line(first) + b64_line(client_final)
            + b64_line(client.new_password(offer, new)))
    replies = (b"200-OK\r\n200 +\r\n\r\n+ " + base64.b64encode(server_first.encode()) + b"\r\n\r\n+ "
               + base64.b64encode(offer.encode()) + b"\r\n\r\n" + OK)
    return sent, replies


def test_set_login_password_over_scram_sends_neither_password():
    """Prove the old password by SCRAM, send the new one's SaltedPassword for the server's salt,
    masked: the stored hash then checks CLEAR and SCRAM logins with the new password."""
    from gateway.accounts import Accounts, verify_password
    from gateway.scram import ScramClient, ScramServer

    outcomes: list = []
    sent, expected = scram_change("rowe7kuy", "n3w-secret")
    actions = feed_three_ways(sent, scram_session(outcomes))
    assert wire(actions) == expected
    assert b"rowe7kuy" not in sent and b"n3w-secret" not in sent
    [control] = [a for a in actions if isinstance(a, Control)]
    stored = control.event.value
    assert control.event.attribute == "password" and stored.startswith("pbkdf2_sha256$4096$")
    assert verify_password("n3w-secret", stored) and not verify_password("rowe7kuy", stored)
    server = ScramServer(Accounts({}, overrides={"jtegen": stored}).scram_credentials("jtegen"), "S")
    client = ScramClient("jtegen", "n3w-secret", "C")
    assert client.verify(server.final(client.final(server.first(client.first()))))
    assert outcomes[-1] is True


def test_set_login_password_over_scram_with_a_wrong_old_password_is_a_failed_login():
    outcomes: list = []
    _, _, first, _, client_final = scram_proof("guess")
    actions = run(scram_session(outcomes)(), [b"SET LOGIN PASSWORD SCRAM-SHA-256/1.0\r\n" + b64_line(first)
                                              + b64_line(client_final) + b"NOOP\r\n"])
    assert wire(actions).endswith(b"401 Unauthorized (old password not proved: proof does not match)\r\n\r\n"
                                  + OK)
    assert outcomes == [False] and not [a for a in actions if isinstance(a, Control)]


def test_set_login_password_over_scram_refusals():
    """400 for a tampered new password (nothing stored), 405 for an account without SCRAM
    credentials (guest), 401 while the account is throttled."""
    from gateway.protocol.actions import AuthResult
    from gateway.protocol.session import Session
    from tests.gateway.test_feeding import SPEC_TIME, make_config

    _, _, first, _, client_final = scram_proof("rowe7kuy")
    tampered = b64_line("h=" + "A" * 44 + ",p=" + "A" * 44)
    actions = run(scram_session([])(), [b"SET LOGIN PASSWORD SCRAM-SHA-256/1.0\r\n" + b64_line(first)
                                        + b64_line(client_final) + tampered])
    assert wire(actions).endswith(b"400 Bad request (new password: new password proof does not match)\r\n\r\n")
    assert not [a for a in actions if isinstance(a, Control)]
    guest = make_session()
    run(guest, [b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n"])
    assert wire(run(guest, [b"SET LOGIN PASSWORD SCRAM-SHA-256/1.0\r\n"])) == \
        b"405 Not allowed (guest has no SCRAM credentials; use CLEAR/1.0)\r\n\r\n"
    registry = make_registry()
    throttled = Session(make_config(), lambda user, password: AuthResult.OK, clock=lambda: SPEC_TIME,
                        new_guid=str, new_smuid=lambda: 1, registry=registry,
                        scram_credentials=lambda user: AuthResult.THROTTLED)
    throttled.registry, throttled.stored = registry, {}
    run(throttled, [b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen x\r\n"])
    assert wire(run(throttled, [b"SET LOGIN PASSWORD SCRAM-SHA-256/1.0\r\n"])) == \
        b"401 Unauthorized (too many failed logins; try again later)\r\n\r\n"


# -- SET NOTIFY (4.1.6.3)


def test_set_notify_port_asks_the_io_layer_to_connect():
    from tests.gateway.test_feeding import make_config

    def allowing_10_0_0_5():  # the configuration names 10.0.0.5 (test_session_limits: other hosts)
        session = make_session(make_config(notify_hosts=("10.0.0.5",)))
        run(session, [b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n"])
        return session
    actions = feed_three_ways(b"SET NOTIFY PORT 7730\r\nSET NOTIFY PORT 7731 10.0.0.5\r\nSET NOTIFY PORT x\r\n",
                              allowing_10_0_0_5)
    assert actions[:2] == [ConnectNotify(None, 7730), ConnectNotify("10.0.0.5", 7731)]
    assert wire(actions[2:]) == b"400 Bad request (usage: SET NOTIFY PORT <ip-port> [ip-address])\r\n\r\n"


def test_suspend_and_resume():
    session = session_with()()
    assert not session.suspended("/a")
    run(session, [b"SET NOTIFY SUSPEND /a/*\r\n"])
    assert session.suspended("/a/b") and not session.suspended("/c")
    run(session, [b"SET NOTIFY RESUME /a/*\r\nSET NOTIFY SUS\r\n"])
    assert session.suspended("/a/b") and session.suspended("/c")
    actions = run(session, [b"SET NOTIFY RESUME /c\r\n"])
    assert actions == [Send(OK), Wake()]
    assert session.suspended("/a/b") and not session.suspended("/c")
    run(session, [b"SET NOTIFY RES\r\n"])
    assert not session.suspended("/a/b")


def test_resume_without_suspend_is_ignored():
    session = session_with()()
    assert run(session, [b"SET NOTIFY RESUME /x\r\n"]) == [Send(OK), Wake()]
    assert not session.suspended("/x")


# -- GET MESSAGE (4.1.12.1)


def stored(smuid: int, topic: str, data: bytes = b"34.456") -> StoredMessage:
    return StoredMessage(smuid=smuid, topic=topic, cmuid="A004", publisher="jtegen", publisher_guid="jtegen005",
                         accepted_at=997862604450000, priority=0,
                         headers=[("Created", "D20010815T08032445Z")],
                         sections=[Section([("Content-Type", "text/plain"), ("Content-Length", "6")], data)])


def test_get_message_example():
    """4.1.12.1: ``200 OK``, then the message with its Topic, non-destructively (twice)."""
    def factory():
        session = session_with("/stocks/quotes/ibm")()
        session.stored["/stocks/quotes/ibm"] = [stored(1835, "/stocks/quotes/ibm")]
        return session
    message = transcript("""
        S: 200 OK
        S: Topic: /stocks/quotes/ibm
        S: Created: D20010815T08032445Z
        S: Smuid: www.host.com/1835
        S: Cmuid: jtegen/jtegen005/A004
        S:
        S: Content-Type: text/plain
        S: Content-Length: 6
        S:
        S: 34.456
        S: .
        S:
    """)[1]
    actions = feed_three_ways(b"GET MESSAGE /stocks/quotes/ibm 1835\r\nGET MESS /stocks/quotes/ibm 1835\r\n", factory)
    assert wire(actions) == message * 2


@pytest.mark.parametrize("selector, smuids", [
    ("1865", [1865]), ("1865-2340", [1865, 1900, 1905, 2340]), ("1845-1890,1905,1920-1930", [1865, 1905]),
    ("*", [1800, 1865, 1900, 1905, 2340, 2400]),
])
def test_get_message_selectors(selector, smuids):
    """4.1.12.1's valid requests: one SMUID, a range, ranges and ``*``."""
    def factory():
        session = session_with("/stocks/quotes/ibm")()
        session.stored["/stocks/quotes/ibm"] = [stored(n, "/stocks/quotes/ibm")
                                                for n in (1800, 1865, 1900, 1905, 2340, 2400)]
        return session
    reply = wire(feed_three_ways(f"GET MESSAGE /stocks/quotes/ibm {selector}\r\n".encode(), factory))
    assert reply.startswith(b"200 OK\r\nTopic: ")
    assert [int(line.split(b"/")[-1]) for line in reply.split(b"\r\n") if line.startswith(b"Smuid:")] == smuids


def test_get_message_reply_codes():
    factory = session_with("/t")
    actions = feed_three_ways(b"GET MESSAGE /t 5\r\nGET MESSAGE /nope 5\r\nGET MESSAGE /t 9-1\r\n"
                              b"GET TOPIC KEYWORDS /nope\r\n", factory)
    assert wire(actions) == (b"404 Not found (no such message in /t)\r\n\r\n404 Not found (/nope)\r\n\r\n"
                             b"400 Bad request (usage: GET MESSAGE <topic> <smuid|first-last[,...]|*>)\r\n\r\n"
                             b"404 Not found (/nope)\r\n\r\n")


def test_ranges_round_trip():
    assert format_ranges([1845, 1809, 1810, 1811, 1812, 1850, 1851]) == "1809-1812,1845,1850-1851"
    assert format_ranges([]) == ""
    wanted = parse_ranges("1845-1890,1905")
    assert [n for n in (1844, 1845, 1890, 1891, 1905) if wanted(n)] == [1845, 1890, 1905]
    assert wanted.span == (1845, 1905)  # what a read of them may stay within
    assert parse_ranges("*").span is None and parse_ranges("*")(12345)
    assert parse_ranges("a-b") is None and parse_ranges("5-") is None


# -- SUBSCRIBE / UNSUBSCRIBE TOPIC, SUBSCRIBER, SERVER (4.1.9.2-4, 4.1.10.2-3)


def test_watches_and_unsubscribe_everything():
    """4.1.9.2/4.1.9.3 then 4.1.10.2/4.1.10.3's ``UNSUB *`` listing every resource."""
    factory = session_with("/stocks/quotes/ibm", "/stocks/quotes/beos", "/lists/news/os", "/stocks/quotes/sony")
    client, server = transcript("""
        C: SUB MESSAGE /stocks/quotes/ibm
        C: SUB MESSAGE /stocks/quotes/sony
        C: SUBSCRIBE TOPIC /stocks/quotes/ibm
        C: SUB TOPIC /stocks/quotes/beos
        C: SUB SUB /stocks/quotes/ibm
        C: UNSUB *
        S: 200-OK
        S: 200 /stocks/quotes/ibm
        S:
        S: 200-OK
        S: 200 /stocks/quotes/sony
        S:
        S: 200-OK
        S: 200 /stocks/quotes/ibm
        S:
        S: 200-OK
        S: 200 /stocks/quotes/beos
        S:
        S: 200-OK
        S: 200 /stocks/quotes/ibm
        S:
        S: 200-OK
        S: 200-MESSAGE /stocks/quotes/ibm
        S: 200-MESSAGE /stocks/quotes/sony
        S: 200-TOPIC /stocks/quotes/beos
        S: 200-TOPIC /stocks/quotes/ibm
        S: 200 SUB /stocks/quotes/ibm
        S:
    """)
    assert wire(feed_three_ways(client, factory)) == server


def test_unsubscribe_topic_examples():
    factory = session_with("/stocks/quotes/ibm", "/stocks/quotes/beos", "/lists/news/os")

    def watching():
        session = factory()
        run(session, [b"SUB TOPIC /stocks/quotes/ibm\r\nSUB TOPIC /stocks/quotes/beos\r\nSUB TOPIC /lists/news/os\r\n"])
        return session
    exchange("""
        C: UNSUB TOPIC /stocks/quotes/*
        C:
        S: 200-OK
        S: 200-TOPIC /stocks/quotes/beos
        S: 200 TOPIC /stocks/quotes/ibm
        S:
        C: UNSUB TOPIC *
        C:
        S: 200-OK
        S: 200 TOPIC /lists/news/os
        S:
        C: UNSUB TOPIC /stocks/quotes/ibm
        C:
        S: 404 Not found (not subscribed to /stocks/quotes/ibm)
        S:
    """, watching)


@pytest.mark.parametrize("command, reply", [
    (b"SUB MESSAGE /missing", b"404 Not found (/missing)"),
    (b"SUB MESSAGE /missing/*", b"404 Not found (/missing/*)"),
    (b"SUB TOPIC /missing", b"404 Not found (/missing)"),
    (b"SUB MESSAGE /a SINCE D20010915T123000 UNTIL D20010915T080000", b"409 Conflict (UNTIL time precedes SINCE time)"),
    (b"SUB MESSAGE /a SINCE yesterday", b"400 Bad request (bad SINCE date-time)"),
    (b"SUB MESSAGE /accounts/other", b"403 Forbidden (another account's topic)"),
    (b"UNSUB MESSAGE /a", b"404 Not found (not subscribed to /a)"),
    (b"UNSUB SUB /a", b"404 Not found (not subscribed to /a)"),
    (b"SUB SERVER BYE", b"400 Bad request (usage: SUBSCRIBE SERVER TIMEOUT)"),
])
def test_subscribe_reply_codes(command, reply):
    assert wire(feed_three_ways(command + b"\r\n", session_with("/a"))) == reply + b"\r\n\r\n"


def test_subscribe_to_a_virtual_topic_subscribes_to_its_target():
    registry = make_registry(["/stocks/quotes/ibm"])
    registry.apply(CreateTopic("r", "a", "/ibm", 0, target="/stocks/quotes/ibm"), registry.applied + 1)
    actions = feed_three_ways(b"SUB MESSAGE /ibm\r\nPUB MESSAGE /ibm A1\r\n\r\n.\r\n", session_with(registry=registry))
    assert actions[0].event.pattern == "/stocks/quotes/ibm"
    assert actions[-1].event.topic == "/stocks/quotes/ibm"


def test_subscribe_server_timeout_sends_the_current_value():
    """4.1.9.4.1: then NOTIFY SERVER TIMEOUT (4.1.11.4.1) whenever it changes."""
    actions = feed_three_ways(b"SUB SERVER TIMEOUT\r\n", session_with())
    assert wire(actions) == OK + b"NOTIFY SERVER TIMEOUT 00:24:00:00\r\n\r\n"


def test_subscriber_counts_change_on_subscribe_and_unsubscribe():
    """What NOTIFY SUBSCRIBERS (4.1.11.3) reports: every topic whose count changed."""
    registry = make_registry(["/s/a", "/s/b"])
    assert registry.apply(Subscribe("bob", "g", "/s/*", 0), 10) == [SubscribersChanged("/s/a", 1),
                                                                     SubscribersChanged("/s/b", 1)]
    assert registry.apply(Subscribe("ann", "g", "/s/a", 0), 11) == [SubscribersChanged("/s/a", 2)]
    assert registry.apply(Subscribe("ann", "g", "/s/a", 0), 12) == []  # already subscribed


def test_a_deliver_renders_in_reply_attributes():
    """PUB REPLY's NOTIFY to the original publisher: its account topic, the original CMUID."""
    from gateway.protocol.rendering import render_notify
    deliver = Deliver("jtegen", 7, "/accounts/jtegen", "CF0456", "bob", "bob1", 0,
                      headers=[("In-Reply-To", "jtegen/jtegen497549/A004"), ("Reply-Topic", "/stocks/quotes/ibm")])
    frame = render_notify(deliver, "h")
    assert frame.startswith(b"NOTIFY MESSAGE /accounts/jtegen\r\n")
    assert b"Cmuid: bob/bob1/CF0456\r\nIn-Reply-To: jtegen/jtegen497549/A004\r\n" in frame


def test_publish_reply_reply_codes():
    actions = feed_three_ways(b"PUB REPLY /t C1\r\n\r\n.\r\nPUB REPLY /t C2\r\nCmuid: nobody/g/A1\r\n\r\n.\r\n"
                              b"PUB MESSAGE /accounts/jtegen C3\r\n\r\n.\r\n", session_with("/t"))
    assert wire(actions) == (b"400 Bad request (PUB REPLY needs the Cmuid attribute of the message replied to)\r\n\r\n"
                             b"404 Not found (account nobody)\r\n\r\n"
                             b"405 Not allowed (account topics take replies (PUB REPLY), not messages)\r\n\r\n")


def test_a_removed_topic_stays_readable_until_its_last_pending_delivery():
    """4.1.5: it is only removed once the last message has been delivered."""
    registry = make_registry(["/t"])
    pending = {"/t": 2}
    registry.pending_for_topic = lambda topic: pending.get(topic, 0)
    session = session_with(registry=registry)()
    session.registry.pending_for_topic = registry.pending_for_topic
    session.stored["/t"] = [stored(5, "/t")]
    assert wire(run(session, [b"REMOVE TOPIC /t\r\nLIST MESSAGE /t\r\n"])) == \
        b"200-OK\r\n200 2 messages pending\r\n\r\n200-OK\r\n200 5\r\n\r\n"
    pending["/t"] = 0
    assert wire(run(session, [b"LIST MESSAGE /t\r\nGET MESSAGE /t 5\r\n"])) == b"404 Not found (/t)\r\n\r\n" * 2


# -- GUARANTEE (2002 revision)


def test_a_non_guaranteed_publish_gets_no_reply_at_all():
    """``Guarantee: NO``: no acknowledgement publisher → server, not even an error."""
    actions = feed_three_ways(b"PUB MESSAGE /t A1\r\nGuarantee: NO\r\n\r\n.\r\n"
                              b"PUB MESSAGE /missing A2\r\nGuar: no\r\n\r\n.\r\n"
                              b"PUB MESSAGE /t A3\r\nGuarantee: maybe\r\n\r\n.\r\nNOOP\r\n", session_with("/t"))
    durable = actions[0]
    assert durable.reply == b"" and durable.event.cmuid == "A1"
    assert wire(actions) == b"400 Bad request (bad Guarantee value)\r\n\r\n" + OK


def test_a_non_guaranteed_notify_awaits_no_ack():
    session = session_with("/t")()
    deliver = Deliver("jtegen", 7, "/t", "A1", "bob", "g", 0, headers=[("Guarantee", "NO")])
    assert session.notify(deliver).startswith(b"NOTIFY MESSAGE /t\r\n")
    assert session.awaiting_ack is None
    session.notify(Deliver("jtegen", 8, "/t", "A2", "bob", "g", 0))
    assert session.awaiting_ack == 8


def test_a_message_expires_after_its_timeout_else_the_server_default():
    """2002 TIMEOUT: the message's own, else the server default; INFINITE is a state message."""
    actions = feed_three_ways(b"PUB MESSAGE /t A1\r\nTimeout: 00:00:00:02\r\n\r\n.\r\nPUB MESSAGE /t A2\r\n\r\n.\r\n"
                              b"PUB MESSAGE /t A3\r\nTimeout: INF\r\n\r\n.\r\n", session_with("/t"))
    accepted = actions[0].event.accepted_at
    assert [a.event.expires_at for a in actions] == [accepted + 2_000_000, accepted + 86_400_000_000, None]


# -- limits (spec 5.1)


def test_a_full_gateway_redirects_logins_to_another_of_the_farm():
    """4.1.1 Redirect Request: ``311-Redirect request`` / ``311 <address>``; no farm → 503."""
    def full(redirect):
        return lambda: make_session(over_capacity=lambda: redirect)
    client, server = transcript("""
        C: LOGIN jtegen CLEAR/1.0
        S: 311-Redirect request
        S: 311 192.168.0.100:721
        S:
    """)
    assert wire(feed_three_ways(client, full("192.168.0.100:721"))) == server
    assert wire(feed_three_ways(client, full(""))) == \
        b"503 Service unavailable (no more logins on this server)\r\n\r\n"


def test_not_available_greeting():
    assert make_session().greeting(available=False) == b"SMQP/1.0 Not Available. OmicronSoft SMQP Server/1.0 (c) 2001\r\n"


def test_subscription_limits_per_request_and_per_account():
    """5.1 (7) a wildcard reaching too many topics: 414; (8) too many subscriptions: 414 too (4.1.9.1)."""
    from tests.gateway.test_feeding import make_config

    def limited():
        session = make_session(make_config(max_subscriptions=2, max_topics_per_subscribe=2),
                               registry=make_registry(["/a/x", "/a/y", "/a/z", "/b", "/c", "/d"]))
        run(session, [b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n"])
        return session
    actions = feed_three_ways(b"SUB MESSAGE /a/*\r\nSUB MESSAGE /b\r\nSUB MESSAGE /c\r\nSUB MESSAGE /b\r\n"
                              b"SUB MESSAGE /d\r\n", limited)
    assert wire(actions) == (b"414 Resource too large (/a/* reaches 3 topics, more than 2)\r\n\r\n"
                             b"200-OK\r\n200 /b\r\n\r\n200-OK\r\n200 /c\r\n\r\n200-OK\r\n200 /b\r\n\r\n"
                             b"414 Resource too large (cannot subscribe to any more: 2 subscriptions already, "
                             b"the most one account may have)\r\n\r\n")


def test_a_throttled_login_is_401_with_a_reason():
    from gateway.protocol.actions import AuthResult
    from gateway.protocol.session import Session
    from tests.gateway.test_feeding import SPEC_TIME, make_config
    registry = make_registry()
    session = Session(make_config(), lambda user, password: AuthResult.THROTTLED,  # Accounts, after failures
                      clock=lambda: SPEC_TIME, new_guid=str, new_smuid=lambda: 1, registry=registry)
    session.registry, session.stored = registry, {}
    assert wire(run(session, [b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen x\r\n"])) == (
        OK + b"401 Unauthorized (too many failed logins; try again later)\r\n\r\n")


def test_scram_sha_256_login_through_continuation_lines():
    """The password never crosses the wire: ``200 +``, client-first, ``+ server-first``,
    client-final, then the login reply carrying the server's proof as ``Verifier:``."""
    import base64
    import hashlib

    from gateway.protocol.actions import AuthResult
    from gateway.scram import Credentials, ScramClient

    salt = b"0123456789abcdef"
    credentials = Credentials(salt, 4096, hashlib.pbkdf2_hmac("sha256", b"rowe7kuy", salt, 4096))
    outcomes = []

    def factory():
        return make_session(scram_credentials=lambda user: credentials if user == "jtegen"
                            else AuthResult.UNKNOWN_ACCOUNT, new_nonce=lambda: "SERVER",
                            login_outcome=lambda user, ok: outcomes.append(ok))

    b64 = lambda text: base64.b64encode(text.encode()) + b"\r\n"  # noqa: E731
    client = ScramClient("jtegen", "rowe7kuy", "CLIENT")
    first = b"LOGIN jtegen SCRAM-SHA-256/1.0\r\n\r\n" + b64(client.first())
    session = factory()
    replies = wire(run(session, [first]))
    assert replies.startswith(b"200-OK\r\n200 +\r\n\r\n+ ")
    server_first = base64.b64decode(replies.split(b"+ ")[1].split(b"\r\n")[0]).decode()
    actions = run(session, [b64(client.final(server_first))])
    reply = wire(actions).decode()
    verifier = reply.split("Verifier: ")[1].split("\r\n")[0]
    assert client.verify(base64.b64decode(verifier).decode()) and session.logged_in and outcomes == [True]
    assert "200-Topic: /accounts/jtegen" in reply

    wrong = ScramClient("jtegen", "guess", "CLIENT")
    session = factory()
    run(session, [b"LOGIN jtegen SCRAM-SHA-256/1.0\r\n" + b64(wrong.first())])
    assert wire(run(session, [b64(wrong.final(server_first))])) == \
        b"401 Unauthorized (proof does not match)\r\n\r\n"
    assert not session.logged_in and outcomes == [True, False]
    assert wire(feed_three_ways(b"LOGIN nobody SCRAM-SHA-256/1.0\r\n", factory)) == \
        b"404 Not found (account not found)\r\n\r\n"


def test_per_topic_message_size_and_queue_limits():
    """Spec section 6's per-queue maximum message size (413), message count and total size (414),
    from the configuration's [topics."/…"], inherited; the queue as the delivery book counts it."""
    from schemas.config import load_config
    from tests.gateway.test_feeding import make_config
    from tests.gateway.test_session_errors import durables, pub

    config = load_config(env={}, topics={"/stocks": {"max_messages": 2, "max_queue_bytes": 20},
                                         "/stocks/quotes/ibm": {"max_message_bytes": 8},
                                         "/news": {"max_message_bytes": 64}})
    queued = {"/stocks/quotes/ibm": (1, 12), "/stocks/quotes/msft": (2, 10)}

    def factory():
        session = make_session(make_config(max_message_bytes=16), queue_params=TopicSettings(config.topics).resolve,
                               queued=lambda topic: queued.get(topic, (0, 0)))
        run(session, [b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n"])
        return session

    frames = [pub(b"", data=b"12345678"),                          # 8 bytes: its topic's limit, room left
              pub(b"", data=b"123456789"),                         # 9 > 8: 413
              pub(b"", data=b"x" * 9, topic=b"/stocks/quotes/sony"),  # inherits 16 from the gateway, but 0+9 ok
              pub(b"", topic=b"/stocks/quotes/msft"),              # 2 messages waiting of 2: full
              pub(b"", data=b"x" * 40, topic=b"/news"),            # /news allows 64, more than the gateway's 16
              pub(b"", data=b"x" * 65, topic=b"/news")]            # 65 > 64
    actions = feed_three_ways(b"".join(frames), factory)
    assert wire(actions) == (b"200-OK\r\n200 A004 2001083408341156\r\n\r\n"
                             b"413 Entity too large (more than 8 data bytes)\r\n\r\n"
                             b"200-OK\r\n200 A004 2001083408341157\r\n\r\n"
                             b"414 Resource too large (queue of /stocks/quotes/msft full: 2 messages waiting)\r\n\r\n"
                             b"200-OK\r\n200 A004 2001083408341158\r\n\r\n"
                             b"413 Entity too large (more than 64 data bytes)\r\n\r\n")
    queued["/stocks/quotes/ibm"] = (1, 13)  # 13 + 8 > 20 bytes: full by size
    assert wire(run(factory(), [pub(b"", data=b"12345678")])) == \
        b"414 Resource too large (queue of /stocks/quotes/ibm full: 13 of 20 bytes waiting)\r\n\r\n"
    silent = run(factory(), [pub(b"", data=b"12345678", headers=b"Guarantee: NO\r\n")])
    assert silent == [] and not durables(silent)  # refused, and as every unguaranteed PUB: no reply
