"""A peer's NOTIFY read, dropped or made this farm's Publish: the link's pure rules."""

from __future__ import annotations

import asyncio

import pytest

from federation import inbound
from federation.link import Backoff
from federation.seen import Seen, forwarded_key
from schemas.events import Publish, Section

SECTION = Section([("Content-Type", "text/plain"), ("Content-Length", "6")], b"24.567")


def notify(topic: str = "/news/x", smuid: str = "a.example/42", **attributes: str) -> tuple[str, list, list]:
    headers = [("Created", "D20261128T100000Z"), ("Smuid", smuid), ("Cmuid", "alice/alice0123/C1")]
    headers += [(name.replace("_", "-"), value) for name, value in attributes.items()]
    return topic, headers, [SECTION]


def read(*args, peer: str = "a.example", **attributes) -> inbound.Arrival:
    return inbound.arrival(*notify(*args, **attributes), peer)


def test_a_local_message_of_the_peer_is_its_origin_with_its_domain():
    message = read(Depth="1", Priority="3")
    assert (message.origin, message.origin_topic, message.path) == ("a.example/42", "a.example/news/x", "/news/x")
    assert (message.depth, message.hops) == (1, ())
    assert message.headers == [("Priority", "3")]  # Created, Smuid, Cmuid and Depth are fields here
    assert message.sections == [SECTION]


def test_a_forwarded_message_keeps_its_origin_topic_and_route():
    message = read("c.example/News/X", "c.example/7", Depth="-1", Hops="c.example, B.example")
    assert (message.origin, message.origin_topic, message.path) == ("c.example/7", "c.example/news/x", "/news/x")
    assert (message.depth, message.hops) == (-1, ("c.example", "b.example"))


def test_a_bare_smuid_is_the_peers():
    assert read(smuid="42").origin == "a.example/42"


@pytest.mark.parametrize("attributes", [{"Depth": "-2"}, {"Depth": "x"}])
def test_a_bad_depth_is_malformed(attributes):
    with pytest.raises(inbound.Malformed):
        read(**attributes)


def test_no_smuid_or_a_bad_topic_is_malformed():
    topic, headers, sections = notify()
    with pytest.raises(inbound.Malformed):
        inbound.arrival(topic, [h for h in headers if h[0] != "Smuid"], sections, "a.example")
    with pytest.raises(inbound.Malformed):
        inbound.arrival("news", headers, sections, "a.example")


def test_forwarding_spends_one_depth_and_adds_the_peer_to_the_hops():
    assert inbound.forwarded(read(Depth="2", Hops="c.example"), "A.example") == inbound.Outbound(
        "/news/x", 1, ("c.example", "a.example"), "a.example/news/x")
    assert inbound.forwarded(read(Depth="-1"), "a.example").depth == -1


def test_a_pull_stays_here_as_a_message_of_its_target():
    pulled = inbound.pulled(read("/stocks/ibm", "b.example/9", Hops="c.example"), "/quotes/ibm",
                            "b.example/stocks/ibm")
    assert pulled == inbound.Outbound("/quotes/ibm", 0, ("b.example", "c.example"), "b.example/stocks/ibm")


@pytest.mark.parametrize("smuid, hops, depth, seen, reason", [
    ("b.example/1", "", "1", False, inbound.OWN_ORIGIN),  # came back round a loop
    ("c.example/1", "c.example,b.example", "1", False, inbound.LOOPED),  # passed here already
    ("a.example/1", "", "0", False, inbound.SPENT),  # an older peer forwarding a Depth 0 message
    ("a.example/1", "", None, False, inbound.SPENT),  # no Depth: 0
    ("a.example/1", "", "1", True, inbound.SEEN),  # another route, or a resend after a crash
    ("a.example/1", "c.example", "-1", False, None),
])
def test_drops(smuid, hops, depth, seen, reason):
    attributes = {"Hops": hops} if hops else {}
    if depth is not None:
        attributes["Depth"] = depth
    message = read(smuid=smuid, **attributes)
    outbound = inbound.forwarded(message, "a.example")
    keys = {inbound.dedup_key(smuid, "/news/x")} if seen else set()
    assert inbound.drop_reason(message, outbound, "B.example", keys) == reason


