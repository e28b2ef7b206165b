"""Access control in the sans-I/O core (issue 32, items 1 and 2): virtual topics judged on their
target, account topics never link targets, PUB REPLY only to a message the replier could receive.
The sessions run on the real :class:`gateway.registry.Registry` and :class:`gateway.ual.AccessList`;
``session.stored`` is what the ``messages`` table would answer."""

from __future__ import annotations

from gateway.server.book import SeenMessages
from gateway.server.message_store import StoredMessage
from gateway.protocol.actions import Durable
from gateway.ual import AccessList
from schemas.events import CreateTopic, Deliver

from tests.gateway.test_feeding import make_registry, make_session, run, wire

#: Only jtegen may read or publish on /secret; everything else is open.
ACCESS = AccessList({"/secret": {"subscribe": ["jtegen"], "publish": ["jtegen"]}})
LOGINS = {"jtegen": b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n",
          "guest": b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n"}


def linked_registry():
    """/secret, and /pub/alias linking to it."""
    registry = make_registry(["/secret", "/open"])
    registry.apply(CreateTopic("r", "jtegen", "/pub/alias", 0, target="/secret"), registry.applied + 1)
    return registry


def session_as(account: str, registry=None, access=ACCESS, **options):
    session = make_session(registry=registry or linked_registry(), access=access, **options)
    run(session, [LOGINS[account]])
    assert session.account == account
    return session


def answer(session, command: bytes) -> bytes:
    return wire(run(session, [command]))


# -- item 1


def test_reading_through_a_link_needs_the_read_right_on_its_target():
    guest = session_as("guest")
    assert answer(guest, b"SUB MESSAGE /pub/alias\r\n") == \
        b"401 Unauthorized (no subscribe permission on /pub/alias)\r\n\r\n"
    assert answer(guest, b"LIST MESSAGE /pub/alias\r\n") == b"404 Not found (/pub/alias)\r\n\r\n"
    assert answer(guest, b"COUNT MESSAGE /pub/alias\r\n") == b"404 Not found (/pub/alias)\r\n\r\n"
    assert answer(guest, b"LIST TOPIC /pub\r\n") == b"200 OK\r\n\r\n"
    jtegen = session_as("jtegen")
    assert answer(jtegen, b"SUB MESSAGE /pub/alias\r\n") == b"200-OK\r\n200 /secret\r\n\r\n"
    assert answer(jtegen, b"LIST TOPIC /pub\r\n") == b"200-OK\r\n200 /pub/alias > /secret\r\n\r\n"


def test_a_link_is_made_only_by_a_login_that_may_reach_its_target():
    guest = session_as("guest")
    assert answer(guest, b"CREATE TOPIC /pub/mine > /secret\r\n") == \
        b"401 Unauthorized (no subscribe or publish permission on /secret)\r\n\r\n"
    assert answer(guest, b"CREATE TOPIC /pub/mine > /open\r\n") == b"200 OK\r\n\r\n"


def test_an_account_topic_is_never_a_link_target():
    for account in ("guest", "jtegen"):
        session = session_as(account)
        assert answer(session, b"CREATE TOPIC /a/spy > /accounts/jtegen\r\n") == \
            b"405 Not allowed (topic link bad: an account topic is never a link target)\r\n\r\n"
    registry = make_registry(["/a"])  # the fold refuses it too, whichever gateway appended it
    registry.expect("spy")
    registry.apply(CreateTopic("spy", "guest", "/a/spy", 0, target="/accounts/jtegen"), registry.applied + 1)
    assert registry.outcome("spy").code == 405
    assert registry.resolve("/a/spy") is None


def test_what_a_login_may_be_sent_is_judged_on_the_real_topic_now():
    guest, jtegen = session_as("guest"), session_as("jtegen")
    assert not guest.may_read("/secret") and jtegen.may_read("/secret")
    assert not guest.may_read("/pub/alias") and jtegen.may_read("/pub/alias")
    assert guest.may_read("/accounts/guest") and not guest.may_read("/accounts/jtegen")
    assert guest.may_read("/open")


# -- item 2


def stored(smuid: int, topic: str, publisher: str, cmuid: str, headers=()) -> StoredMessage:
    return StoredMessage(smuid, topic, cmuid, publisher, f"{publisher}0456", 0, 0, list(headers), [])


def reply(session, topic: str, replied_to: str) -> bytes:
    return answer(session, f"PUB REPLY {topic} R1\r\nCmuid: {replied_to}\r\n\r\n.\r\n".encode())


def test_a_reply_to_a_message_that_is_not_there_is_404_and_goes_nowhere():
    guest = session_as("guest")
    for topic, replied_to in [("/nowhere", "jtegen/jtegen0456/A004"), ("/open", "jtegen/jtegen0456/A004")]:
        actions = run(guest, [f"PUB REPLY {topic} R1\r\nCmuid: {replied_to}\r\n\r\n.\r\n".encode()])
        assert wire(actions) == (f"404 Not found (no message {replied_to} on {topic} that this login could "
                                 f"receive)\r\n\r\n").encode()
        assert not [a for a in actions if isinstance(a, Durable)]


def test_a_reply_to_a_message_the_replier_may_not_read_is_404():
    guest = session_as("guest")
    guest.stored["/secret"] = [stored(7, "/secret", "jtegen", "S1")]
    assert reply(guest, "/secret", "jtegen/jtegen0456/S1").startswith(b"404 ")
    assert reply(guest, "/pub/alias", "jtegen/jtegen0456/S1").startswith(b"404 ")  # nor through a link to it


def test_a_reply_to_a_stored_message_of_the_topic_goes_to_its_publisher():
    guest = session_as("guest")
    guest.stored["/open"] = [stored(7, "/open", "jtegen", "Q1")]
    [durable] = [a for a in run(guest, [b"PUB REPLY /open R1\r\nCmuid: jtegen/jtegen0456/Q1\r\n\r\n.\r\n"])
                 if isinstance(a, Durable)]
    assert durable.event.topic == "/accounts/jtegen"
    assert ("In-Reply-To", "jtegen/jtegen0456/Q1") in durable.event.headers


def test_a_message_just_routed_is_known_before_the_job_commits_it():
    seen = SeenMessages()
    seen.add(Deliver("guest", 7, "/open", "Q1", "jtegen", "jtegen0456", 0))
    guest = session_as("guest", known_message=seen.get)
    assert reply(guest, "/open", "jtegen/jtegen0456/Q1").startswith(b"200-OK")
    assert reply(guest, "/secret", "jtegen/jtegen0456/Q1").startswith(b"404 ")  # not a message of that topic


def test_the_publisher_replies_back_on_the_reply_it_received():
    """4.1.8.2: "The original publisher can now reply to the end point that sent the reply", naming
    the reply's Reply-Topic (what the reference client does) or its own account topic."""
    jtegen = session_as("jtegen")
    jtegen.stored["/accounts/jtegen"] = [stored(9, "/accounts/jtegen", "guest", "R1", [("Reply-Topic", "/open")])]
    assert reply(jtegen, "/open", "guest/guest0456/R1").startswith(b"200-OK")
    assert reply(jtegen, "/accounts/jtegen", "guest/guest0456/R1").startswith(b"200-OK")
    guest = session_as("guest")  # nobody else's account topic holds it for them
    guest.stored["/accounts/jtegen"] = jtegen.stored["/accounts/jtegen"]
    assert reply(guest, "/open", "guest/guest0456/R1").startswith(b"404 ")


def test_the_memory_of_messages_seen_is_bounded():
    seen = SeenMessages(limit=2)
    for n in range(3):
        seen.add(Deliver("bob", n, "/open", f"A{n}", "ann", "g", 0, headers=[("Reply-Topic", "/t")]))
    assert seen.get("ann/g/A0") is None
    assert seen.get("ann/g/A2") == ("/open", "/t")


# -- what a login may not read is not counted, and a link reads its target


def test_list_get_and_count_message_through_a_link_read_its_targets_messages():
    """A virtual topic is another name for its target (4.1.4): what SUB MESSAGE through it would
    deliver, LIST, GET and COUNT MESSAGE through it show."""
    jtegen = session_as("jtegen")
    jtegen.stored["/secret"] = [stored(7, "/secret", "jtegen", "S1")]
    assert answer(jtegen, b"COUNT MESSAGE /pub/alias\r\n") == b"200-OK\r\n200 1\r\n\r\n"
    assert b"200 7" in answer(jtegen, b"LIST MESSAGE /pub/alias\r\n")
    assert answer(jtegen, b"GET MESSAGE /pub/alias 7\r\n").startswith(b"200")


def test_count_message_over_a_wildcard_counts_only_topics_the_login_may_read():
    registry = make_registry(["/top/secret", "/top/open"])
    guest = session_as("guest", registry=registry, access=AccessList({"/top/secret": {"subscribe": ["jtegen"]}}))
    guest.stored["/top/secret"] = [stored(7, "/top/secret", "jtegen", "S1")]
    guest.stored["/top/open"] = [stored(8, "/top/open", "jtegen", "O1")]
    assert answer(guest, b"COUNT MESSAGE /top/*\r\n") == b"200-OK\r\n200 1\r\n\r\n"


def test_count_subscribers_over_a_wildcard_counts_only_topics_the_login_may_read():
    registry = make_registry(["/top/secret", "/top/open"])
    jtegen = session_as("jtegen", registry=registry, access=AccessList({"/top/secret": {"subscribe": ["jtegen"]}}))
    assert answer(jtegen, b"SUB MESSAGE /top/secret\r\n").startswith(b"200")
    guest = session_as("guest", registry=registry, access=AccessList({"/top/secret": {"subscribe": ["jtegen"]}}))
    assert answer(guest, b"COUNT SUBSCRIBERS /top/*\r\n") == b"200-OK\r\n200 0\r\n\r\n"
    assert answer(jtegen, b"COUNT SUBSCRIBERS /top/*\r\n") == b"200-OK\r\n200 1\r\n\r\n"


def test_another_accounts_topic_cannot_be_watched():
    """As SUB MESSAGE /accounts/<other> is 403, so are SUB TOPIC and SUB SUBSCRIBER on it."""
    guest = session_as("guest")
    for resource in (b"TOPIC", b"SUBSCRIBER"):
        assert answer(guest, b"SUB " + resource + b" /accounts/jtegen\r\n").startswith(b"403 ")
