"""The routing transforms on literal frames (chispa whole-frame comparisons)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone

import pytest
from chispa import assert_df_equality

from schemas import events as ev
from schemas import spark as schemas_spark
from schemas.spark import DELIVERIES_TABLE, KAFKA_RECORD, MESSAGES_TABLE, SUBSCRIPTIONS_TABLE
from schemas.topics import parse_pattern
from streaming import routing
from streaming.routing import ACKS, DELIVERIES, EVENTS, INTERVALS, KAFKA_OUT
from streaming.routing.clearing import withheld_sql
from streaming.routing.retries import reassigned_sql
from streaming.routing.route import route_all_sql
from streaming.routing.sql import run_sql
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

T0 = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
US0 = int(T0.timestamp() * 1_000_000)


def ts(offset: int) -> datetime:
    return T0 + timedelta(milliseconds=offset)


def at(offset: int) -> int:
    """accepted_at (microseconds) of the event at ``offset``."""
    return US0 + offset * 1000


def seq(offset: int, partition: int = 0) -> tuple:
    return (ts(offset), partition, offset)


def make_seq(offset: int):
    """A collected ``seq`` value (naive UTC datetime, as Spark returns it)."""
    from pyspark.sql import Row

    return Row(timestamp=ts(offset).replace(tzinfo=None), partition=0, offset=offset)


def event(kind: str, offset: int, *, smuid=None, topic=None, account=None, guid="g", pattern=None,
          cmuid=None, priority=None, headers=None, sections=None, since=None, until=None,
          accepted=None, expires_at=None, tick_at=None, receipt=None, max_retries=None, reason=None,
          delivery=None, depth=None, hops=None, origin=None, origin_topic=None) -> tuple:
    """One EVENTS row (field order of routing.EVENTS); accepted at ``accepted`` (an offset), else ``offset``."""
    return (kind, smuid, topic, cmuid, account, guid, pattern, at(offset if accepted is None else accepted),
            priority, headers, sections, since, until, expires_at, tick_at, receipt, max_retries, reason,
            delivery, depth, hops, origin, origin_topic, seq(offset), 0, offset)


def publish(offset, smuid, topic, account="pub", **kw):
    return event("publish", offset, smuid=smuid, topic=topic, account=account, cmuid=f"c{smuid}",
                 priority=kw.pop("priority", 0), headers=kw.pop("headers", []),
                 sections=kw.pop("sections", []), **kw)


def subscribe(offset, account, pattern, guid="g", since=None, until=None):
    """SUBSCRIBE; ``since`` / ``until`` are offsets like ``offset`` (None: no bound)."""
    return event("subscribe", offset, account=account, pattern=pattern, guid=guid,
                 since=None if since is None else at(since), until=None if until is None else at(until))


def unsubscribe(offset, account, pattern, guid="g"):
    return event("unsubscribe", offset, account=account, pattern=pattern, guid=guid)


def ack(offset, account, smuid, guid="g"):
    return event("ack", offset, account=account, smuid=smuid, guid=guid)


def nack(offset, account, smuid, max_retries=3, guid="g", reason="timeout"):
    return event("nack", offset, account=account, smuid=smuid, guid=guid, max_retries=max_retries, reason=reason)


def sub_row(account, pattern, guid="g0", active=True, batch_id=0, since=None, until=None):
    """A stored subscription (``since`` / ``until`` are offsets, None: no bound)."""
    return stored_sub(account, pattern, guid, active, T0 - timedelta(days=1), None, batch_id,
                 since=None if since is None else ts(since), until=None if until is None else ts(until))


def stored_sub(account, pattern, guid, active, subscribed_at, unsubscribed_at, batch_id, since=None, until=None):
    """One SUBSCRIPTIONS_TABLE row."""
    return (account, pattern, guid, active, subscribed_at, unsubscribed_at, since, until, batch_id)


def delivery(account, smuid, topic, offset, publisher="pub", priority=0, accepted=None, expires_at=None,
             headers=()):
    return (account, smuid, topic, f"c{smuid}", publisher, "g", at(offset if accepted is None else accepted),
            priority, [list(h) for h in headers], [], seq(offset), expires_at)


@pytest.fixture
def frames(spark):
    """Builders for the frames under test."""

    class Frames:
        @staticmethod
        def events(*rows):
            # rows written before expires_at / at, and receipt / max_retries / reason, and the federation
            # fields (depth, hops, origin, origin_topic) existed: null
            rows = [r[:13] + (None, None) + r[13:] if len(r) == len(EVENTS) - 10 else r for r in rows]
            rows = [r[:15] + (None, None, None, None) + r[15:] if len(r) == len(EVENTS) - 8 else r for r in rows]
            rows = [r[:19] + (None, None, None, None) + r[19:] if len(r) == len(EVENTS) - 4 else r for r in rows]
            return spark.createDataFrame(rows, EVENTS)

        @staticmethod
        def subs(*rows):
            return spark.createDataFrame(list(rows), SUBSCRIPTIONS_TABLE)

        @staticmethod
        def deliveries(*rows):
            # rows written before expires_at existed: a state message; before receipts: none asked; before
            # federation: a local message
            rows = [r + (None,) if len(r) == len(DELIVERIES) - 7 else r for r in rows]
            rows = [r + ("none", "all") if len(r) == len(DELIVERIES) - 6 else r for r in rows]
            rows = [r + (0, [], None, None) if len(r) == len(DELIVERIES) - 4 else r for r in rows]
            return spark.createDataFrame(rows, DELIVERIES)

        @staticmethod
        def of(schema, *rows):
            if schema is MESSAGES_TABLE:  # rows as written before federation: its columns null
                rows = [r + (None,) * (len(schema) - len(r)) for r in rows]
            return spark.createDataFrame(list(rows), schema)

    return Frames


def no_retries(frames):
    """An empty :data:`routing.RETRIED` frame: a batch without NACKs."""
    return frames.of(routing.RETRIED)


def dead(frames, expiring, retried=None):
    """What :func:`routing.dead_messages` sends to the Trash for ``expiring`` (and ``retried``)."""
    return routing.dead_messages(expiring, no_retries(frames) if retried is None else retried)


def routed(frames, current, *events):
    evts = frames.events(*events)
    return routing.route(evts, routing.subscription_intervals(frames.subs(*current), evts))


# -- parse_commands


def test_parse_commands_reads_every_command_type_and_drops_bad_records(spark, frames):
    section = ev.Section([("Content-Type", "text/plain")], b"\x00hello")
    records = [
        ev.Publish(7, "/stocks/quotes/ibm", "c1", "alice", "ga", at(0), 3, [("Subject", "IBM")], [section]),
        ev.Subscribe("bob", "gb", "/stocks/*", at(1)),
        ev.Unsubscribe("bob", "gb", "/stocks/*", at(2)),
        ev.Ack("bob", "gb", 7, at(3)),
    ]
    raw = [(None, r.to_bytes(), "cmd", 0, i, ts(i), 0) for i, r in enumerate(records)]
    raw += [
        (None, b"not json", "cmd", 0, 4, ts(4), 0),
        (None, b'{"type":"explode","account":"x"}', "cmd", 0, 5, ts(5), 0),
        (None, b'{"type":"publish","account":"x"}', "cmd", 0, 6, ts(6), 0),  # no smuid/topic
    ]
    actual = routing.parse_commands(frames.of(KAFKA_RECORD, *raw))
    expected = frames.events(
        ("publish", 7, "/stocks/quotes/ibm", "c1", "alice", "ga", None, at(0), 3, [["Subject", "IBM"]],
         [([["Content-Type", "text/plain"]], "AGhlbGxv")], None, None, None, None, "none", None, None, "all",
         0, [], None, None, seq(0), 0, 0),
        ("subscribe", None, None, None, "bob", "gb", "/stocks/*", at(1), None, None, None, None, None,
         seq(1), 0, 1),
        ("unsubscribe", None, None, None, "bob", "gb", "/stocks/*", at(2), None, None, None, None, None,
         seq(2), 0, 2),
        ("ack", 7, None, None, "bob", "gb", None, at(3), None, None, None, None, None, seq(3), 0, 3),
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


#: Values for control events' fields that make them look like what the job does route.
_LOOKALIKE = {"account": "bob", "pattern": "/t/*", "topic": "/t/x", "new_topic": "/t/y", "kind": "topic",
              "keywords": ["k"], "timeout": "60", "attribute": "email", "value": "b@example.com"}


def control_event(cls, offset: int):
    """An instance of the control event type ``cls``, every required field filled in."""
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in _LOOKALIKE:
            values[f.name] = _LOOKALIKE[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = at(offset) if f.type == "int" else f"r{offset}"
    return cls(**values)


def test_control_events_the_job_does_not_route_change_nothing(frames):
    """The registry's events (topic admin, watches, sync, …) share the commands topic: a batch
    holding them parses, and so routes, exactly as the same batch without them."""
    publish_json = json.loads(ev.Publish(1, "/t/x", "c1", "alice", "ga", at(2)).to_bytes())
    publish_json["x_future"] = "ALL"  # a field this job does not know yet is ignored too
    commands = [ev.Subscribe("bob", "gb", "/t/*", at(0)).to_bytes(), json.dumps(publish_json).encode(),
                ev.Ack("bob", "gb", 1, at(4)).to_bytes(),
                ev.Publish(2, "/accounts/bob", "c2", "alice", "ga", at(6)).to_bytes(),
                ev.Unsubscribe("bob", "gb", "/t/*", at(8)).to_bytes(),
                ev.Publish(3, "/t/x", "c3", "alice", "ga", at(10)).to_bytes()]
    controls = sorted(ev.CONTROL_TYPES - {ev.Subscribe, ev.Unsubscribe}, key=lambda cls: cls.TYPE)
    assert {"create_topic", "watch", "sync"} <= {cls.TYPE for cls in controls}
    base = [(None, value, "cmd", 0, 2 * i, ts(2 * i), 0) for i, value in enumerate(commands)]
    mixed = base + [(None, control_event(cls, 2 * i + 1).to_bytes(), "cmd", 0, 2 * i + 1, ts(2 * i + 1), 0)
                    for i, cls in enumerate(controls)]

    without = routing.parse_commands(frames.of(KAFKA_RECORD, *base))
    with_controls = routing.parse_commands(frames.of(KAFKA_RECORD, *mixed))
    assert_df_equality(with_controls, without, ignore_row_order=True, ignore_nullable=True)
    deliveries = routing.route(with_controls, routing.subscription_intervals(frames.subs(), with_controls))
    expected = frames.deliveries(("bob", 1, "/t/x", "c1", "alice", "ga", at(2), 0, [], [], seq(2)),
                                 ("bob", 2, "/accounts/bob", "c2", "alice", "ga", at(6), 0, [], [], seq(6)))
    assert_df_equality(deliveries, expected, ignore_row_order=True, ignore_nullable=True)


# -- matching


@pytest.mark.parametrize("topic", ["/a", "/a/b", "/a/b/c", "/ab/x", "/stocks/quotes/ibm"])
def test_candidate_patterns_agree_with_topic_pattern(spark, topic):
    patterns = ["/a", "/a/*", "/a/b", "/a/b/*", "/a/b/c", "/a/b/c/*", "/ab/*", "/stocks/*",
                "/stocks/quotes/*", "/stocks/quotes/ibm", "/stocks"]
    got = spark.createDataFrame([(topic,)], "topic string").select(
        routing.candidate_patterns("topic").alias("c")).first()["c"]
    assert sorted(p for p in patterns if p in got) == sorted(
        p for p in patterns if parse_pattern(p).matches(topic))


def test_exact_and_wildcard_routing(frames):
    actual = routed(
        frames,
        [sub_row("bob", "/stocks/*"), sub_row("alice", "/stocks/quotes/ibm"),
         sub_row("carol", "/stocks/quotes"), sub_row("dave", "/stocks/quotes/ibm/*"),
         sub_row("erin", "/stocks/*", active=False)],
        publish(1, 100, "/stocks/quotes/ibm"),
        publish(2, 101, "/stocks/quotes"),
    )
    expected = frames.deliveries(
        delivery("bob", 100, "/stocks/quotes/ibm", 1),
        delivery("alice", 100, "/stocks/quotes/ibm", 1),
        delivery("bob", 101, "/stocks/quotes", 2),
        delivery("carol", 101, "/stocks/quotes", 2),
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_wildcard_a_does_not_match_ab(frames):
    actual = routed(frames, [sub_row("bob", "/a/*")],
                    publish(1, 1, "/ab/x"), publish(2, 2, "/a/x"), publish(3, 3, "/a"))
    assert_df_equality(actual, frames.deliveries(delivery("bob", 2, "/a/x", 2)), ignore_row_order=True, ignore_nullable=True)


def test_publish_carries_its_fields_into_the_delivery(frames):
    sections = [([["Content-Type", "text/plain"]], "aGk=")]
    actual = routed(frames, [sub_row("bob", "/t")],
                    publish(1, 5, "/t", account="alice", priority=7, headers=[["A", "1"]], sections=sections))
    expected = frames.deliveries(
        ("bob", 5, "/t", "c5", "alice", "g", at(1), 7, [["A", "1"]], sections, seq(1)))
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


# -- ordering within a batch


def test_subscribe_after_publish_in_same_batch_does_not_see_it(frames):
    actual = routed(frames, [],
                    publish(1, 1, "/news/x"), subscribe(2, "bob", "/news/*"), publish(3, 2, "/news/y"))
    assert_df_equality(actual, frames.deliveries(delivery("bob", 2, "/news/y", 3)), ignore_row_order=True, ignore_nullable=True)


def test_unsubscribe_before_publish_in_same_batch(frames):
    actual = routed(frames, [sub_row("bob", "/news/*")],
                    publish(1, 1, "/news/x"), unsubscribe(2, "bob", "/news/*"), publish(3, 2, "/news/y"))
    assert_df_equality(actual, frames.deliveries(delivery("bob", 1, "/news/x", 1)), ignore_row_order=True, ignore_nullable=True)


def test_resubscribe_after_unsubscribe_opens_a_new_interval(frames):
    evts = frames.events(
        unsubscribe(1, "bob", "/n/*"), publish(2, 1, "/n/x"), subscribe(3, "bob", "/n/*", guid="g2"),
        publish(4, 2, "/n/x"), subscribe(5, "bob", "/n/*", guid="g3"),  # already subscribed: same subscription
    )
    intervals = routing.subscription_intervals(frames.subs(sub_row("bob", "/n/*")), evts)
    expected = frames.of(
        INTERVALS,
        ("bob", "/n/*", "g0", T0 - timedelta(days=1), None, seq(1), ts(1), None, None),
        ("bob", "/n/*", "g2", ts(3), seq(3), seq(5), None, None, None),
        ("bob", "/n/*", "g2", ts(3), seq(5), None, None, None, None),  # re-subscribe: same subscription
    )
    assert_df_equality(intervals, expected, ignore_row_order=True, ignore_nullable=True)
    assert_df_equality(routing.route(evts, intervals), frames.deliveries(delivery("bob", 2, "/n/x", 4)),
                       ignore_row_order=True, ignore_nullable=True)
    state = routing.subscription_state(intervals, batch_id=9)
    assert_df_equality(state, frames.of(SUBSCRIPTIONS_TABLE, stored_sub("bob", "/n/*", "g2", True, ts(3), None, 9)),
                       ignore_row_order=True, ignore_nullable=True)


def test_overlapping_patterns_deliver_once(frames):
    actual = routed(
        frames,
        [sub_row("bob", "/stocks/*"), sub_row("bob", "/stocks/quotes/*")],
        subscribe(1, "bob", "/stocks/quotes/ibm"),
        publish(2, 1, "/stocks/quotes/ibm"),
    )
    assert_df_equality(actual, frames.deliveries(delivery("bob", 1, "/stocks/quotes/ibm", 2)),
                       ignore_row_order=True, ignore_nullable=True)


def test_duplicate_publish_in_batch_counts_once(frames):
    actual = routed(frames, [sub_row("bob", "/t")], publish(1, 1, "/t"), publish(2, 1, "/t"))
    assert_df_equality(actual, frames.deliveries(delivery("bob", 1, "/t", 1)), ignore_row_order=True, ignore_nullable=True)


def test_unsubscribe_wildcard_ends_narrower_subscriptions(frames):
    current = [sub_row("bob", "/a/x"), sub_row("bob", "/a/x/*"), sub_row("bob", "/a/*"),
               sub_row("bob", "/ab/y"), sub_row("alice", "/a/x")]
    evts = frames.events(unsubscribe(1, "bob", "/a/*"), publish(2, 1, "/a/x"), publish(3, 2, "/ab/y"))
    intervals = routing.subscription_intervals(frames.subs(*current), evts)
    assert_df_equality(
        routing.route(evts, intervals),
        frames.deliveries(delivery("alice", 1, "/a/x", 2), delivery("bob", 2, "/ab/y", 3)),
        ignore_row_order=True, ignore_nullable=True,
    )
    ended = T0 - timedelta(days=1)
    assert_df_equality(
        routing.subscription_state(intervals, batch_id=4),
        frames.of(SUBSCRIPTIONS_TABLE,
                  stored_sub("bob", "/a/x", "g0", False, ended, ts(1), 4),
                  stored_sub("bob", "/a/x/*", "g0", False, ended, ts(1), 4),
                  stored_sub("bob", "/a/*", "g0", False, ended, ts(1), 4)),
        ignore_row_order=True, ignore_nullable=True,
    )


def test_exact_unsubscribe_does_not_end_wildcard(frames):
    evts = frames.events(unsubscribe(1, "bob", "/a/x"), publish(2, 1, "/a/x"))
    actual = routing.route(evts, routing.subscription_intervals(frames.subs(sub_row("bob", "/a/x/*"),
                                                                            sub_row("bob", "/a/*")), evts))
    assert_df_equality(actual, frames.deliveries(delivery("bob", 1, "/a/x", 2)), ignore_row_order=True, ignore_nullable=True)


def test_subscription_state_of_new_subscription(frames):
    evts = frames.events(subscribe(1, "bob", "/x", guid="gb"), subscribe(2, "eve", "/y"),
                         unsubscribe(3, "eve", "/y"))
    state = routing.subscription_state(routing.subscription_intervals(frames.subs(), evts), batch_id=1)
    assert_df_equality(state, frames.of(SUBSCRIPTIONS_TABLE,
                                        stored_sub("bob", "/x", "gb", True, ts(1), None, 1),
                                        stored_sub("eve", "/y", "g", False, ts(2), ts(3), 1)),
                       ignore_row_order=True, ignore_nullable=True)


# -- SINCE / UNTIL (spec 4.1.9.1)


def test_since_delivers_only_messages_accepted_at_or_after_it(frames):
    actual = routed(
        frames,
        [sub_row("bob", "/t", since=5)],
        subscribe(1, "carol", "/t", since=7),  # SINCE in the future: wait until then
        publish(3, 1, "/t"), publish(5, 2, "/t"), publish(7, 3, "/t"), publish(9, 4, "/t"),
    )
    expected = frames.deliveries(
        delivery("bob", 2, "/t", 5), delivery("bob", 3, "/t", 7), delivery("bob", 4, "/t", 9),
        delivery("carol", 3, "/t", 7), delivery("carol", 4, "/t", 9),
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_until_delivers_only_messages_accepted_before_it(frames):
    actual = routed(
        frames,
        [sub_row("bob", "/t/*", until=5)],
        subscribe(1, "carol", "/t/x", since=2, until=7),
        publish(3, 1, "/t/x"), publish(5, 2, "/t/x"), publish(7, 3, "/t/x"),
        publish(9, 4, "/t/x", accepted=4),  # logged late, but accepted before bob's UNTIL
    )
    expected = frames.deliveries(
        delivery("bob", 1, "/t/x", 3), delivery("bob", 4, "/t/x", 9, accepted=4),
        delivery("carol", 1, "/t/x", 3), delivery("carol", 2, "/t/x", 5), delivery("carol", 4, "/t/x", 9, accepted=4),
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_resubscribe_redefines_since_and_until_for_later_messages(frames):
    current = frames.subs(sub_row("bob", "/t", until=4), sub_row("alice", "/t", until=4))
    evts = frames.events(
        publish(1, 1, "/t"),
        publish(5, 2, "/t"),  # after UNTIL
        subscribe(6, "bob", "/t", guid="g6"),  # UNTIL un-defined
        publish(7, 3, "/t"),
        subscribe(8, "bob", "/t", guid="g8", since=10),  # SINCE defined
        publish(9, 4, "/t"),  # before SINCE
        publish(10, 5, "/t"),
    )
    intervals = routing.subscription_intervals(current, evts)
    day_before = T0 - timedelta(days=1)
    assert_df_equality(
        intervals,
        frames.of(INTERVALS,
                  ("alice", "/t", "g0", day_before, None, None, None, None, ts(4)),
                  ("bob", "/t", "g0", day_before, None, seq(6), None, None, ts(4)),
                  ("bob", "/t", "g0", day_before, seq(6), seq(8), None, None, None),
                  ("bob", "/t", "g0", day_before, seq(8), None, None, ts(10), None)),
        ignore_row_order=True, ignore_nullable=True,
    )
    assert_df_equality(
        routing.route(evts, intervals),
        frames.deliveries(delivery("alice", 1, "/t", 1), delivery("bob", 1, "/t", 1),
                          delivery("bob", 3, "/t", 7), delivery("bob", 5, "/t", 10)),
        ignore_row_order=True, ignore_nullable=True,
    )
    stored = routing.subscription_state(intervals, batch_id=2)
    assert_df_equality(stored, frames.of(SUBSCRIPTIONS_TABLE,
                                         stored_sub("bob", "/t", "g0", True, day_before, None, 2, since=ts(10))),
                       ignore_row_order=True, ignore_nullable=True)

    # the next batch reads the stored row back: the redefined SINCE still holds
    later = frames.events(publish(20, 6, "/t", accepted=9), publish(21, 7, "/t"))
    assert_df_equality(routing.route(later, routing.subscription_intervals(stored, later)),
                       frames.deliveries(delivery("bob", 7, "/t", 21)),
                       ignore_row_order=True, ignore_nullable=True)


# -- account topics


def test_account_topic_reaches_its_owner_without_a_subscription(frames):
    actual = routed(
        frames,
        [sub_row("dave", "/accounts/bob")],  # others get it only by subscribing
        publish(1, 1, "/accounts/bob", account="alice"),
        publish(2, 2, "/accounts/carol"),
        publish(3, 3, "/accounts/bob/x"),  # not an account topic: nobody owns it
    )
    expected = frames.deliveries(
        delivery("bob", 1, "/accounts/bob", 1, publisher="alice"),
        delivery("dave", 1, "/accounts/bob", 1, publisher="alice"),
        delivery("carol", 2, "/accounts/carol", 2),
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_account_topic_owner_who_also_subscribed_gets_it_once(frames):
    actual = routed(frames, [sub_row("bob", "/accounts/bob")],
                    subscribe(1, "bob", "/accounts/bob", guid="g1"), publish(2, 1, "/accounts/bob"),
                    subscribe(3, "carol", "/accounts/carol", since=9), publish(4, 2, "/accounts/carol"))
    expected = frames.deliveries(delivery("bob", 1, "/accounts/bob", 2),
                                 delivery("carol", 2, "/accounts/carol", 4))  # SINCE bounds subscriptions only
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


# -- acks and Delta rows


def test_extract_acks_keeps_first_per_account_and_smuid(frames):
    evts = frames.events(ack(1, "bob", 10, guid="g1"), ack(2, "bob", 10, guid="g2"),
                         ack(3, "alice", 10), publish(4, 11, "/t"), subscribe(5, "bob", "/t"))
    expected = frames.of(ACKS, ("bob", 10, ts(1), "g1", seq(1)), ("alice", 10, ts(3), "g", seq(3)))
    assert_df_equality(routing.extract_acks(evts), expected, ignore_row_order=True, ignore_nullable=True)


def test_delivery_updates_marks_same_batch_acks_and_keeps_others_for_update(frames):
    routed_at = T0 + timedelta(hours=1)
    deliveries = frames.deliveries(delivery("bob", 1, "/t", 1, priority=2), delivery("bob", 2, "/t", 2))
    acks = frames.of(ACKS, ("bob", 1, ts(3), "ga", seq(3)), ("bob", 99, ts(4), "gb", seq(4)))
    schema = StructType(list(DELIVERIES_TABLE.fields) + [StructField("is_new", BooleanType(), False)])
    expected = frames.of(
        schema,
        ("bob", 1, "/t", 2, "acked", routed_at, 5, ts(3), "ga", None, None, "none", "all", True),
        ("bob", 2, "/t", 0, "pending", routed_at, 5, None, None, None, None, "none", "all", True),
        ("bob", 99, None, None, "acked", None, None, ts(4), "gb", None, None, None, None, False),
    )
    actual = routing.delivery_updates(deliveries, acks, 5, routed_at)
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_message_rows(frames):
    evts = frames.events(publish(1, 1, "/t", account="alice", headers=[["A", "b"]]), subscribe(2, "b", "/t"))
    # a publish record older than federation (no depth, no hops) is stored as a local one
    expected = frames.of(MESSAGES_TABLE, (1, "/t", "c1", "alice", "g", 0, [["A", "b"]], [], ts(1), 0, 1, 3, None,
                                          "none", "all", 0, [], None, None))
    assert_df_equality(routing.message_rows(evts, 3), expected, ignore_row_order=True, ignore_nullable=True)


# -- records for smqp.deliveries


def test_deliver_records_decode_to_equal_deliver_events(frames):
    sections = [([["Content-Type", "text/plain"]], "AGhp")]
    deliveries = frames.deliveries(
        ("bob", 5, "/t", "c5", "alice", "ga", at(1), 7, [["A", "1"], ["B", "2"]], sections, seq(1)),
        ("carol", 6, "/t", "c6", "alice", "ga", at(2), None, None, None, seq(2)),
    )
    records = routing.deliver_records(deliveries)
    assert records.schema == KAFKA_OUT
    rows = sorted(records.collect(), key=lambda r: r["seq"])
    assert [(r["key"], r["seq"]) for r in rows] == [(b"bob", make_seq(1)), (b"carol", make_seq(2))]
    assert [ev.decode(r["value"]) for r in rows] == [
        ev.Deliver("bob", 5, "/t", "c5", "alice", "ga", at(1), 7, [("A", "1"), ("B", "2")],
                   [ev.Section([("Content-Type", "text/plain")], b"\x00hi")]),
        ev.Deliver("carol", 6, "/t", "c6", "alice", "ga", at(2)),
    ]


def test_deliver_records_carry_the_message_expiry_for_the_gateways(frames):
    """Issue 32 item 7: a gateway holding a delivery never NOTIFYs it once its message expired,
    so the job's ``Deliver`` tells it when (a state message: none)."""
    deliveries = frames.deliveries(
        ("bob", 5, "/t", "c5", "alice", "ga", at(1), 0, [], [], seq(1), at(9)),
        ("carol", 6, "/t", "c6", "alice", "ga", at(2), 0, [], [], seq(2), None),
    )
    rows = sorted(routing.deliver_records(deliveries).collect(), key=lambda r: r["seq"])
    assert [ev.decode(r["value"]).expires_at for r in rows] == [at(9), None]


