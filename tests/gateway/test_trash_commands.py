"""Each topic's Trash (spec 2.2.1, DESIGN "Trash children are reserved and hidden from LIST/COUNT;
each topic's trash is readable with LIST/GET MESSAGE on ``<topic>/Trash``"): LIST, GET and COUNT
MESSAGE on ``<topic>/Trash``, under the topic's own access rules, and every other command still
refusing the reserved name.  Sans-I/O, with the real registry, fed three ways."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.ual import AccessList
from schemas.events import RemoveTopic, Section

from tests.gateway.test_feeding import feed_three_ways, make_registry, make_session, run, transcript, wire
from tests.gateway.test_spec_commands import stored

IBM = "/stocks/quotes/ibm"
TRASHED_AT = 997866204450000  # D20010815T09032445Z, an hour after the message was accepted


def trashed(smuid: int, topic: str = IBM, reason: str = "expired", **changes):
    """A message as :meth:`MessageStore.trashed` returns it: its live form plus why and when it died."""
    return dataclasses.replace(stored(smuid, topic), trash_reason=reason, trashed_at=TRASHED_AT, **changes)


JTEGEN = b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n"
USAGE = b"400 Bad request (usage: GET MESSAGE <topic> <smuid|first-last[,...]|*>)"


def with_trash(*messages, topics=(IBM,), live=(), registry=None, login=JTEGEN, **options):
    """Sessions whose store holds ``messages`` in the Trash of their topic and ``live`` in the topic."""
    def factory():
        session = make_session(registry=registry or make_registry(topics), **options)
        run(session, [login])
        for message in messages:
            session.stored.setdefault(f"{message.topic}/Trash", []).append(message)
        for message in live:
            session.stored.setdefault(message.topic, []).append(message)
        return session
    return factory


def test_list_message_on_a_trash_prints_its_ranges_and_the_topic_keeps_its_own():
    factory = with_trash(*[trashed(n) for n in (1809, 1810, 1811, 1845)], live=[stored(1900, IBM)])
    assert wire(feed_three_ways(b"LIST MESSAGES /stocks/quotes/ibm/Trash\r\nLIST MESS /stocks/quotes/ibm\r\n",
                                factory)) == b"200-OK\r\n200 1809-1811,1845\r\n\r\n200-OK\r\n200 1900\r\n\r\n"


@pytest.mark.parametrize("path", ["/stocks/quotes/ibm/trash", "/STOCKS/Quotes/IBM/TRASH", "/stocks/quotes/ibm/tRaSh"])
def test_the_trash_level_and_the_topic_are_case_insensitive(path):
    factory = with_trash(trashed(7))
    assert wire(feed_three_ways(f"LIST MESSAGE {path}\r\nCOUNT MESSAGE {path}\r\n".encode(), factory)) == \
        b"200-OK\r\n200 7\r\n\r\n200-OK\r\n200 1\r\n\r\n"


def test_count_message_counts_the_trash_and_an_empty_trash_counts_zero():
    factory = with_trash(trashed(1), trashed(2), trashed(3), topics=(IBM, "/news"))
    assert wire(feed_three_ways(b"COUNT MESSAGE /stocks/quotes/ibm/Trash\r\nCOUNT MESS /news/Trash\r\n"
                                b"LIST MESSAGE /news/Trash\r\n", factory)) == \
        b"200-OK\r\n200 3\r\n\r\n200-OK\r\n200 0\r\n\r\n200 OK\r\n\r\n"


def test_get_message_from_a_trash_shows_why_and_when_it_died():
    """Rendered as a live GET MESSAGE reply, with the Trash path as its Topic and ``X-Trash-Reason``
    and ``X-Trashed`` (extended attributes, spec 4.1.8.1) after the server's Cmuid."""
    factory = with_trash(trashed(1835, headers=[("Created", "D20010815T08032445Z"), ("Subject", "quote")]))
    message = transcript("""
        S: 200 OK
        S: Topic: /stocks/quotes/ibm/Trash
        S: Created: D20010815T08032445Z
        S: Smuid: www.host.com/1835
        S: Cmuid: jtegen/jtegen005/A004
        S: X-Trash-Reason: expired
        S: X-Trashed: D20010815T09032445Z
        S: Subject: quote
        S:
        S: Content-Type: text/plain
        S: Content-Length: 6
        S:
        S: 34.456
        S: .
        S:
    """)[1]
    assert wire(feed_three_ways(b"GET MESSAGE /stocks/quotes/ibm/Trash 1835\r\n"
                                b"GET MESS /stocks/quotes/ibm/trash *\r\n", factory)) == message * 2


