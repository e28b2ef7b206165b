"""Issue 32 item 9 (spec 4.1.9.1): a subscription ends when its UNTIL passes.

The registry decides it, pure: from the folded SUBSCRIBE's UNTIL and the ``now`` it is given.  Every
gateway folds the same SUBSCRIBE, so each ends the subscription by its own clock at the same UNTIL.
"""

from __future__ import annotations

from gateway.registry import SubscribersChanged
from schemas.events import CreateTopic, Subscribe, Unsubscribe
from tests.unit.test_registry import fold, registry

SECOND = 1_000_000
T0 = 1_800_000_000 * SECOND


def subscribed():
    reg = registry()
    fold(reg, [CreateTopic("c", "alice", "/t", 0), CreateTopic("d", "alice", "/u", 0),
               Subscribe("alice", "g", "/t", T0, until=T0 + 10 * SECOND),
               Subscribe("bob", "g", "/t", T0, until=T0 + 20 * SECOND),
               Subscribe("bob", "g", "/u", T0)])
    return reg


def test_a_subscription_ends_at_its_until_and_the_count_drops():
    reg = subscribed()
    assert reg.next_until() == T0 + 10 * SECOND
    assert reg.end_subscriptions(T0 + 10 * SECOND - 1) == []

    assert reg.end_subscriptions(T0 + 10 * SECOND) == [SubscribersChanged("/t", 1)]
    assert [s.pattern for s in reg.account_subscriptions("alice")] == []
    assert reg.subscriber_count("/t") == 1 and reg.recipients("/t", T0 + 5 * SECOND) == ["bob"]
    assert reg.next_until() == T0 + 20 * SECOND

    assert reg.end_subscriptions(T0 + 60 * SECOND) == [SubscribersChanged("/t", 0)]
    assert [s.pattern for s in reg.account_subscriptions("bob")] == ["/u"]  # no UNTIL: stays
    assert reg.next_until() is None


def test_a_new_until_or_an_unsubscribe_replaces_the_old_end():
    reg = subscribed()
    fold(reg, [Subscribe("alice", "g", "/t", T0, until=T0 + 30 * SECOND),  # re-defined: later
               Unsubscribe("bob", "g", "/t", T0)])
    assert reg.next_until() == T0 + 30 * SECOND
    assert reg.end_subscriptions(T0 + 25 * SECOND) == []
    fold(reg, [Subscribe("alice", "g", "/t", T0)])  # un-defined: no end any more
    assert reg.next_until() is None
    assert reg.end_subscriptions(T0 + 3600 * SECOND) == []
    assert reg.subscriber_count("/t") == 1


def test_two_gateways_end_the_same_subscriptions_whenever_each_looks():
    one, two = subscribed(), subscribed()
    one.end_subscriptions(T0 + 15 * SECOND)
    two.end_subscriptions(T0 + 11 * SECOND), two.end_subscriptions(T0 + 15 * SECOND)
    assert one.subscriptions == two.subscriptions