def test_acked_records(frames):
    rows = routing.acked_records(frames.of(ACKS, ("bob", 10, ts(1), "g1", seq(1)))).collect()
    assert [(r["key"], ev.decode(r["value"])) for r in rows] == [(b"bob", ev.Acked("bob", 10))]
    assert routing.acked_records(frames.of(ACKS)).schema == KAFKA_OUT


def test_a_non_guaranteed_delivery_is_settled_when_sent(frames):
    """GUARANTEE NO (2002 revision): no ACK will come, so the delivery is ``sent`` and the
    gateways are told to forget it right away; guaranteed ones wait for their ACK."""
    routed_at = T0 + timedelta(hours=1)
    deliveries = frames.deliveries(
        ("bob", 1, "/t", "c1", "alice", "ga", at(1), 0, [["Guar", "no"]], [], seq(1)),
        ("bob", 2, "/t", "c2", "alice", "ga", at(2), 0, [["Guarantee", "YES"]], [], seq(2)),
        ("bob", 3, "/t", "c3", "alice", "ga", at(3), 0, None, None, seq(3)),
    )
    acks = frames.of(ACKS, ("bob", 2, ts(4), "gb", seq(4)))
    statuses = {r.smuid: r.status for r in routing.delivery_updates(deliveries, acks, 5, routed_at).collect()}
    assert statuses == {1: "sent", 2: "acked", 3: "pending"}
    assert sorted(r.smuid for r in routing.settled(acks, deliveries).collect()) == [1, 2]


