"""The registry's part in federation (issue 33): the forwarding rule in early routing, and remote
virtual topics as the fold keeps them and the link process reads them (:meth:`Registry.remote_links`)."""

from __future__ import annotations

from gateway.registry import RemoteLink
from schemas.events import CreateTopic, RemoveTopic, RenameTopic, Subscribe

from tests.gateway.test_feeding import make_registry

PEERS = {"bfarm": "b.example", "cfarm": "c.example"}


def registry_with(*events):
    registry = make_registry(["/news", "/stocks/ibm"])
    for event in events:
        if hasattr(event, "request"):
            registry.expect(event.request)
        registry.apply(event, registry.applied + 1)
    return registry


def subscribed(*accounts: str):
    return registry_with(*[Subscribe(account, "g", "/news", 0) for account in accounts])


def test_another_farms_link_is_routed_a_message_only_as_its_depth_and_hops_allow():
    registry = subscribed("bob", "bfarm", "cfarm")
    assert registry.recipients("/news", 1) == ["bfarm", "bob", "cfarm"]  # no peers named: as before
    assert registry.recipients("/news", 1, peers=PEERS) == ["bob"]  # Depth 0 (none given): stays here
    assert registry.recipients("/news", 1, depth=1, peers=PEERS) == ["bfarm", "bob", "cfarm"]
    assert registry.recipients("/news", 1, depth=-1, hops=["b.example"], peers=PEERS) == ["bob", "cfarm"]


def link(request="r1", topic="/quotes/ibm", target="b.example/stocks/ibm", account="jtegen"):
    return CreateTopic(request, account, topic, 0, target=target)


def test_a_remote_link_is_kept_with_its_creator_and_its_messages_stay_on_it():
    registry = registry_with(link())
    assert registry.outcome("r1").code == 200
    assert registry.resolve("/quotes/ibm") == "/quotes/ibm"  # the link process stores them there
    assert registry.remote_link("/quotes/ibm") and not registry.remote_link("/news")
    assert registry.remote_links() == [RemoteLink("/quotes/ibm", "b.example", "/stocks/ibm", "jtegen")]
    assert registry.topics["/quotes"].linked_by is None  # an ancestor made on the way is a plain topic


def test_remote_links_follow_renames_and_removals():
    registry = registry_with(link(), link("r2", "/quotes/sony", "c.example/stocks/sony", "ann"),
                             RenameTopic("r3", "jtegen", "/quotes/ibm", "/q/ibm", 0))
    assert registry.remote_links() == [RemoteLink("/q/ibm", "b.example", "/stocks/ibm", "jtegen"),
                                       RemoteLink("/quotes/sony", "c.example", "/stocks/sony", "ann")]
    registry.apply(RemoveTopic("r4", "ann", "/quotes/sony", 0), registry.applied + 1)
    assert [remote.topic for remote in registry.remote_links()] == ["/q/ibm"]


def test_a_local_link_to_a_remote_link_and_a_bad_remote_target_are_refused():
    registry = registry_with(link(), CreateTopic("r2", "jtegen", "/alias", 0, target="/quotes/ibm"),
                             link("r3", "/bad", "not a domain/x"))
    assert registry.outcome("r2").code == 405  # a link to a link: as for local ones
    assert registry.outcome("r3").code == 405 and not registry.live("/bad")  # the fold never trips on one
    assert [remote.topic for remote in registry.remote_links()] == ["/quotes/ibm"]
