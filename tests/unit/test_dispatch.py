"""DELIVERY ONE's in-flight limit (streaming.dispatch.assign): who holds each ONE message."""

from __future__ import annotations

from collections import Counter

from streaming.dispatch import Holdings, Offer, Subscriber, assign

ANN, BOB, CAROL = (Subscriber(name, "/w") for name in ("ann", "bob", "carol"))


def limit(n):
    return lambda topic: n


def test_a_pick_with_room_keeps_its_subscriber():
    offers = [Offer(1, "/w", 0, 10, picked="bob"), Offer(2, "/w", 0, 11, picked="bob")]
    assert assign(offers, [ANN, BOB], Holdings(), limit(2)) == {1: "bob", 2: "bob"}


def test_picks_beyond_the_limit_go_to_the_subscriber_with_most_room_then_wait():
    offers = [Offer(smuid, "/w", 0, 10 + smuid, picked="ann") for smuid in range(1, 7)]
    holders = assign(offers, [ANN, BOB], Holdings(in_flight=Counter({("bob", "/w"): 1})), limit(2))
    assert holders == {1: "ann", 2: "ann", 3: "bob", 4: None, 5: None, 6: None}


def test_waiting_messages_go_first_in_queue_order_priority_then_age():
    offers = [Offer(5, "/w", 0, 50, picked="ann"),  # new, picked ann
              Offer(1, "/w", 0, 10), Offer(2, "/w", 9, 20), Offer(3, "/w", 0, 30)]  # waiting
    holders = assign(offers, [ANN], Holdings(in_flight=Counter({("ann", "/w"): 1})), limit(3))
    assert holders == {2: "ann", 1: "ann", 3: None, 5: None}  # 2 (priority 9), then the oldest


def test_the_limit_counts_per_topic():
    offers = [Offer(1, "/w/a", 0, 1, picked="ann"), Offer(2, "/w/b", 0, 2, picked="ann")]
    wildcard = Subscriber("ann", "/w/*")
    holdings = Holdings(in_flight=Counter({("ann", "/w/a"): 1}))
    assert assign(offers, [wildcard], holdings, limit(1)) == {1: None, 2: "ann"}


def test_only_subscriptions_that_admit_the_message_take_it():
    late = Subscriber("bob", "/w", since=100)  # SINCE after the message's acceptance
    gone = Subscriber("carol", "/w")
    other = Subscriber("dan", "/x/*")
    holders = assign([Offer(1, "/w", 0, 50)], [late, gone, other], Holdings(gone=frozenset({"carol"})), limit(5))
    assert holders == {1: None}


def test_one_that_handed_the_message_on_gets_it_back_only_when_nobody_else_is_there():
    offer = Offer(1, "/w", 0, 10)
    handed = Holdings(released=frozenset({("ann", 1)}), in_flight=Counter({("bob", "/w"): 1}))
    assert assign([offer], [ANN, BOB], handed, limit(1)) == {1: None}  # bob is full: it waits for bob
    assert assign([offer], [ANN], handed, limit(1)) == {1: "ann"}  # ann alone: back to ann


def test_equal_room_spreads_by_a_stable_hash():
    offers = [Offer(smuid, "/w", 0, smuid) for smuid in range(1, 61)]
    first = assign(offers, [ANN, BOB, CAROL], Holdings(), limit(100))
    assert first == assign(list(reversed(offers)), [CAROL, BOB, ANN], Holdings(), limit(100))  # deterministic
    assert sorted(Counter(first.values()).values()) == [20, 20, 20]  # most room first: even shares
