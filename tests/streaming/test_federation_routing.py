"""Federation in the job's routing (issue 33): another farm's link, an account of ``[federation] peers``,
gets a message only when ``schemas.topics.forwards`` allows its Depth and Hops; every other subscriber
as before; and what the job emits carries the message's Depth, Hops and origin."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pyarrow as pa
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake

from schemas import events as ev
from schemas.config import FederationConfig, load_config
from schemas.spark import FEDERATION, MESSAGES_TABLE, arrow_schema
from streaming import dispatch, routing
from streaming.routing.route import route_all_sql
from streaming.routing.sql import run_sql
from streaming.sink import CommandSink
from tests.streaming.test_routing import (  # noqa: F401  (frames: the fixture)
    NOW, at, frames, nack, publish, seq, stored_message, sub_row, subscribe, ts)
from tests.streaming.test_simple_batch import T0, US0, records, store_subscriptions

PEERS = {"link_b": "b.example", "link_c": "c.example"}
FEDERATION_COLUMNS = [name for name, _ in FEDERATION]


def test_a_peer_gets_a_message_only_as_its_depth_and_hops_allow_and_others_as_before(frames):
    subs = frames.subs(*(sub_row(account, "/t") for account in ("bob", "link_b", "link_c")))
    events = frames.events(
        publish(1, 1, "/t", depth=0, hops=[]),  # stays local
        publish(2, 2, "/t", depth=1, hops=[]),  # one farm further: both links
        publish(3, 3, "/t", depth=-1, hops=["C.Example"]),  # no limit, but it passed c.example already
        publish(4, 4, "/t"),  # a record older than federation: depth 0
        publish(5, 5, "/t", depth=2, hops=["b.example"], origin="b.example/77", origin_topic="b.example/s"),
    )
    actual = routing.route(events, routing.subscription_intervals(subs, events), PEERS)

    def row(account, smuid, depth, hops, origin=None, origin_topic=None):
        return (account, smuid, "/t", f"c{smuid}", "pub", "g", at(smuid), 0, [], [], seq(smuid), None, "none", "all",
                depth, hops, origin, origin_topic)

    expected = frames.deliveries(
        row("bob", 1, 0, []),
        row("bob", 2, 1, []), row("link_b", 2, 1, []), row("link_c", 2, 1, []),
        row("bob", 3, -1, ["C.Example"]), row("link_b", 3, -1, ["C.Example"]),
        row("bob", 4, 0, []),
        row("bob", 5, 2, ["b.example"], "b.example/77", "b.example/s"),
        row("link_c", 5, 2, ["b.example"], "b.example/77", "b.example/s"))
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
    # the Deliver the gateway renders NOTIFY MESSAGE from (Smuid, Depth, Hops, the origin's topic)
    delivered = {(d.account, d.smuid): d for d in map(ev.decode, (r.value for r in routing.deliver_records(
        actual).collect()))}
    assert (delivered["link_c", 5].depth, delivered["link_c", 5].hops) == (2, ["b.example"])
    assert (delivered["link_c", 5].origin, delivered["link_c", 5].origin_topic) == ("b.example/77", "b.example/s")
    assert (delivered["bob", 4].depth, delivered["bob", 4].hops, delivered["bob", 4].origin) == (0, [], None)


def test_delivery_one_is_never_handed_to_a_peer_that_may_not_get_it(frames):
    """Picked by routing, by a late SUBSCRIBE, or on a NACK: a link takes a DELIVERY ONE message only
    when it may be forwarded, and then it is a candidate like any other subscriber."""
    def depth(smuid: int) -> int:
        return -1 if smuid % 2 else 0  # odd: no limit; even: stays local

    subs = frames.subs(sub_row("bob", "/jobs/*"), sub_row("link_b", "/jobs/*"))
    events = frames.events(*(publish(n, n, "/jobs/x", delivery="one", depth=depth(n), hops=[]) for n in range(1, 41)))
    picked = {r.smuid: r.account for r in routing.route(events, routing.subscription_intervals(subs, events),
                                                        PEERS).collect()}
    assert {picked[n] for n in range(2, 41, 2)} == {"bob"}  # never to the link
    assert {picked[n] for n in range(1, 41, 2)} == {"bob", "link_b"}  # to either

    # late: link_b subscribes after the messages were stored
    stored = [stored_message(n, "/jobs/x", -n, expires_at=NOW + 1, delivery="one") + (depth(n), [], None, None)
              for n in (1, 2)]
    late = frames.events(subscribe(1, "link_b", "/jobs/*"))
    intervals = routing.subscription_intervals(frames.subs(), late)
    routed_all = run_sql(route_all_sql("{events}", "{intervals}", peers=PEERS),
                                 {"events": late, "intervals": intervals})
    rows = routing.late(late, intervals, frames.of(MESSAGES_TABLE, *stored), frames.of(routing.HELD), routed_all,
                        NOW, PEERS).collect()
    assert [(r.account, r.smuid, r.depth) for r in rows] == [("link_b", 1, -1)]

    # released: bob's NOTIFYs time out; only the message that may be forwarded goes on to the link
    nacks = frames.events(nack(5, "bob", 1), nack(6, "bob", 2))
    messages = frames.of(MESSAGES_TABLE, *((n, "/jobs/x", f"c{n}", "pub", "g", 0, [], [], ts(1), 0, n, 1, None,
                                             "none", "one", depth(n), [], None, None) for n in (1, 2)))
    retrying = frames.of(routing.RETRYING, ("bob", 1, "pending", None, "one"), ("bob", 2, "pending", None, "one"))
    released = routing.released(nacks, retrying, routing.extract_acks(nacks), frames.of(routing.EXPIRING),
                                routing.subscription_intervals(subs, nacks), messages, PEERS)
    assert [(r.account, r.smuid, r.to) for r in released.collect()] == [("bob", 1, "link_b")]


def test_a_waiting_delivery_one_message_goes_to_a_peer_only_as_its_depth_allows():
    """DELIVERY ONE's in-flight limit hands waiting messages on after routing (``dispatch.assign``): the
    same rule, so a link with room never takes what may not reach its farm."""
    subscribers = [dispatch.Subscriber("bob", "/q"), dispatch.Subscriber("link_b", "/q")]
    full = dispatch.Holdings(Counter({("bob", "/q"): 1}))
    offers = [dispatch.Offer(1, "/q", 0, 1, depth=0), dispatch.Offer(2, "/q", 0, 2, depth=1, hops=("B.EXAMPLE",)),
              dispatch.Offer(3, "/q", 0, 3, depth=-1)]
    assert dispatch.assign(offers, subscribers, full, lambda topic: 1, PEERS) == {1: None, 2: None, 3: "link_b"}
    assert dispatch.assign(offers, subscribers, full, lambda topic: 1) == {1: "link_b", 2: None, 3: None}


def test_a_forwarded_publish_is_stored_with_its_origin_in_a_messages_table_older_than_federation(spark, tmp_path):
    """A data dir the job wrote before federation: its ``messages`` table gains the four columns on
    the first batch, its old rows read them as null, and a publish a link forwarded keeps its own."""
    config = replace(load_config(env={}, data_dir=str(tmp_path)), federation=FederationConfig(peers=PEERS))
    before = pa.schema([f for f in arrow_schema(MESSAGES_TABLE) if f.name not in FEDERATION_COLUMNS])
    old = {"smuid": 1, "topic": "/t", "cmuid": "c1", "publisher": "ann", "publisher_guid": "g", "priority": 0,
           "headers": [], "sections": [], "accepted_at": T0, "kafka_partition": 0, "kafka_offset": 0, "batch_id": 0,
           "expires_at": None, "receipt": "none", "delivery": "all"}
    write_deltalake(config.table_path("messages"), pa.Table.from_pylist([old], before))
    store_subscriptions(config, {("bob", "/t"): (None, None), ("link_b", "/t"): (None, None),
                                 ("link_c", "/t"): (None, None)})
    forwarded = ev.Publish(2, "/t", "b.example/77", "b.example", "link", US0, depth=1, hops=["b.example"],
                           origin="b.example/77", origin_topic="b.example/s")
    sink = CommandSink(config)

    out = sink.outputs(records(spark, [forwarded, ev.Publish(3, "/t", "c3", "ann", "g", US0 + 1)]), 1, T0)
    sink.commit_outputs(out, 1)

    delivers = map(ev.decode, out["deliver"].column("value").to_pylist())
    delivered = sorted((d.account, d.smuid, d.origin) for d in delivers)
    assert delivered == [("bob", 2, "b.example/77"), ("bob", 3, None), ("link_c", 2, "b.example/77")]
    stored = DeltaTable(config.table_path("messages")).to_pyarrow_table().sort_by("smuid").to_pylist()
    assert [{name: row[name] for name in ("smuid", *FEDERATION_COLUMNS)} for row in stored] == [
        {"smuid": 1, "depth": None, "hops": None, "origin": None, "origin_topic": None},
        {"smuid": 2, "depth": 1, "hops": ["b.example"], "origin": "b.example/77", "origin_topic": "b.example/s"},
        {"smuid": 3, "depth": 0, "hops": [], "origin": None, "origin_topic": None}]