# -- expiry and Trash

NOW = at(10)  # the batch's clock (its last tick)


def pending_rows(frames, *rows):
    """Stored deliveries (routing.PENDING): (account, smuid, status, expires_at µs)."""
    return frames.of(routing.PENDING, *[(a, s, st, None if e is None else T0 + timedelta(microseconds=e - US0))
                                        for a, s, st, e in rows])


def expiry(frames, deliveries, events, acks=(), pending=(), now=NOW):
    """(expiring, unrouted) of a batch."""
    routed = frames.deliveries(*deliveries)
    unrouted = routing.unrouted(frames.events(*events), routed)
    acks = frames.of(ACKS, *acks)
    return routing.expiring(routed, unrouted, acks, pending_rows(frames, *pending), now), unrouted


def test_expiry_boundary_of_new_deliveries_expires_at_now_but_not_one_microsecond_later(frames):
    expiring, _ = expiry(frames, [delivery("bob", 1, "/t", 1, expires_at=NOW),
                                  delivery("bob", 2, "/t", 2, expires_at=NOW + 1),
                                  delivery("bob", 3, "/t", 3),  # state message
                                  delivery("bob", 4, "/t", 4, expires_at=NOW - 5),
                                  delivery("bob", 5, "/t", 5, expires_at=NOW - 5, headers=[("Guar", "NO")])],
                         [publish(i, i, "/t", expires_at=NOW) for i in (1, 2, 3, 4, 5)])
    assert_df_equality(expiring, frames.of(routing.EXPIRING, ("bob", 1, True), ("bob", 4, True)),
                       ignore_row_order=True, ignore_nullable=True)