def test_get_message_from_a_trash_selects_by_smuid_and_names_each_reason():
    factory = with_trash(trashed(10), trashed(20, reason="max_retries"), trashed(30, reason="topic_removed"))
    reply = wire(feed_three_ways(b"GET MESSAGE /stocks/quotes/ibm/Trash 15-30\r\n", factory))
    lines = reply.split(b"\r\n")
    assert [line for line in lines if line.startswith((b"Smuid:", b"X-Trash-Reason:"))] == [
        b"Smuid: www.host.com/20", b"X-Trash-Reason: max_retries",
        b"Smuid: www.host.com/30", b"X-Trash-Reason: topic_removed"]


def test_a_publisher_cannot_forge_the_trash_attributes():
    forged = trashed(5, headers=[("X-Trash-Reason", "acked"), ("x-trashed", "D20000101T000000Z")])
    reply = wire(feed_three_ways(b"GET MESSAGE /stocks/quotes/ibm/Trash 5\r\n", with_trash(forged)))
    assert [line for line in reply.split(b"\r\n") if line.lower().startswith(b"x-trash")] == [
        b"X-Trash-Reason: expired", b"X-Trashed: D20010815T09032445Z"]


def test_a_live_get_message_has_no_trash_attributes():
    factory = with_trash(live=[stored(5, IBM)])
    reply = wire(feed_three_ways(b"GET MESSAGE /stocks/quotes/ibm 5\r\n", factory))
    assert reply.startswith(b"200 OK\r\nTopic: /stocks/quotes/ibm\r\n") and b"X-Trash" not in reply


@pytest.mark.parametrize("command, reply", [
    (b"LIST MESSAGE /nope/Trash", b"404 Not found (/nope/Trash)"),
    (b"GET MESSAGE /nope/Trash 1", b"404 Not found (/nope/Trash)"),
    (b"COUNT MESSAGE /nope/Trash", b"404 Not found (/nope/Trash)"),
    (b"GET MESSAGE /stocks/quotes/ibm/Trash 99", b"404 Not found (no such message in /stocks/quotes/ibm/Trash)"),
    (b"GET MESSAGE /stocks/quotes/ibm/Trash 9-1", USAGE),
    # Trash only as the last level, and never the root's
    (b"LIST MESSAGE /Trash", b"400 Bad request ('Trash' is reserved)"),
    (b"LIST MESSAGE /stocks/Trash/quotes", b"400 Bad request ('Trash' is reserved)"),
    (b"LIST MESSAGE /stocks/Trash/Trash", b"400 Bad request ('Trash' is reserved)"),
    (b"COUNT MESSAGE /stocks/Trash/*", b"400 Bad request ('Trash' is reserved)"),
    (b"GET MESSAGE /1stocks/Trash 1",
     b"400 Bad request (level '1stocks' must be alphanumeric and not start with a digit)"),
])
def test_trash_reply_codes(command, reply):
    factory = with_trash(trashed(1), topics=(IBM,))
    assert wire(feed_three_ways(command + b"\r\n", factory)) == reply + b"\r\n\r\n"


