"""What a farm's link asks each peer for, from its registry folded from commands partition 0."""

from __future__ import annotations

from dataclasses import replace

from federation.interest import Pull, peer_accounts, pulls, wanted_patterns
from gateway.registry import Registry
from schemas.config import FederationConfig, LinkConfig, SMQPConfig
from schemas.events import CreateTopic, Subscribe, Unsubscribe

CONFIG = replace(SMQPConfig(), gateway=replace(SMQPConfig().gateway, server_host="a.example"), federation=FederationConfig(
    peers={"blink": "b.example", "clink": "c.example"},
    links=(LinkConfig(domain="b.example", address="127.0.0.1:7720", account="alink", accounts={"alice": "PW"}),)))


def folded(*events) -> Registry:
    registry = Registry(is_account=lambda name: True, server_timeout="01:00:00:00")
    for offset, event in enumerate(events):
        registry.apply(event, offset)
    return registry


def sub(account: str, pattern: str) -> Subscribe:
    return Subscribe(account, f"{account}0", pattern, 1)


def test_the_interest_on_a_peer_is_every_subscription_here_but_that_peers_own():
    registry = folded(CreateTopic("r1", "admin", "/news/x", 1), sub("alice", "/news/*"), sub("bob", "/news/x"),
                      sub("clink", "/sport/*"), sub("blink", "/weather/*"), sub("bob", "/accounts/bob"),
                      sub("carl", "/old"), Unsubscribe("carl", "carl0", "/old", 2),
                      Subscribe("dora", "dora0", "/ended/*", 1, until=5))
    assert wanted_patterns(registry, peer_accounts(CONFIG, "b.example"), now=10) == {"/news/*", "/news/x", "/sport/*"}
    assert "/ended/*" in wanted_patterns(registry, set(), now=4)  # until its UNTIL
    assert wanted_patterns(registry, peer_accounts(CONFIG, "C.example"), now=10) == {"/news/*", "/news/x", "/weather/*"}


def test_a_remote_virtual_topic_is_pulled_as_its_creator_when_the_link_names_it_else_as_guest():
    """Needs the registry's remote virtual topics (helper GW: ``Registry.remote_links``)."""
    registry = folded(CreateTopic("r1", "alice", "/quotes/ibm", 1, target="b.example/stocks/ibm"),
                      CreateTopic("r2", "bob", "/quotes/hp", 2, target="b.example/stocks/hp"),
                      CreateTopic("r3", "bob", "/quotes/sun", 3, target="z.example/stocks/sun"))
    assert pulls(registry, CONFIG) == [Pull("/quotes/ibm", "b.example", "/stocks/ibm", "alice"),
                                       Pull("/quotes/hp", "b.example", "/stocks/hp", "guest")]
