"""The registry fold: every gateway folding the same partition decides the same way."""

from __future__ import annotations

from gateway.registry import SUBSCRIBERS_WATCH, TOPIC_WATCH, Registry, ServerTimeoutChanged, TopicChanged
from schemas.events import (
    CreateTopic,
    RemoveTopic,
    RenameTopic,
    SetLogin,
    SetServerTimeout,
    Subscribe,
    Sync,
    Unsubscribe,
    Watch,
)


def registry() -> Registry:
    return Registry(is_account=lambda name: name in ("alice", "bob"), server_timeout="01:00:00:00")


def fold(target: Registry, events) -> list:
    changes = []
    for event in events:
        changes += target.apply(event, target.applied + 1)
    return changes


def test_two_gateways_folding_the_same_log_decide_the_same():
    log = [CreateTopic("a", "alice", "/t", 0), CreateTopic("b", "bob", "/t", 0), RemoveTopic("c", "bob", "/t", 0),
           CreateTopic("d", "alice", "/t", 0)]
    one, two = registry(), registry()
    one.expect("a"), one.expect("c")
    two.expect("b"), two.expect("d")
    fold(one, log), fold(two, log)
    assert one.outcome("a").code == 200 and two.outcome("b").code == 409  # the first CREATE wins everywhere
    assert one.outcome("c").lines == ("OK", "0 messages pending") and two.outcome("d").code == 200
    assert one.topics == two.topics
    assert one.outcome("b") is None  # only what this gateway appended is kept


def test_outcomes_are_kept_only_for_expected_requests_and_handed_out_once():
    reg = registry()
    reg.expect("mine")
    fold(reg, [CreateTopic("theirs", "bob", "/a", 0), CreateTopic("mine", "alice", "/b", 0)])
    assert reg.outcome("theirs") is None
    assert reg.outcome("mine").code == 200
    assert reg.outcome("mine") is None


def test_every_record_advances_the_applied_offset_even_skipped_ones():
    reg = registry()
    reg.apply(None, 41)  # a publish the tail skipped undecoded
    assert reg.applied == 41
    reg.apply(Sync("s"), 42)
    assert reg.applied == 42


def test_rename_moves_the_subtree_and_frees_the_old_names():
    reg = registry()
    fold(reg, [CreateTopic("r", "a", "/a/b/c", 0)])
    changes = fold(reg, [RenameTopic("r", "a", "/a/b", "/x/y", 0)])
    assert changes == [TopicChanged("/x", "ADDED"), TopicChanged("/a/b", "RENAME /x/y"),
                       TopicChanged("/a/b/c", "RENAME /x/y/c")]
    assert reg.live("/x/y/c") and not reg.live("/a/b/c") and reg.live("/a")
    reg.expect("again")
    fold(reg, [CreateTopic("again", "a", "/a/b", 0)])
    assert reg.outcome("again").code == 200  # a renamed-away name can be created anew


def test_remove_takes_the_subtree_and_virtual_links_to_it_stop_resolving():
    reg = registry()
    fold(reg, [CreateTopic("r", "a", "/a/b", 0), CreateTopic("r", "a", "/v", 0, target="/a/b")])
    assert reg.resolve("/v") == "/a/b"
    changes = fold(reg, [RemoveTopic("r", "a", "/a", 0)])
    assert changes == [TopicChanged("/a", "DELETED"), TopicChanged("/a/b", "DELETED")]
    assert reg.resolve("/v") is None and reg.children("/") == ["/v"]


def test_account_topics_exist_for_known_accounts_only_and_stay_hidden():
    reg = registry()
    assert reg.live("/accounts/alice") and not reg.live("/accounts/mallory")
    assert reg.resolve("/accounts/bob") == "/accounts/bob"
    assert not reg.visible("/accounts/alice") and reg.children("/") == []


def test_watchers_match_exactly_or_by_wildcard():
    reg = registry()
    fold(reg, [CreateTopic("r", "a", "/s/a", 0), Watch("w", "alice", TOPIC_WATCH, "/s/*", 0),
               Watch("w", "bob", SUBSCRIBERS_WATCH, "/s/a", 0)])
    assert reg.watchers(TOPIC_WATCH, "/s/a") == {"alice"}
    assert reg.watchers(SUBSCRIBERS_WATCH, "/s/a") == {"bob"}
    assert reg.watchers(TOPIC_WATCH, "/t") == set()


def test_unsubscribe_covers_like_the_job_and_everything_ends_watches_too():
    reg = registry()
    reg.expect("u")
    fold(reg, [Subscribe("bob", "g", "/a/b", 0), Subscribe("bob", "g", "/a/*", 0), Subscribe("bob", "g", "/c", 0),
               Watch("w", "bob", TOPIC_WATCH, "/c", 0), Unsubscribe("bob", "g", "/a/*", 0, "u")])
    assert reg.outcome("u").lines == ("OK", "MESSAGE /a/*", "MESSAGE /a/b")
    reg.expect("all")
    fold(reg, [Unsubscribe("bob", "g", "/*", 0, "all", everything=True)])
    assert reg.outcome("all").lines == ("OK", "MESSAGE /c", "TOPIC /c")
    assert reg.subscriptions["bob"] == {} and reg.watches["bob"] == set()


def test_login_settings_and_server_timeout():
    reg = registry()
    changes = fold(reg, [SetLogin("r", "alice", "password", "hash", 0), SetLogin("r", "alice", "email", "a@b", 0),
                         SetServerTimeout("r", "00:00:05:00", 0)])
    assert reg.passwords == {"alice": "hash"} and reg.profiles == {"alice": {"email": "a@b"}}
    assert changes == [ServerTimeoutChanged("00:00:05:00")] and reg.server_timeout == "00:00:05:00"


def test_recipients_are_the_accounts_the_job_routes_a_delivery_all_message_to():
    """Exact and wildcard patterns of ancestors (never of the topic itself, never of a sibling
    prefix), SINCE/UNTIL around the acceptance time, the account topic's owner, and nobody once
    unsubscribed (a wildcard UNSUBSCRIBE ends what it covers)."""
    target = registry()
    fold(target, [Subscribe("alice", "g", "/a/b", 0), Subscribe("bob", "g", "/a/*", 0),
                  Subscribe("carol", "g", "/a/b/*", 0), Subscribe("dan", "g", "/ab/*", 0),
                  Subscribe("erin", "g", "/a/b", 0, since=100, until=200)])
    assert target.recipients("/a/b", 150) == ["alice", "bob", "erin"]
    assert target.recipients("/a/b", 99) == target.recipients("/a/b", 200) == ["alice", "bob"]
    assert target.recipients("/a/b/c", 150) == ["bob", "carol"]
    assert target.recipients("/accounts/Dan", 0) == ["dan"]
    assert target.recipients("/accounts/dan/inbox", 0) == []
    assert target.may_reach("/a/b/c") and target.may_reach("/accounts/dan") and not target.may_reach("/ab")
    fold(target, [Unsubscribe("bob", "g", "/a/*", 0), Unsubscribe("erin", "g", "/a/b", 0)])
    assert target.recipients("/a/b", 150) == ["alice"]
    assert not target.may_reach("/a/c")
