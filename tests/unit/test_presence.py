"""The farm-wide presence fold: every gateway folding partition 0 agrees on who is logged in where."""

from __future__ import annotations

from gateway.server.presence import Arrived, Left, PresenceMap
from gateway.registry import Registry
from schemas.events import NodeReset, Presence, Subscribe, Sync, decode


def fold(target: PresenceMap, events) -> list:
    changes = []
    for event in events:
        changes += target.apply(decode(event.to_bytes()))  # as the control tail hands them over
    return changes


def test_an_account_arrives_with_its_first_node_and_leaves_with_its_last():
    presence = PresenceMap()
    changes = fold(presence, [Presence(1, "ann", True), Presence(2, "ann", True), Presence(1, "ann", False)])
    assert changes == [Arrived("ann")]
    assert presence.present("ann") and presence.nodes("ann") == {2}
    assert fold(presence, [Presence(2, "ann", False)]) == [Left("ann")]
    assert not presence.present("ann") and presence.nodes("ann") == set()


def test_repeated_and_stale_announcements_change_nothing():
    """A gateway announces again after a failed append: a repeat must not make anyone leave twice."""
    presence = PresenceMap()
    assert fold(presence, [Presence(1, "ann", False)]) == []  # absent from a node it was never at
    assert fold(presence, [Presence(1, "ann", True), Presence(1, "ann", True)]) == [Arrived("ann")]
    assert fold(presence, [Presence(3, "ann", False)]) == []  # not at node 3: still at node 1
    assert fold(presence, [Presence(1, "ann", False), Presence(1, "ann", False)]) == [Left("ann")]


def test_a_node_reset_ends_that_nodes_logins_only():
    """A gateway starting again (after a crash too): its previous incarnation's logins are gone;
    an account also logged in elsewhere stays present."""
    presence = PresenceMap()
    fold(presence, [Presence(1, "ann", True), Presence(1, "bob", True), Presence(2, "bob", True),
                    Presence(2, "cat", True)])
    assert fold(presence, [NodeReset(1)]) == [Left("ann")]
    assert (presence.present("ann"), presence.nodes("bob"), presence.nodes("cat")) == (False, {2}, {2})
    assert fold(presence, [NodeReset(1)]) == []
    assert sorted(fold(presence, [NodeReset(2)]), key=lambda c: c.account) == [Left("bob"), Left("cat")]


def test_other_partition_0_events_are_not_presence():
    presence = PresenceMap()
    assert fold(presence, [Sync("r1"), Subscribe("ann", "g", "/q", 0, request="r2")]) == []
    assert presence.apply(None) == []  # a skipped record (publish, ack) as the control tail hands it
    assert not presence.present("ann")


def test_two_gateways_folding_the_same_log_agree():
    log = [Presence(1, "ann", True), Presence(2, "bob", True), NodeReset(2), Presence(2, "ann", True),
           Presence(1, "ann", False), Presence(1, "cat", True)]
    one, two = PresenceMap(), PresenceMap()
    assert fold(one, log) == fold(two, log) == [Arrived("ann"), Arrived("bob"), Left("bob"), Arrived("cat")]
    assert {a: one.nodes(a) for a in ("ann", "bob", "cat")} == {a: two.nodes(a) for a in ("ann", "bob", "cat")} == {
        "ann": {2}, "bob": set(), "cat": {1}}


def test_the_registry_admits_the_subscribers_the_job_could_hand_a_one_message_to():
    """Who could take a DELIVERY ONE message: a subscription covering its topic whose SINCE/UNTIL
    admit its acceptance time (as the job's hand-on picks)."""
    registry = Registry(is_account=lambda name: True, server_timeout="01:00:00:00")
    for event in [Subscribe("ann", "g", "/jobs/*", 0), Subscribe("bob", "g", "/jobs/x", 0, since=100, until=200),
                  Subscribe("cat", "g", "/news", 0)]:
        registry.apply(event, registry.applied + 1)
    assert [a for a in ("ann", "bob", "cat", "dan") if registry.admits(a, "/jobs/x", 150)] == ["ann", "bob"]
    assert [a for a in ("ann", "bob") if registry.admits(a, "/jobs/x", 200)] == ["ann"]  # UNTIL is exclusive
    assert [a for a in ("ann", "bob") if registry.admits(a, "/jobs/x", 99)] == ["ann"]
    assert not registry.admits("ann", "/jobs", 150)  # /jobs/* covers what is below /jobs only