def test_expiry_boundary_of_stored_deliveries(frames):
    expiring, _ = expiry(frames, [], [], pending=[
        ("bob", 1, "pending", NOW), ("bob", 2, "pending", NOW + 1), ("bob", 3, "pending", None),
        ("carol", 1, "pending", NOW), ("", 7, "unrouted", NOW - 1), ("", 8, "unrouted", NOW + 1),
        ("bob", 9, "acked", NOW - 1), ("bob", 10, "expired", NOW - 1)])
    assert_df_equality(expiring, frames.of(routing.EXPIRING, ("bob", 1, False), ("carol", 1, False),
                                           ("", 7, False)),
                       ignore_row_order=True, ignore_nullable=True)


def test_expiry_without_a_clock_expires_nothing(frames):
    expiring, _ = expiry(frames, [delivery("bob", 1, "/t", 1, expires_at=at(0))],
                         [publish(1, 1, "/t", expires_at=at(0)), publish(2, 2, "/u", expires_at=at(0))],
                         pending=[("bob", 9, "pending", at(0))], now=None)
    assert expiring.count() == 0


def test_an_ack_in_the_batch_wins_over_expiry_and_acked_messages_are_never_trashed(frames):
    acks = [("bob", 1, ts(9), "gb", seq(9)), ("bob", 5, ts(9), "gb", seq(9))]
    expiring, unrouted = expiry(frames, [delivery("bob", 1, "/t", 1, expires_at=NOW)],
                                [publish(1, 1, "/t", expires_at=NOW)], acks=acks,
                                pending=[("bob", 5, "pending", NOW - 1), ("bob", 6, "acked", NOW - 1)])
    assert expiring.count() == 0
    messages = routing.message_rows(frames.events(publish(1, 1, "/t", expires_at=NOW)), 3)
    assert routing.trash(dead(frames, expiring), messages, NOW, 3).count() == 0