def test_a_pull_takes_a_depth_0_message():
    message = read("/stocks/ibm", "b.example/9")
    outbound = inbound.pulled(message, "/quotes/ibm", "b.example/stocks/ibm")
    assert inbound.drop_reason(message, outbound, "a.example", set(), by_depth=False) is None


def test_the_publish_carries_the_route_and_the_publishers_attributes():
    message = read(Depth="1", Priority="3", Timeout="00:00:01:00", Delivery="ONE", Receipt="ALL")
    outbound = inbound.forwarded(message, "a.example")
    now = 1_800_000_000_000_000
    publish = inbound.to_publish(message, outbound, smuid=99, now=now, server_timeout="01:00:00:00",
                                 delivery=None, peer_domain="a.example")
    assert isinstance(publish, Publish)
    assert (publish.smuid, publish.topic, publish.account, publish.guid, publish.cmuid) == (
        99, "/news/x", "a.example", "link", "a.example/42")
    assert (publish.depth, publish.hops, publish.origin, publish.origin_topic) == (
        0, ["a.example"], "a.example/42", "a.example/news/x")
    assert (publish.priority, publish.delivery, publish.receipt, publish.accepted_at) == (3, "one", "none", now)
    assert [name for name, _ in publish.headers] == ["Priority", "Timeout", "Delivery", "Receipt"]
    created = message.created
    assert publish.expires_at == created + 60_000_000  # its Timeout from its Created, not from now
    assert publish.sections == [SECTION]


def test_without_timeout_the_message_gets_this_farms_default_and_the_topics_mode():
    message = read(Depth="1")
    publish = inbound.to_publish(message, inbound.forwarded(message, "a.example"), smuid=1, now=10,
                                 server_timeout="00:00:00:02", delivery="one", peer_domain="a.example")
    assert (publish.expires_at, publish.delivery) == (10 + 2_000_000, "one")
    infinite = read(Depth="1", Timeout="INFINITE")
    assert inbound.expiry(infinite, 10, "00:00:00:02") is None


def test_the_dedup_key_of_a_forwarded_record_and_none_for_a_local_one():
    message = read(Depth="1")
    publish = inbound.to_publish(message, inbound.forwarded(message, "a.example"), smuid=1, now=10,
                                 server_timeout="01:00:00:00", delivery=None, peer_domain="a.example")
    assert forwarded_key(0, b"/news/x", publish.to_bytes()) == (inbound.dedup_key("a.example/42", "/news/x"),
                                                                publish.expires_at)
    local = Publish(smuid=2, topic="/news/x", cmuid="C1", account="alice", guid="g", accepted_at=1,
                    headers=[("X-Note", '"origin":"fake"')])
    assert forwarded_key(1, b"/news/x", local.to_bytes()) is None


def test_a_message_being_appended_by_one_link_is_seen_by_another():
    async def scenario() -> None:
        seen = Seen()
        assert await seen.claim("k")
        other = asyncio.ensure_future(seen.claim("k"))
        await asyncio.sleep(0)
        assert not other.done()
        seen.settle("k", True)
        assert await other is False
        assert await seen.claim("j")
        seen.settle("j", False)  # its append failed: the next one tries
        assert await seen.claim("j")
    asyncio.run(scenario())


def test_a_key_is_forgotten_once_its_message_is_dead_longer_than_the_grace():
    seen = Seen({"dead long ago": 100, "dead just now": 1_900, "alive": 5_000, "state message": None}, grace_us=500)
    assert seen.forget_dead(now=2_000) == 1
    assert ["dead long ago" in seen, "dead just now" in seen, "alive" in seen, "state message" in seen] == [
        False, True, True, True]
    seen.settle("appended", True, expires_at=2_100)
    assert seen.forget_dead(now=3_000) == 2 and len(seen) == 2  # "alive" and the state message are left


def test_backoff_doubles_to_its_maximum_and_starts_again_after_a_success():
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5
