"""Every example exchange of spec sections 4 and 4.1.1–4.1.14 this gateway
serves, reproduced byte for byte (each input fed three ways).

Deviations from the draft's text, all deliberate:

* The draft miscounts Content-Length: ``Content-Length: 5`` for ``24.567``
  (6 bytes) in 4.1.8.1 and ``Content-Length: 12`` for ``34.456`` in
  4.1.11.1.  These tests use the true lengths (6); the HTML section's 52 is
  right and kept.
* SMUIDs are integers here (``2001083408341156``), not the draft's
  ``2001083408341156-1810``; ``Smuid:`` attributes read ``host/<smuid>``
  as in the PUB REPLY example (``www.host.com/1835``).
* Every reply ends with an empty line; the draft's abbreviated LOGIN
  transcript omits it after ``200 OK``.
* Topics must exist (CREATE TOPIC) before PUB/SUB; the examples' topics are
  created by the test registry (``SPEC_TOPICS``).
"""

from __future__ import annotations

from gateway.protocol.actions import Close, Control, Durable, LoggedIn, Send
from gateway.protocol.rendering import render_notify
from schemas.events import Ack, Deliver, Publish, Section, Subscribe, Unsubscribe

from tests.gateway.test_feeding import (
    FIRST_SMUID,
    feed_three_ways,
    logged_in,
    make_session,
    run,
    transcript,
    wire,
)

SPEC_MICROS = 998577912460000  # SPEC_TIME in µs since the epoch


def subscribed(*patterns: str):
    """A logged-in session already subscribed to ``patterns``."""
    session = logged_in()
    run(session, [b"".join(b"SUB MESSAGE " + p.encode() + b"\r\n" for p in patterns)])
    return session


def test_greeting():
    """Section 4: ``SMQP/1.0 Ready. OmicronSoft SMQP Server/1.0 (c) 2001``."""
    assert make_session().greeting() == b"SMQP/1.0 Ready. OmicronSoft SMQP Server/1.0 (c) 2001\r\n"


def test_login_sequence():
    """4.1.1 "Example LOGIN sequence", the full PASS reply in the spec's order."""
    client, server = transcript("""
        C: LOGIN jtegen CLEAR/1.0
        S: 200 OK
        S:
        C: PASS jtegen rowe7kuy
        S: 200-OK
        S: 200-Topic: /accounts/jtegen
        S: 200-Timeout: 00:24:00:00
        S: 200-Time: D20010823T14451246Z
        S: 200 Guid: jtegen0456
        S:
    """)
    actions = feed_three_ways(client, make_session)
    assert wire(actions) == server
    assert actions[-1] == LoggedIn("jtegen", "jtegen0456")


def test_clear_login_example_with_abbreviated_pass_reply():
    """4.1.1 "CLEAR authentication example": LOGIN's reply is exactly ``200 OK``;
    PASS's is the 200 the example abbreviates."""
    actions = feed_three_ways(b"LOGIN jtegen CLEAR/1.0\r\n", make_session)
    assert wire(actions) == b"200 OK\r\n\r\n"
    session = make_session()
    session.receive_data(b"LOGIN jtegen CLEAR/1.0\r\n")
    assert wire(session.receive_data(b"PASS jtegen rowe7kuy\r\n")).startswith(b"200-OK\r\n")


def test_kerberos_not_supported():
    """4.1.1 "KERBEROS authentication example (not supported by server)"."""
    client, server = transcript("""
        C: LOGIN jtegen KERBEROS/5.0
        S: 405 Not allowed
        S:
    """)
    assert wire(feed_three_ways(client, make_session)) == server