def test_a_message_with_no_subscriber_is_kept_unrouted_then_trashed_at_expiry(frames):
    publishes = [publish(1, 1, "/t", account="alice", expires_at=NOW + 1),  # later
                 publish(2, 2, "/u", account="alice", expires_at=NOW),  # expires now
                 publish(3, 3, "/u", account="alice"),  # state message: never
                 publish(4, 4, "/v", account="alice", expires_at=NOW)]  # routed: not unrouted
    routed_at = T0 + timedelta(hours=1)
    routed = [delivery("bob", 4, "/v", 4, expires_at=NOW + 100)]
    expiring, unrouted = expiry(frames, routed, publishes)
    assert_df_equality(expiring, frames.of(routing.EXPIRING, ("", 2, True)), ignore_nullable=True)
    updates = routing.delivery_updates(frames.deliveries(*routed), frames.of(ACKS), 5, routed_at, NOW,
                                       unrouted, expiring)
    assert sorted((r.account, r.smuid, r.status, r.is_new) for r in updates.collect()) == [
        ("", 1, "unrouted", True), ("", 2, "expired", True), ("bob", 4, "pending", True)]

    messages = routing.message_rows(frames.events(*publishes), 5)
    expected = frames.of(schemas_spark.TRASH_TABLE,
                         (2, "/u", "/u/Trash", "undeliverable", ts(10), "alice", "c2", [], [], 5, "",
                          "g", 0, ts(2), 0, [], None, None))  # and what it copies from its message
    assert_df_equality(routing.trash(dead(frames, expiring), messages, NOW, 5), expected, ignore_nullable=True)

    # a later batch: its clock passes the first message's expiry, read back from the stored rows
    later, _ = expiry(frames, [], [], pending=[("", 1, "unrouted", NOW + 1)], now=NOW + 1)
    assert_df_equality(later, frames.of(routing.EXPIRING, ("", 1, False)), ignore_nullable=True)
    assert routing.expired_records(later, no_retries(frames)).count() == 0  # nobody to tell


def test_stored_deliveries_that_expire_are_updated_announced_and_trashed_once(frames):
    routed_at = T0 + timedelta(hours=1)
    expiring, unrouted = expiry(frames, [], [], pending=[("bob", 1, "pending", NOW), ("carol", 1, "pending", NOW)])
    updates = routing.delivery_updates(frames.deliveries(), frames.of(ACKS), 6, routed_at, NOW, unrouted, expiring)
    assert sorted((r.account, r.smuid, r.status, r.is_new) for r in updates.collect()) == [
        ("bob", 1, "expired", False), ("carol", 1, "expired", False)]
    records = routing.expired_records(expiring, no_retries(frames)).collect()
    assert records and all(r.seq is None for r in records)
    assert sorted((r.key, ev.decode(r.value)) for r in records) == [
        (b"bob", ev.Acked("bob", 1, "expired")), (b"carol", ev.Acked("carol", 1, "expired"))]
    stored = frames.of(MESSAGES_TABLE, (1, "/t", "c1", "alice", "g", 0, [], [], ts(1), 0, 1, 2, ts(10), "none", "all"))
    trashed = routing.trash(dead(frames, expiring), stored, NOW, 6).collect()
    assert [(r.smuid, r.account, r.trash_topic, r.reason, r.trashed_at, r.batch_id) for r in trashed] == [
        (1, "", "/t/Trash", "expired", ts(10).replace(tzinfo=None), 6)]


def test_live_deliveries_leave_out_the_already_expired(frames):
    routed = frames.deliveries(delivery("bob", 1, "/t", 1, expires_at=NOW), delivery("bob", 2, "/t", 2))
    expiring = frames.of(routing.EXPIRING, ("bob", 1, True), ("bob", 2, False))
    assert [r.smuid for r in routing.live(routed, expiring).collect()] == [2]


def test_deliveries_acknowledged_in_their_own_batch_need_no_deliver_record(frames):
    # bob acknowledged message 1 (a gateway routed it early); carol's ACK of 1 and bob's of 3 settle nothing here
    live = frames.deliveries(delivery("bob", 1, "/t", 1), delivery("bob", 2, "/t", 2), delivery("carol", 2, "/t", 2))
    acks = frames.of(ACKS, ("bob", 1, ts(3), "g", seq(3)), ("carol", 1, ts(4), "g", seq(4)),
                     ("bob", 3, ts(5), "g", seq(5)))
    expected = frames.deliveries(delivery("bob", 2, "/t", 2), delivery("carol", 2, "/t", 2))
    assert_df_equality(routing.unacknowledged(live, acks), expected, ignore_row_order=True, ignore_nullable=True)


# -- retries