@pytest.mark.parametrize("command", [
    b"PUB MESSAGE /t/Trash A1\r\n\r\n.\r\n", b"PUB REPLY /t/Trash A1\r\nCmuid: a/b/c\r\n\r\n.\r\n",
    b"SUB MESSAGE /t/Trash\r\n", b"UNSUB MESSAGE /t/Trash\r\n", b"SUB TOPIC /t/Trash\r\n",
    b"CREATE TOPIC /t/Trash\r\n", b"REM TOPIC /t/Trash\r\n", b"SET TOPIC NAME /t/Trash /u\r\n",
    b"SET TOPIC KEYWORD /t/Trash (A)\r\n", b"LIST TOPIC /t/Trash\r\n", b"COUNT TOPIC /t/Trash\r\n",
    b"COUNT SUB /t/Trash\r\n", b"FIND TOPIC /t/Trash\r\n", b"GET TOPIC KEY /t/Trash\r\n",
    b"SET NOTIFY SUSPEND /t/Trash\r\n",
])
def test_every_other_use_of_a_trash_path_keeps_its_error(command):
    factory = with_trash(trashed(1, "/t"), topics=("/t",))
    assert wire(feed_three_ways(command, factory)) == b"400 Bad request ('Trash' is reserved)\r\n\r\n"


def test_a_trash_is_read_under_its_topics_subscribe_right():
    """UAL: who may not subscribe to a topic may not read its Trash either (404, as for the topic)."""
    access = AccessList({"/stocks": {"subscribe": ["ann"]}, "/stocks/quotes/ibm": {"subscribe": ["jtegen"]}})
    factory = with_trash(trashed(1), trashed(2, "/stocks/quotes/msft"), topics=(IBM, "/stocks/quotes/msft"),
                         access=access)
    commands = (b"LIST MESSAGE /stocks/quotes/ibm/Trash\r\nLIST MESSAGE /stocks/quotes/msft/Trash\r\n"
                b"GET MESSAGE /stocks/quotes/msft/Trash 2\r\nCOUNT MESSAGE /stocks/quotes/msft/Trash\r\n")
    assert wire(feed_three_ways(commands, factory)) == (
        b"200-OK\r\n200 1\r\n\r\n" + b"404 Not found (/stocks/quotes/msft/Trash)\r\n\r\n" * 3)


def test_an_account_topics_trash_is_its_owners_alone():
    message = trashed(3, "/accounts/jtegen")
    owner = with_trash(message, topics=())
    guest = with_trash(message, topics=(), login=b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n")
    command = b"LIST MESSAGE /accounts/jtegen/Trash\r\nCOUNT MESSAGE /accounts/jtegen/Trash\r\n"
    assert wire(feed_three_ways(command, owner)) == b"200-OK\r\n200 3\r\n\r\n200-OK\r\n200 1\r\n\r\n"
    assert wire(feed_three_ways(command, guest)) == b"404 Not found (/accounts/jtegen/Trash)\r\n\r\n" * 2


def test_a_removed_topics_trash_stays_readable():
    """REMOVE TOPIC ends the topic (its messages 404 once drained) but not what its Trash holds."""
    registry = make_registry((IBM,))
    registry.apply(RemoveTopic("r", "admin", IBM, 0), registry.applied + 1)
    factory = with_trash(trashed(4, reason="topic_removed"), registry=registry)
    assert wire(feed_three_ways(b"LIST MESSAGE /stocks/quotes/ibm\r\nLIST MESSAGE /stocks/quotes/ibm/Trash\r\n"
                                b"COUNT MESSAGE /stocks/quotes/ibm/Trash\r\n", factory)) == (
        b"404 Not found (/stocks/quotes/ibm)\r\n\r\n200-OK\r\n200 4\r\n\r\n200-OK\r\n200 1\r\n\r\n")


def test_wildcard_counts_never_include_a_trash():
    """``COUNT MESSAGE /stocks/*`` counts the topics' messages, not what their Trash holds."""
    factory = with_trash(trashed(1), trashed(2), live=[stored(9, IBM)])
    assert wire(feed_three_ways(b"COUNT MESSAGE /stocks/*\r\n", factory)) == b"200-OK\r\n200 1\r\n\r\n"


def test_a_trashed_message_keeps_its_sections():
    binary = Section([("Content-Type", "application/octet-stream"), ("Content-Length", "5")], b"\x00\r\n.\n")
    factory = with_trash(trashed(6, sections=[binary]))
    reply = wire(feed_three_ways(b"GET MESSAGE /stocks/quotes/ibm/Trash 6\r\n", factory))
    assert reply.endswith(b"Content-Length: 5\r\n\r\n\x00\r\n.\n\r\n.\r\n\r\n")