def test_guest_logs_in_with_blank_password():
    """4.1.1 Guest Account: ``guest`` with a blank password over CLEAR."""
    actions = feed_three_ways(b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n", make_session)
    assert actions[-1] == LoggedIn("guest", "guest0456")
    assert b"200-Topic: /accounts/guest\r\n" in wire(actions)


def test_publish_message():
    """4.1.8.1 "Example PUBLISH MESSAGE sequence" (Content-Length corrected to 6)."""
    client, server = transcript("""
        C: PUB MESSAGE /stocks/quotes/ibm A004
        C: Priority: 1
        C: Created: D20010815T08341245Z
        C: Receipt: yes
        C: Name: Stock quote for IBM
        C: Reply: NO
        C: Timeout: 00:01:00
        C: Depth: 1
        C: Sequence: 34
        C:
        C: Content-Type: text/plain
        C: Content-Length: 6
        C:
        C: 24.567
        C: .
        C:
        S: 200-OK
        S: 200 A004 2001083408341156
        S:
    """)
    actions = feed_three_ways(client)
    assert wire(actions) == server
    [durable] = actions
    assert durable.key == b"/stocks/quotes/ibm"
    assert durable.event == Publish(
        smuid=FIRST_SMUID, topic="/stocks/quotes/ibm", cmuid="A004", account="jtegen", guid="jtegen0456",
        accepted_at=SPEC_MICROS, priority=1,
        headers=[("Priority", "1"), ("Created", "D20010815T08341245Z"), ("Receipt", "yes"),
                 ("Name", "Stock quote for IBM"), ("Reply", "NO"), ("Timeout", "00:01:00"), ("Depth", "1"),
                 ("Sequence", "34")],
        sections=[Section([("Content-Type", "text/plain"), ("Content-Length", "6")], b"24.567")],
        expires_at=SPEC_MICROS + 60_000_000, receipt="one",  # Timeout: 00:01:00 from acceptance; YES = ONE
        depth=1,  # an open server: everyone holds the remote right, so Depth 1 may leave this farm
    )


def test_publish_message_with_multiple_data_sections():
    """4.1.8.1 "Example PUB MESSAGE with multiple data sections sequence"
    (first Content-Length corrected to 6; the HTML section's 52 is right)."""
    client, server = transcript("""
        C: PUB MESS /stocks/quotes/ibm A005
        C: Priority: 1
        C: Name: IBM Quote
        C: Created: D20010815T08341245Z
        C: Receipt: yes
        C: Reply: NO
        C: Timeout: 00:01:00
        C: Depth: 1
        C: Sequence: 34
        C:
        C: Content-Type: text/plain
        C: Content-Length: 6
        C:
        C: 24.567
        C:
        C: Content-Type: text/html
        C: Content-Length: 52
        C:
        C: <A HREF="http://www.stocks.com/quote=ibm">24.567</A>
        C: .
        C:
        S: 200-OK
        S: 200 A005 2001083408341156
        S:
    """)
    actions = feed_three_ways(client)
    assert wire(actions) == server
    assert [s.data for s in actions[0].event.sections] == [
        b"24.567", b'<A HREF="http://www.stocks.com/quote=ibm">24.567</A>']


def test_subscribe_message():
    """4.1.9.1 "Example SUBSCRIBE MESSAGE sequence": a durable Subscribe on partition 0, then the reply."""
    client, server = transcript("""
        C: SUB MESSAGE /stocks/quotes/ibm
        C:
        S: 200-OK
        S: 200 /stocks/quotes/ibm
        S:
    """)
    actions = feed_three_ways(client)
    assert wire(actions) == server
    assert actions[0] == Control(Subscribe("jtegen", "jtegen0456", "/stocks/quotes/ibm", SPEC_MICROS, request="r1"))


def test_subscribe_message_wildcard_lists_the_matching_topics():
    """4.1.9.1 wildcard example: the reply lists the topics the pattern matches today."""
    client, server = transcript("""
        C: SUBSCRIBE MESSAGE /stocks/quotes/*
        C:
        S: 200-OK
        S: 200-/stocks/quotes/ibm
        S: 200-/stocks/quotes/msft
        S: 200 /stocks/quotes/sony
        S:
    """)
    actions = feed_three_ways(client)
    assert wire(actions) == server
    assert actions[0].event.pattern == "/stocks/quotes/*"


def test_subscribe_to_the_root_is_refused():
    """4.1.9.1: ``SUB MESSAGE /*`` → 510 Maximum quantities exceeded."""
    client, server = transcript("""
        C: SUB MESSAGE /*
        C:
        S: 510 Maximum quantities exceeded
        S:
    """)
    assert wire(feed_three_ways(client)) == server


def test_subscribe_since_and_until():
    """4.1.9.1 SINCE / UNTIL examples: the bounds travel with the Subscribe (µs since the epoch)."""
    actions = feed_three_ways(b"SUB MESSAGE /stocks/quotes/ibm SINCE D20010915T080000\r\n\r\n"
                              b"SUB MESSAGE /stocks/quotes/ibm UNTIL D20010915T123000\r\n\r\n")
    assert wire(actions) == b"200-OK\r\n200 /stocks/quotes/ibm\r\n\r\n" * 2
    since, until = actions[0].event, actions[2].event
    assert (since.since, since.until) == (1000540800000000, None)
    assert (until.since, until.until) == (None, 1000557000000000)


def test_unsubscribe_message():
    """4.1.10.1 first example."""
    client, server = transcript("""
        C: UNSUB MESSAGE /stocks/quotes/ibm
        C:
        S: 200-OK
        S: 200 MESSAGE /stocks/quotes/ibm
        S:
    """)
    session = subscribed("/stocks/quotes/ibm")
    actions = run(session, [client])
    assert wire(actions) == server
    assert actions[0].event == Unsubscribe("jtegen", "jtegen0456", "/stocks/quotes/ibm", SPEC_MICROS, request="r2")


def test_unsubscribe_wildcards_list_what_ended():
    """4.1.10.1 wildcard examples: ``/stocks/*`` ends the quote subscriptions, ``*`` the rest."""
    client, server = transcript("""
        C: SUB MESSAGE /stocks/quotes/ibm
        C: SUB MESSAGE /stocks/quotes/sony
        C: SUB MESSAGE /weather/us/ca/san/forecast
        C:
        C: UNSUB MESSAGE /stocks/*
        C:
        S: 200-OK
        S: 200-MESSAGE /stocks/quotes/ibm
        S: 200 MESSAGE /stocks/quotes/sony
        S:
        C: UNSUB MESSAGE *
        C:
        S: 200-OK
        S: 200 MESSAGE /weather/us/ca/san/forecast
        S:
    """)
    actions = feed_three_ways(client)
    subscribed_replies = (b"200-OK\r\n200 /stocks/quotes/ibm\r\n\r\n200-OK\r\n200 /stocks/quotes/sony\r\n\r\n"
                          b"200-OK\r\n200 /weather/us/ca/san/forecast\r\n\r\n")
    assert wire(actions) == subscribed_replies + server
    assert [a.event.pattern for a in actions if isinstance(a, Control)][-2:] == ["/stocks/*", "/*"]


NOTIFY_EXAMPLE = """
    S: NOTIFY MESSAGE /stocks/quotes/ibm
    S: Created: D20010815T08032445Z
    S: Smuid: www.host.com/1835
    S: Cmuid: jtegen/jtegen3454654/A004
    S: Priority: 1
    S: Receipt: yes
    S: Reply: NO
    S: Timeout: 00:01:00
    S: Depth: 1
    S: Sequence: 34
    S:
    S: Content-Type: text/plain
    S: Content-Length: 6
    S:
    S: 34.456
    S: .
    S:
"""

EXAMPLE_HEADERS = [("Priority", "1"), ("Receipt", "yes"), ("Reply", "NO"), ("Timeout", "00:01:00"),
                   ("Depth", "1"), ("Sequence", "34")]


def example_deliver(headers=None) -> Deliver:
    return Deliver(
        account="jtegen", smuid=1835, topic="/stocks/quotes/ibm", cmuid="A004", publisher="jtegen",
        publisher_guid="jtegen3454654", accepted_at=SPEC_MICROS, priority=1,
        headers=[("Created", "D20010815T08032445Z"), *EXAMPLE_HEADERS] if headers is None else headers,
        sections=[Section([("Content-Type", "text/plain"), ("Content-Length", "6")], b"34.456")],
        depth=1,  # what its Depth attribute says (the field is what NOTIFY shows)
    )


def test_notify_message_with_two_phase_ack():
    """4.1.11.1 "Example NOTIFY MESSAGE sequence" (Content-Length corrected to 6;
    SMUID 1835 as ``www.host.com/1835``), then ``310 ACK`` both ways."""
    _, notify = transcript(NOTIFY_EXAMPLE)
    client, server = transcript("""
        C: 310 ACK
        C:
        S: 310 ACK
        S:
    """)

    def notified():
        session = logged_in()
        assert session.notify(example_deliver()) == notify
        assert session.awaiting_ack == 1835
        return session

    actions = feed_three_ways(client, notified)
    assert wire(actions) == server
    assert actions == [Durable(Ack("jtegen", "jtegen0456", 1835, SPEC_MICROS), b"jtegen", server)]
    session = notified()
    session.receive_data(client)
    assert session.awaiting_ack is None


def test_publish_to_notify_round_trip_reproduces_the_spec_example():
    """A PUB carrying the example's attributes, routed back as a Deliver,
    renders the 4.1.11.1 NOTIFY byte for byte."""
    _, notify = transcript(NOTIFY_EXAMPLE)
    pub = (b"PUB MESSAGE /Stocks/Quotes/IBM A004\r\nPriority: 1\r\nCreated: D20010815T08032445Z\r\n"
           b"Receipt: yes\r\nReply: NO\r\nTimeout: 00:01:00\r\nDepth: 1\r\nSequence: 34\r\n\r\n"
           b"Content-Type: text/plain\r\nContent-Length: 6\r\n\r\n34.456\r\n.\r\n")
    [durable] = feed_three_ways(pub)
    event: Publish = durable.event
    deliver = Deliver(account="jtegen", smuid=1835, topic=event.topic, cmuid=event.cmuid, publisher="jtegen",
                      publisher_guid="jtegen3454654", accepted_at=event.accepted_at, priority=event.priority,
                      headers=event.headers, sections=event.sections, depth=event.depth)
    assert render_notify(deliver, "www.host.com") == notify


def test_notify_without_created_uses_acceptance_time():
    rendered = render_notify(example_deliver(headers=EXAMPLE_HEADERS), "www.host.com")
    assert rendered.splitlines()[1] == b"Created: D20010823T14451246Z"


def test_noop():
    """4.1.13: NOOP → 200 OK (also before login)."""
    assert wire(feed_three_ways(b"NOOP\r\n\r\n", make_session)) == b"200 OK\r\n\r\n"


def test_quit():
    """4.1.14 example; the session asks to close after the reply."""
    client, server = transcript("""
        C: QUIT
        C:
        S: 200 OK
        S:
    """)
    actions = feed_three_ways(client)
    assert actions == [Send(server), Close()]


def test_server_bye():
    """4.1.11.4.2: ``NOTIFY SERVER BYE`` then an empty line."""
    assert make_session().server_bye() == b"NOTIFY SERVER BYE\r\n\r\n"


def test_a_remote_virtual_topic_needs_a_link_to_its_farm():
    """4.1.4's remote link example (``> www.host.com/stocks/ibm``): no ``[[federation.links]]`` for
    that domain here, so this server cannot reach it."""
    actions = feed_three_ways(b"CREATE TOPIC /stocks/quotes/ibm2 > www.host.com/stocks/ibm\r\n\r\n")
    assert wire(actions) == b"404 Not found (www.host.com: no link to that farm is configured here)\r\n\r\n"


def test_publish_reply_goes_to_the_original_publishers_account_topic():
    """4.1.8.2's PUB REPLY example (its Content-Length corrected to 9; its ``Created`` and body kept):
    the reply is published to /accounts/jtegen carrying the original CMUID as ``In-Reply-To``.
    As in the example, the replier was NOTIFYed the message on /stocks/quotes/ibm (the gateway saw it)."""
    client, server = transcript("""
        C: PUB REPLY /stocks/quotes/ibm CF0456
        C: Created: D20010815T08035341Z
        C: Smuid: www.host.com/1835
        C: Cmuid: jtegen/jtegen497549/A004
        C: Priority: 1
        C: Timeout: 00:01:00
        C: Content-Type: text/plain
        c: Content-Length: 9
        C:
        C: Thank you
        C: .
        C:
        S: 200-OK
        S: 200 CF0456 2001083408341156
        S:
    """)
    seen = {"jtegen/jtegen497549/A004": ("/stocks/quotes/ibm", None)}

    def replier():
        session = make_session(known_message=seen.get)
        run(session, [b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n\r\n"])
        return session
    [durable] = feed_three_ways(client, replier)
    assert wire([durable]) == server
    event = durable.event
    assert (event.topic, event.cmuid, event.priority) == ("/accounts/jtegen", "CF0456", 1)
    assert event.headers == [("Created", "D20010815T08035341Z"), ("Priority", "1"), ("Timeout", "00:01:00"),
                             ("In-Reply-To", "jtegen/jtegen497549/A004"), ("Reply-Topic", "/stocks/quotes/ibm")]
    assert event.sections[0].data == b"Thank you"