def test_nacks_count_retries_until_max_retries_sends_the_delivery_to_the_trash(frames):
    """A NOTIFY unacknowledged within the retry timeout is NACKed by the gateway; the count lives in
    the stored delivery, and the NACK that passes the topic's max_retries (3: the first NOTIFY and
    three more went unacknowledged) kills it."""
    events = frames.events(nack(5, "bob", 1), nack(6, "bob", 1), nack(7, "carol", 1), nack(8, "dave", 1),
                           nack(9, "erin", 1), nack(10, "frank", 1), ack(11, "frank", 1))
    retrying = frames.of(routing.RETRYING, ("bob", 1, "pending", 2, "all"), ("carol", 1, "pending", None, "all"),
                         ("dave", 1, "acked", 2, "all"), ("frank", 1, "pending", 0, "all"))  # erin: never routed
    acks = routing.extract_acks(events)
    retried = routing.retried(events, retrying, acks, frames.of(routing.EXPIRING))
    expected = frames.of(routing.RETRIED, ("bob", 1, 4, True, seq(6)), ("carol", 1, 1, False, seq(7)))
    assert_df_equality(retried, expected, ignore_row_order=True, ignore_nullable=True)

    updates = routing.delivery_updates(frames.deliveries(), acks, 4, T0, None, retried=retried)
    assert sorted((r.account, r.status, r.retries, r.is_new) for r in updates.collect()) == [
        ("bob", "trashed", 4, False), ("carol", "retry", 1, False), ("frank", "acked", None, False)]
    assert_df_equality(dead(frames, frames.of(routing.EXPIRING), retried),
                       frames.of(routing.DEAD, (1, "bob", "max_retries")), ignore_nullable=True)
    records = routing.expired_records(frames.of(routing.EXPIRING), retried).collect()
    assert [(r.key, ev.decode(r.value), r.seq) for r in records] == [
        (b"bob", ev.Acked("bob", 1, "max_retries"), make_seq(6))]


def test_a_nack_of_a_delivery_that_expires_in_the_same_batch_is_not_counted(frames):
    events = frames.events(nack(5, "bob", 1))
    expiring = frames.of(routing.EXPIRING, ("bob", 1, False))
    retried = routing.retried(events, frames.of(routing.RETRYING, ("bob", 1, "pending", 2, "all")),
                              routing.extract_acks(events), expiring)
    assert retried.count() == 0
    assert [(r.smuid, r.account, r.reason) for r in dead(frames, expiring, retried).collect()] == [(1, "", "expired")]


# -- receipts


def test_receipts_fall_due_at_the_first_ack_for_one_at_the_last_for_all_and_x_of_y_at_expiry(frames):
    state = frames.of(routing.RECEIPT_STATE,
                      ("bob", 1, "pending", "one"), ("carol", 1, "pending", "one"),  # ONE: bob acks now
                      ("bob", 2, "acked", "all"), ("carol", 2, "pending", "all"),  # ALL: carol acks now
                      ("bob", 3, "acked", "all"), ("carol", 3, "pending", "all"),  # ALL: not yet
                      ("bob", 4, "acked", "all"), ("carol", 4, "pending", "all"),  # ALL: expires now, 1/2
                      ("bob", 5, "acked", "one"),  # answered in an earlier batch
                      ("bob", 6, "pending", "none"))  # asked for none
    events = frames.events(ack(1, "bob", 1), ack(2, "carol", 2), ack(3, "bob", 5), ack(4, "bob", 6))
    expiring = frames.of(routing.EXPIRING, ("carol", 4, False))
    receipted = frames.of(StructType([StructField("smuid", LongType())]), (5,))
    due = routing.receipts_due(state, routing.extract_acks(events), expiring, receipted)
    expected = frames.of(routing.RECEIPTS_DUE, (1, "one", 1, 2), (2, "all", 2, 2), (4, "all", 1, 2))
    assert_df_equality(due, expected, ignore_row_order=True, ignore_nullable=True)


def test_a_receipt_is_a_message_to_the_publishers_account_topic_with_x_of_y(frames):
    due = frames.of(routing.RECEIPTS_DUE, (20, "all", 4, 6), (10, "one", 1, 3))
    messages = frames.of(MESSAGES_TABLE, (10, "/t", "c10", "alice", "ga", 0, [], [], ts(1), 0, 1, 2, None, "one", "all"),
                         (20, "/t", "c20", "Bob", "gb", 0, [], [], ts(2), 0, 2, 2, None, "all", "all"))
    rows = routing.receipt_messages(due, messages, NOW).orderBy("receipt_for").collect()
    assert [(r.account, r.topic, r.cmuid, r.receipt_for, r.headers) for r in rows] == [
        ("alice", "/accounts/alice", "c10", 10, [["Receipt", "ONE"], ["Receipt-For", "10"], ["Delivered", "1/3"]]),
        ("bob", "/accounts/bob", "c20", 20, [["Receipt", "ALL"], ["Receipt-For", "20"], ["Delivered", "4/6"]])]
    assert [ev.Section.from_json(r.sections[0].asDict()).data for r in rows] == [b"1/3", b"4/6"]
    # the job's own SMUIDs: node 1023, the batch's clock, one sequence number each, in order
    from schemas.smuid import EPOCH_MS, JOB_NODE_ID, compose
    assert [r.smuid for r in rows] == [compose(NOW // 1000 - EPOCH_MS, JOB_NODE_ID, k) for k in (0, 1)]
    # the same batch replayed makes the same receipts
    assert routing.receipt_messages(due, messages, NOW).orderBy("receipt_for").collect() == rows


# -- DELIVERY ONE


def test_a_delivery_one_message_reaches_exactly_one_subscriber_spread_by_hash(frames):
    subs = [sub_row(name, "/jobs") for name in ("ann", "ben", "cat")]
    events = [publish(i, i, "/jobs", delivery="one") for i in range(1, 61)] + [publish(61, 61, "/jobs")]
    rows = routed(frames, subs, *events).collect()
    one = [r for r in rows if r.smuid <= 60]
    assert sorted(r.smuid for r in one) == list(range(1, 61))  # each exactly once
    share = {name: sum(r.account == name for r in one) for name in ("ann", "ben", "cat")}
    assert min(share.values()) >= 10, share  # spread, not all to one
    assert sorted(r.account for r in rows if r.smuid == 61) == ["ann", "ben", "cat"]  # ALL: everyone
    again = routed(frames, subs, *events).collect()
    assert sorted((r.account, r.smuid) for r in again) == sorted((r.account, r.smuid) for r in rows)


def test_a_nacked_delivery_one_message_goes_to_another_subscriber_never_to_one_that_left(frames):
    events = frames.events(nack(5, "eve", 1, reason="disconnect"), nack(6, "ben", 2), nack(7, "ann", 3),
                           nack(8, "cat", 4))
    current = frames.subs(*(sub_row(name, "/jobs/*") for name in ("ann", "ben", "cat", "eve")), sub_row("dan", "/other"))
    intervals = routing.subscription_intervals(current, events)
    retrying = frames.of(routing.RETRYING,
                         ("eve", 1, "pending", None, "one"),  # eve left: to ann, ben or cat
                         ("ben", 2, "pending", None, "one"), ("cat", 2, "released", None, "one"),  # to one who never had it
                         ("ann", 3, "pending", None, "all"),  # ALL: never released, retried
                         ("cat", 4, "pending", 1, "one"), ("ann", 4, "released", None, "one"),
                         ("ben", 4, "released", None, "one"))  # everyone had it: back to one who did
    messages = frames.of(MESSAGES_TABLE, *((n, "/jobs/x", f"c{n}", "pub", "g", 0, [], [], ts(1), 0, n, 1, None,
                                            "none", "one") for n in (1, 2, 3, 4)))
    acks, expiring = routing.extract_acks(events), frames.of(routing.EXPIRING)
    released = routing.released(events, retrying, acks, expiring, intervals, messages)
    moved = {r.smuid: (r.account, r.to) for r in released.collect()}
    assert moved[1][0] == "eve" and moved[1][1] in ("ann", "ben", "cat")
    assert moved[2] == ("ben", "ann")
    assert 3 not in moved
    assert moved[4][0] == "cat" and moved[4][1] in ("ann", "ben")
    retried = routing.retried(events, retrying, acks, expiring, released)
    assert [(r.account, r.smuid, r.retries) for r in retried.collect()] == [("ann", 3, 1)]  # released ones are not
    new = run_sql(reassigned_sql("{released}", "{messages}"),
                          {"released": released, "messages": messages}).collect()
    assert sorted((r.account, r.smuid, r.delivery) for r in new) == sorted((to, s, "one") for s, (_, to) in moved.items())
    records = [ev.decode(r.value) for r in routing.expired_records(expiring, retried, released).collect()]
    assert sorted((a.account, a.smuid, a.reason) for a in records) == sorted(
        (held, s, "released") for s, (held, _) in moved.items())


# -- late subscribers


def stored_message(smuid, topic, accepted, expires_at=None, delivery="all", headers=()):
    """A MESSAGES_TABLE row accepted at offset ``accepted``; ``expires_at`` in µs (None: a state message)."""
    expires = None if expires_at is None else T0 + timedelta(microseconds=expires_at - US0)
    return (smuid, topic, f"c{smuid}", "pub", "g", 0, [list(h) for h in headers], [], ts(accepted), 0, smuid, 1,
            expires, "none", delivery)


def late_for(frames, current, events, stored=(), held=(), now=NOW):
    """:func:`routing.late` of a batch: (account, smuid) pairs, sorted."""
    evts = frames.events(*events)
    intervals = routing.subscription_intervals(frames.subs(*current), evts)
    routed_all = run_sql(route_all_sql("{events}", "{intervals}"),
                                 {"events": evts, "intervals": intervals})
    rows = routing.late(evts, intervals, frames.of(MESSAGES_TABLE, *stored), frames.of(routing.HELD, *held),
                        routed_all, now).collect()
    return rows


def test_a_new_subscriber_gets_the_earlier_messages_that_have_not_expired(frames):
    stored = [stored_message(1, "/news/x", -50, expires_at=NOW + 1),  # lives: delivered
              stored_message(2, "/news/y", -40),  # a state message: kept until removed
              stored_message(3, "/news/x", -30, expires_at=NOW),  # expired now: never
              stored_message(4, "/other", -20, expires_at=NOW + 1),  # another topic
              stored_message(5, "/news/x", -10, expires_at=NOW + 1),  # bob holds it already
              stored_message(6, "/news/x", -5, expires_at=NOW + 1, headers=[("Guarantee", "NO")])]
    events = [publish(1, 7, "/news/x", expires_at=NOW + 1),  # this batch, before the SUBSCRIBE: delivered
              subscribe(2, "bob", "/news/*"),
              publish(3, 8, "/news/x", expires_at=NOW + 1)]  # after it: routed as usual, not late
    rows = late_for(frames, [], events, stored, held=[("bob", 5)])
    assert sorted((r.account, r.smuid) for r in rows) == [("bob", 1), ("bob", 2), ("bob", 6), ("bob", 7)]
    by_smuid = {r.smuid: r for r in rows}
    assert by_smuid[1].seq == make_seq(2) and by_smuid[1].accepted_at == at(-50)  # answers the SUBSCRIBE
    assert by_smuid[1].expires_at == NOW + 1 and by_smuid[2].expires_at is None
    # a GUARANTEE NO message goes as the usual path sends it: settled when sent
    updates = routing.delivery_updates(frames.deliveries(*(tuple(r) for r in rows)), frames.of(ACKS), 5, T0, NOW)
    assert {r.smuid: r.status for r in updates.collect()} == {1: "pending", 2: "pending", 6: "sent", 7: "pending"}


def test_late_delivery_respects_since_until_and_skips_resubscribes_and_unsubscribed(frames):
    stored = [stored_message(1, "/t", -50, expires_at=NOW + 1), stored_message(2, "/t", -5, expires_at=NOW + 1)]
    events = [subscribe(1, "ann", "/t", since=-10),  # SINCE: only message 2
              subscribe(2, "ben", "/t", until=-10),  # UNTIL: only message 1
              subscribe(3, "cat", "/t"),  # re-SUBSCRIBE while subscribed: redefines, nothing again
              subscribe(4, "dan", "/t"), unsubscribe(5, "dan", "/t")]  # gone by the end of the batch
    rows = late_for(frames, [sub_row("cat", "/t")], events, stored)
    assert sorted((r.account, r.smuid) for r in rows) == [("ann", 2), ("ben", 1)]


def test_a_delivery_one_message_nobody_holds_goes_to_one_late_subscriber(frames):
    stored = [stored_message(1, "/jobs", -50, expires_at=NOW + 1, delivery="one")]  # the sink read: nobody holds it
    events = [publish(1, 2, "/jobs", delivery="one", expires_at=NOW + 1),  # reaches nobody in this batch
              subscribe(2, "eve", "/jobs"),
              publish(3, 3, "/jobs", delivery="one", expires_at=NOW + 1),  # reaches eve: nobody else's
              subscribe(4, "ann", "/jobs"), subscribe(5, "ben", "/jobs")]
    takers = {}
    for r in late_for(frames, [], events, stored):
        takers.setdefault(r.smuid, []).append(r.account)
    assert sorted(takers) == [1, 2] and all(len(t) == 1 and t[0] in ("ann", "ben", "eve") for t in takers.values())


def test_a_message_taken_by_a_late_subscriber_is_no_longer_unrouted(frames):
    nobody = frames.of(routing.NOBODY_UPDATES, (1, "routed"))
    updates = routing.delivery_updates(frames.deliveries(), frames.of(ACKS), 5, T0, NOW, nobody=nobody)
    assert [(r.account, r.smuid, r.status, r.is_new) for r in updates.collect()] == [("", 1, "routed", False)]


# -- a new SINCE clears what is pending


def test_a_subscribe_with_since_clears_the_pending_deliveries_accepted_before_it(frames):
    events = frames.events(subscribe(5, "bob", "/news/*", since=-10), ack(6, "bob", 4),
                           subscribe(7, "ann", "/news/x"))  # no SINCE: clears nothing
    intervals = routing.subscription_intervals(frames.subs(sub_row("bob", "/news/*"), sub_row("ann", "/news/x")),
                                               events)
    clearable = frames.of(routing.CLEARABLE,
                          ("bob", 1, "/news/x", ts(-20)),  # before SINCE: cleared
                          ("bob", 2, "/news/x", ts(-10)),  # at SINCE: kept
                          ("bob", 3, "/other", ts(-20)),  # another topic: kept
                          ("bob", 4, "/news/y", ts(-20)),  # acknowledged in this batch: the ACK wins
                          ("bob", 5, "/news/y", ts(-20)),  # expires in this batch: expiry wins
                          ("ann", 6, "/news/x", ts(-20)))
    acks, expiring = routing.extract_acks(events), frames.of(routing.EXPIRING, ("bob", 5, False))
    cleared = routing.cleared(intervals, clearable, acks, expiring, no_retries(frames), frames.of(routing.RELEASED))
    assert_df_equality(cleared, frames.of(routing.CLEARED, ("bob", 1, seq(5))), ignore_nullable=True)
    records = [ev.decode(r.value) for r in routing.expired_records(frames.of(routing.EXPIRING), no_retries(frames),
                                                                   None, cleared).collect()]
    assert records == [ev.Acked("bob", 1, "cleared")]  # the gateways withdraw it
    updates = routing.delivery_updates(frames.deliveries(), frames.of(ACKS), 5, T0, NOW, cleared=cleared)
    assert [(r.account, r.smuid, r.status, r.is_new) for r in updates.collect()] == [("bob", 1, "cleared", False)]



def test_a_subscribe_with_since_withholds_what_its_own_batch_routed_before_it(frames):
    """A delivery routed earlier in the batch is pending too: a later SUB with SINCE clears it, so it
    is never sent and its row is ``cleared`` at once."""
    evts = frames.events(publish(1, 1, "/news/x"),  # before SINCE, before the SUB: withheld
                         publish(2, 2, "/news/x", accepted=12),  # logged before the SUB, accepted after SINCE
                         publish(3, 3, "/other"),  # a topic the SUB does not match: sent
                         subscribe(4, "bob", "/news/*", since=11),  # redefines bob's SINCE
                         subscribe(5, "ann", "/news/x/*", since=11),  # a pattern that does not match /news/x
                         publish(6, 4, "/news/x", accepted=3))  # after the SUB: its SINCE filters it when routing
    current = frames.subs(sub_row("bob", "/news/*"), sub_row("bob", "/other"), sub_row("ann", "/news/x"))
    deliveries = routing.route(evts, routing.subscription_intervals(current, evts))
    held_back = routing.withheld(evts, deliveries)
    assert sorted((r.account, r.smuid) for r in held_back.collect()) == [("bob", 1)]
    updates = routing.delivery_updates(run_sql(withheld_sql("{e}", "{d}", cleared=False),
                                                       {"e": evts, "d": deliveries}),
                                       frames.of(ACKS), 5, T0, NOW, withheld=held_back)
    assert sorted((r.account, r.smuid, r.status, r.is_new) for r in updates.collect()) == [
        ("ann", 1, "pending", True), ("ann", 2, "pending", True), ("ann", 4, "pending", True),
        ("bob", 1, "cleared", True), ("bob", 2, "pending", True), ("bob", 3, "pending", True)]


def test_a_message_that_reached_nobody_gets_a_0_of_0_receipt_at_expiry(frames):
    messages = frames.of(MESSAGES_TABLE, *((n, "/t", f"c{n}", "alice", "ga", 0, [], [], ts(1), 0, n, 1, ts(10), mode,
                                            "all") for n, mode in ((1, "all"), (2, "one"), (3, "none"), (4, "all"))))
    expiring = frames.of(routing.EXPIRING, ("", 1, False), ("", 2, True), ("", 3, False), ("", 4, False))
    receipted = frames.of(StructType([StructField("smuid", LongType())]), (4,))  # answered already
    due = routing.receipts_due(frames.of(routing.RECEIPT_STATE), frames.of(ACKS), expiring, receipted, messages)
    expected = frames.of(routing.RECEIPTS_DUE, (1, "all", 0, 0), (2, "one", 0, 0))
    assert_df_equality(due, expected, ignore_row_order=True, ignore_nullable=True)
    rows = routing.receipt_messages(due, messages, NOW).collect()
    assert sorted((r.account, r.receipt_for, r.headers[-1][1]) for r in rows) == [("alice", 1, "0/0"),
                                                                                ("alice", 2, "0/0")]


def test_a_message_routed_already_expired_gets_its_x_of_y_receipt_in_the_same_batch(frames):
    """Routed in this batch to ann and bob (and stored for cat) but expired by the batch's clock: the
    receipt counts the new deliveries among the targeted, at once."""
    state = frames.of(routing.RECEIPT_STATE, ("cat", 1, "acked", "all"))
    routed = frames.deliveries(delivery("ann", 1, "/t", 1, expires_at=10) + ("all", "all"),
                               delivery("bob", 1, "/t", 1, expires_at=10) + ("all", "all"),
                               delivery("ann", 2, "/t", 2, expires_at=10) + ("none", "all"))
    expiring = frames.of(routing.EXPIRING, ("ann", 1, True), ("bob", 1, True), ("ann", 2, True))
    receipted = frames.of(StructType([StructField("smuid", LongType())]))
    due = routing.receipts_due(state, frames.of(ACKS), expiring, receipted, routed=routed)
    assert_df_equality(due, frames.of(routing.RECEIPTS_DUE, (1, "all", 1, 3)), ignore_nullable=True)


def test_an_ack_in_the_batch_that_routes_the_message_counts_toward_its_receipt(frames):
    """A gateway routing early lets bob acknowledge before the job has routed the message: RECEIPT ONE
    is due at once (1/2), RECEIPT ALL waits for ann."""
    routed = frames.deliveries(*(delivery(account, n, "/t", n, expires_at=10**9) + (mode, "all")
                                 for n, mode in ((1, "one"), (2, "all")) for account in ("ann", "bob")))
    acks = frames.of(ACKS, ("bob", 1, ts(3), "gb", seq(3)), ("bob", 2, ts(3), "gb", seq(4)))
    receipted = frames.of(StructType([StructField("smuid", LongType())]))
    due = routing.receipts_due(frames.of(routing.RECEIPT_STATE), acks, frames.of(routing.EXPIRING), receipted,
                               routed=routed)
    assert_df_equality(due, frames.of(routing.RECEIPTS_DUE, (1, "one", 1, 2)), ignore_nullable=True)


# -- REMOVE TOPIC


def test_messages_of_a_removed_topic_that_nobody_holds_go_to_the_trash_as_topic_removed(frames):
    expiring = frames.of(routing.EXPIRING, ("", 2, False))  # expires in this batch too: expired wins
    orphaned = frames.of(routing.ORPHANED, (1,), (2,))
    dead_rows = routing.dead_messages(expiring, no_retries(frames), orphaned)
    assert sorted((r.smuid, r.account, r.reason) for r in dead_rows.collect()) == [
        (1, "", "topic_removed"), (2, "", "undeliverable")]
    stored = frames.of(MESSAGES_TABLE, (1, "/t/x", "c1", "alice", "g", 0, [], [], ts(1), 0, 1, 2, None, "none", "all"))
    trashed = routing.trash(frames.of(routing.DEAD, (1, "", "topic_removed")), stored, NOW, 6).collect()
    assert [(r.smuid, r.trash_topic, r.reason) for r in trashed] == [(1, "/t/x/Trash", "topic_removed")]


def test_an_orphaned_message_the_batch_routes_to_somebody_is_not_trashed(frames):
    """The batch's own publishes before a REMOVE TOPIC are orphaned candidates too: one that reached a
    subscriber (or a late one) is held, its delivery still goes out; one that reached nobody goes."""
    orphaned = frames.of(routing.ORPHANED, (1,), (2,))
    routed_now = frames.deliveries(delivery("bob", 2, "/t/x", 3))
    dead_rows = routing.dead_messages(frames.of(routing.EXPIRING), no_retries(frames), orphaned, routed_now)
    assert [(r.smuid, r.account, r.reason) for r in dead_rows.collect()] == [(1, "", "topic_removed")]
