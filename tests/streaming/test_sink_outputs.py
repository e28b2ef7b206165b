"""CommandSink.outputs (one combined SQL query) against the public transforms run one by one."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from chispa import assert_df_equality
from deltalake import DeltaTable

from schemas import events as ev
from schemas.config import load_config
from schemas.spark import KAFKA_RECORD
from streaming import routing
from streaming.routing.commands import valid_events_sql
from streaming.routing.receipts import receipt_rows_sql
from streaming.routing.frames import EVENTS
from streaming.routing.sql import run_sql
from streaming.sink import CommandSink
from streaming.sink.command_sink import LOCAL_RELATION_ROWS
from streaming.sink.decoding import decode_records, events_by_kind
from streaming.sink.query import OUTPUTS
from streaming.sink.records import batch_now, nothing_to_route

T0 = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
US0 = int(T0.timestamp() * 1_000_000)


def assert_outputs_equal_the_public_transforms(spark, sink, commands, sizes) -> None:
    """``sink.outputs`` of a batch holding ``commands`` (plus one non-JSON record) equals the transforms
    run one by one, and has ``sizes`` rows per output."""
    rows = [(None, c.to_bytes(), "cmd", 0, 10 + i, T0 + timedelta(milliseconds=i), 0)
            for i, c in enumerate(commands)]
    rows.append((None, b"not json", "cmd", 0, 10 + len(commands), T0, 0))
    records = spark.createDataFrame(rows, KAFKA_RECORD)
    routed_at = T0 + timedelta(hours=1)

    out = sink.outputs(records, 7, routed_at)

    now = batch_now(records.toArrow())
    events = routing.parse_commands(records)
    intervals = routing.subscription_intervals(sink.current_subscriptions(spark), events)
    deliveries = routing.route(events, intervals)
    acks = routing.extract_acks(events)
    unrouted = routing.unrouted(events, deliveries)
    pending = spark.createDataFrame([], routing.PENDING)
    expiring = routing.expiring(deliveries, unrouted, acks, pending, now)
    retrying = spark.createDataFrame([], routing.RETRYING)
    released = routing.released(events, retrying, acks, expiring, intervals, routing.message_rows(events, 7))
    retried = routing.retried(events, retrying, acks, expiring, released)
    live = routing.live(deliveries, expiring)
    messages = routing.message_rows(events, 7)
    expected = {
        "progress": spark.createDataFrame([(0, 10 + len(rows), len(rows))], OUTPUTS["progress"]),
        "deliver": routing.deliver_records(routing.unacknowledged(live, acks)),
        "acked": routing.acked_records(routing.settled(acks, live)),
        "expired": routing.expired_records(expiring, retried, released),
        "messages": messages,
        "trash": routing.trash(routing.dead_messages(expiring, retried), messages, now, 7),
        "deliveries": routing.delivery_updates(deliveries, acks, 7, routed_at, now, unrouted, expiring, retried,
                                               released),
        "subscriptions": routing.subscription_state(intervals, 7),
        "receipts": run_sql(receipt_rows_sql("{receipts}", 7), {"receipts": routing.receipt_messages(
            routing.receipts_due(spark.createDataFrame([], routing.RECEIPT_STATE), acks, expiring,
                                 spark.createDataFrame([], "smuid bigint")), messages, now)}),
    }
    assert set(out) == set(expected)
    assert {kind: out[kind].num_rows for kind in out} == sizes
    for kind, frame in expected.items():
        table = out[kind] if out[kind].num_rows else out[kind].schema.empty_table()  # Spark needs one chunk
        actual = spark.createDataFrame(table, OUTPUTS[kind])
        assert_df_equality(actual, frame.select(*OUTPUTS[kind].fieldNames()),
                           ignore_row_order=True, ignore_nullable=True)


def test_outputs_equal_the_public_transforms(spark, tmp_path):
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    section = ev.Section([("Content-Type", "text/plain")], b"hi")
    commands = [
        ev.Subscribe("bob", "gb", "/t/*", US0),
        ev.Subscribe("carol", "gc", "/t/x", US0 + 1),
        ev.Publish(1, "/t/x", "c1", "alice", "ga", US0 + 2, 3, [("A", "1")], [section]),
        ev.Unsubscribe("carol", "gc", "/t/x", US0 + 3),
        ev.Publish(2, "/t/x", "c2", "alice", "ga", US0 + 4),
        ev.Ack("bob", "gb", 1, US0 + 5),
        ev.Ack("bob", "gb", 99, US0 + 6),
    ]
    assert_outputs_equal_the_public_transforms(  # bob's ACK of 1 (routed early) leaves 3 deliveries, 2 to send
        spark, sink, commands,
        {"progress": 1, "deliver": 2, "acked": 2, "expired": 0, "messages": 2, "trash": 0, "deliveries": 4,
         "subscriptions": 2, "receipts": 0})


def test_outputs_with_bounds_account_topics_and_control_events(spark, tmp_path):
    """SINCE/UNTIL, re-subscribes, account topics and registry events through the combined query."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    commands = [
        ev.Subscribe("bob", "gb", "/t/*", US0, since=US0 + 3),
        ev.CreateTopic(request="r1", account="alice", topic="/t/y", accepted_at=US0 + 1),
        ev.Publish(1, "/t/x", "c1", "alice", "ga", US0 + 2),  # before SINCE
        ev.Publish(2, "/t/x", "c2", "alice", "ga", US0 + 3),
        ev.Subscribe("bob", "gb", "/t/*", US0 + 4, until=US0 + 6),  # redefined
        ev.Watch(request="r2", account="bob", kind="topic", pattern="/t/*", accepted_at=US0 + 5),
        ev.Publish(3, "/t/x", "c3", "alice", "ga", US0 + 6),  # at UNTIL
        ev.Publish(4, "/accounts/alice", "c4", "bob", "gb", US0 + 7),
        ev.Sync(request="r3"),
    ]
    assert_outputs_equal_the_public_transforms(
        spark, sink, commands,
        {"progress": 1, "deliver": 2, "acked": 0, "expired": 0, "messages": 4, "trash": 0, "deliveries": 2,
         "subscriptions": 1, "receipts": 0})


def test_outputs_with_expiry_ticks_and_unrouted_messages(spark, tmp_path):
    """Expiry through the combined query: "now" is the batch's last tick; an already expired
    guaranteed message is not sent and goes to the Trash, as does one nobody subscribed to."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    commands = [
        ev.Subscribe("bob", "gb", "/t/*", US0),
        ev.Publish(1, "/t/x", "c1", "alice", "ga", US0 + 1, expires_at=US0 + 10),  # expires at the tick
        ev.Publish(2, "/t/x", "c2", "alice", "ga", US0 + 2, expires_at=US0 + 11),  # one µs later: lives
        ev.Publish(3, "/t/x", "c3", "alice", "ga", US0 + 3),  # state message
        ev.Publish(4, "/u", "c4", "alice", "ga", US0 + 4, expires_at=US0 + 5),  # nobody subscribed
        ev.Publish(5, "/u", "c5", "alice", "ga", US0 + 5, expires_at=US0 + 50),  # nobody, lives
        ev.Tick(US0 + 10),
    ]
    assert_outputs_equal_the_public_transforms(
        spark, sink, commands,
        # expired: bob's delivery of 1 is withdrawn from gateways (one routing early may have notified it)
        {"progress": 1, "deliver": 2, "acked": 0, "expired": 1, "messages": 5, "trash": 2, "deliveries": 5,
         "subscriptions": 1, "receipts": 0})
    out = sink.outputs(spark.createDataFrame(
        [(None, c.to_bytes(), "cmd", 0, i, T0, 0) for i, c in enumerate(commands)], KAFKA_RECORD), 7, T0)
    assert sorted(out["trash"].column("smuid").to_pylist()) == [1, 4]
    assert sorted(zip(out["deliveries"].column("account").to_pylist(), out["deliveries"].column("smuid").to_pylist(),
                      out["deliveries"].column("status").to_pylist())) == [
        ("", 4, "expired"), ("", 5, "unrouted"), ("bob", 1, "expired"), ("bob", 2, "pending"), ("bob", 3, "pending")]


def test_decoding_in_python_gives_the_events_from_json_gives(spark):
    """The sink decodes records in Python (``decode_records``); the routing query's ``events`` are
    then the same rows :func:`routing.parse_commands` (Spark's ``from_json``) makes of them,
    malformed records dropped alike."""
    section = ev.Section([("Content-Type", "text/plain"), ("X-A", "b")], b"\x00\xffhi")
    values = [
        ev.Publish(1, "/t/x", "c1", "alice", "ga", US0, 3, [("Name", "n"), ("X-Y", "z")], [section],
                   expires_at=US0 + 5, receipt="all", delivery="one").to_bytes(),
        ev.Subscribe("bob", "gb", "/t/*", US0 + 1, since=US0, until=US0 + 9).to_bytes(),
        ev.Ack("bob", "gb", 1, US0 + 2).to_bytes(),
        ev.CreateTopic(request="r1", account="alice", topic="/t/y", accepted_at=US0 + 3).to_bytes(),
        b'{"type":"ack","account":"bob","smuid":2,"accepted_at":1,"unknown":[1,{"a":2}]}',  # extra field
        b'{"type":"ack","account":"bob","smuid":"two","accepted_at":1}',  # smuid of the wrong type
        b'{"type":"ack","account":"bob"}',  # no smuid
        b"[1, 2]", b"not json", b"", None,
    ]
    rows = [(None, value, "cmd", 2, 40 + i, T0 + timedelta(milliseconds=i), 0) for i, value in enumerate(values)]
    records = spark.createDataFrame(rows, KAFKA_RECORD)

    decoded = spark.createDataFrame(decode_records(records.toArrow()), routing.EVENTS)
    ours = run_sql(valid_events_sql("{decoded}"), {"decoded": decoded})

    assert decoded.count() == len(values)  # one row per record: the sink's progress counts them all
    assert_df_equality(ours, routing.parse_commands(records), ignore_row_order=True, ignore_nullable=True)
    # publish, subscribe, ack and the ack with an extra field route; registry events are not routed
    assert sorted(r.kafka_offset for r in ours.collect()) == [40, 41, 42, 44]


@pytest.mark.parametrize("simple", [True, False], ids=["simple batch", "routing query"])
def test_a_record_no_utf8_string_can_hold_is_dropped_and_the_batch_routes(spark, tmp_path, simple):
    """A commands record whose JSON escapes a lone surrogate (``"\\ud800"``: the gateways never write one,
    another producer may) is no command; it was a batch that failed on every replay, the job stuck."""
    sink = CommandSink(load_config(env={"SMQP_STREAMING_SIMPLE_BATCHES": str(simple).lower()},
                                   data_dir=str(tmp_path)))
    commands = [ev.Subscribe("bob", "gb", "/t", US0).to_bytes()] * (not simple) + [
        b'{"type":"publish","smuid":9,"topic":"/t\\ud800","account":"alice","accepted_at":1}',
        ev.Publish(1, "/t", "c1", "alice", "gp", US0 + 1).to_bytes()]
    rows = [(None, value, "cmd", 0, i, T0 + timedelta(milliseconds=i), 0) for i, value in enumerate(commands)]
    sink.commit_outputs(sink.outputs(spark.createDataFrame(rows, KAFKA_RECORD), 0, T0), 0)
    stored = DeltaTable(sink.config.table_path("messages")).to_pyarrow_table(columns=["smuid", "topic"])
    assert stored.to_pylist() == [{"smuid": 1, "topic": "/t"}]


def run_batch(spark, sink, batch_id, commands, offset=0) -> dict:
    """One batch of ``commands`` through ``sink.outputs``, committed to Delta as the sink does."""
    rows = [(None, c.to_bytes(), "cmd", 0, offset + i, T0 + timedelta(milliseconds=offset + i), 0)
            for i, c in enumerate(commands)]
    out = sink.outputs(spark.createDataFrame(rows, KAFKA_RECORD), batch_id, T0)
    sink.commit_outputs(out, batch_id)
    return out


def test_new_deliveries_no_row_matches_are_appended_the_others_merged(spark, tmp_path):
    """New deliveries no stored row can match (most: of messages their batch brought) are appended
    (~15-25 ms against a merge's ~60-70 on this host), with the same rows; a new delivery whose key is
    stored (a DELIVERY ONE message handed back to a subscriber that held it: ``released`` there) is
    merged, so it stays one row."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t", US0)])
    run_batch(spark, sink, 1, [ev.Publish(1, "/t", "c1", "alice", "gp", US0 + 1),
                               ev.Publish(2, "/t", "c2", "alice", "gp", US0 + 2, delivery="one")], offset=10)
    deliveries = DeltaTable(sink.config.table_path("deliveries"))
    assert deliveries.history(1)[0]["operation"] == "WRITE"
    assert table_rows(sink, "deliveries") == [("bob", 1, "pending"), ("bob", 2, "pending")]

    stored = deliveries.to_pyarrow_table(filters=[("smuid", "=", 2)])
    released = stored.set_column(stored.schema.get_field_index("status"), "status", pa.array(["released"]))
    none = pa.chunked_array([], pa.int64())  # no publish of its own in either batch
    sink._commit_deliveries(released.append_column("is_new", pa.array([False])), 2, none)
    sink._commit_deliveries(stored.append_column("is_new", pa.array([True])), 3, none)  # handed back to bob
    deliveries.update_incremental()
    assert deliveries.history(1)[0]["operation"] == "MERGE"
    assert table_rows(sink, "deliveries") == [("bob", 1, "pending"), ("bob", 2, "pending")]


def test_trash_rows_no_stored_row_matches_are_appended_a_message_already_there_is_not_added_again(tmp_path):
    """The Trash's rows are mostly of messages that die in their batch, which no stored row can match:
    they are appended, at a fraction of a merge's cost (most batches under load bring an expiry).  A row
    whose message is in the Trash already, for the same subscriber or for the whole message (a row
    written with a null account counts as the whole message's), is not added again."""
    from schemas.spark import TRASH_TABLE, arrow_schema

    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    schema = arrow_schema(TRASH_TABLE)

    def trash(batch_id, *keys):
        rows = [{"smuid": smuid, "topic": "/t", "trash_topic": "/t/Trash", "reason": "expired",
                 "trashed_at": T0, "batch_id": batch_id, "account": account} for smuid, account in keys]
        sink._commit_trash(pa.Table.from_pylist(rows, schema=schema), batch_id)
        table = DeltaTable(sink.config.table_path("trash"))
        stored = sorted(((r["smuid"], r["account"]) for r in table.to_pyarrow_table().to_pylist()),
                        key=lambda key: (key[0], key[1] or ""))
        return table.history(1)[0]["operation"], stored

    assert trash(1, (1, ""), (2, "bob")) == ("WRITE", [(1, ""), (2, "bob")])
    assert trash(2, (3, "")) == ("WRITE", [(1, ""), (2, "bob"), (3, "")])
    assert trash(3, (1, ""), (2, "ann"), (4, "")) == ("MERGE", [(1, ""), (2, "ann"), (2, "bob"), (3, ""), (4, "")])
    assert trash(4, (2, "bob"), (3, ""))[1] == [(1, ""), (2, "ann"), (2, "bob"), (3, ""), (4, "")]
    assert trash(5, (5, None))[0] == "WRITE"
    assert trash(6, (5, ""))[1][-1:] == [(5, None)]


def delivered(out) -> list[tuple[str, int]]:
    return sorted((d.account, d.smuid) for d in map(ev.decode, out["deliver"].column("value").to_pylist()))


def withdrawn(out) -> list[tuple[str, int, str]]:
    """The ``Acked`` records of deliveries that died unacknowledged: (account, smuid, reason)."""
    return sorted((a.account, a.smuid, a.reason) for a in map(ev.decode, out["expired"].column("value").to_pylist()))


def test_a_late_subscriber_gets_stored_messages_that_have_not_expired(spark, tmp_path):
    """Messages stored by an earlier batch reach a SUBSCRIBE of a later one while they live; one
    that reached nobody is no longer ``unrouted`` once taken (so never trashed as undeliverable)."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    run_batch(spark, sink, 0, [
        ev.Subscribe("ann", "ga", "/t/x", US0),
        ev.Publish(1, "/t/x", "c1", "alice", "gp", US0 + 1, expires_at=US0 + 60_000_000),  # reaches ann
        ev.Publish(2, "/t/y", "c2", "alice", "gp", US0 + 2, expires_at=US0 + 60_000_000),  # reaches nobody
        ev.Publish(3, "/t/y", "c3", "alice", "gp", US0 + 3, expires_at=US0 + 5_000_000),  # expired below
        ev.Publish(4, "/t/y", "c4", "alice", "gp", US0 + 4),  # a state message
    ])
    out = run_batch(spark, sink, 1, [ev.Tick(US0 + 10_000_000), ev.Subscribe("bob", "gb", "/t/*", US0 + 10_000_000),
                                     ev.Subscribe("ann", "ga", "/t/*", US0 + 10_000_001)], offset=10)
    assert delivered(out) == [("ann", 2), ("ann", 4), ("bob", 1), ("bob", 2), ("bob", 4)]
    assert out["trash"].column("reason").to_pylist() == ["undeliverable"]  # 3, expired before anyone came
    unrouted = DeltaTable(sink.config.table_path("unrouted")).to_pyarrow_table().to_pylist()
    assert sorted((r["smuid"], r["status"]) for r in unrouted) == [(2, "routed"), (3, "expired")]
    # the next SUBSCRIBE of bob's (a new pattern) gets nothing twice
    again = run_batch(spark, sink, 2, [ev.Subscribe("bob", "gb", "/t/y", US0 + 10_000_002)], offset=20)
    assert delivered(again) == []


def test_a_resubscribe_takes_no_late_message_and_one_after_an_unsubscribe_in_its_batch_does(spark, tmp_path):
    """A SUBSCRIBE to a subscription already active only redefines its SINCE/UNTIL (the sink does not
    look for late messages for it); after an UNSUBSCRIBE in the same batch it starts a new subscription,
    which takes what is stored and alive."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t/*", US0, since=US0 + 5),
                               ev.Publish(1, "/t/x", "c1", "alice", "gp", US0 + 1, expires_at=US0 + 60_000_000)])
    again = run_batch(spark, sink, 1, [ev.Subscribe("bob", "gb", "/t/*", US0 + 10)], offset=10)
    assert delivered(again) == []  # SINCE is gone from now on, but 1 came before
    anew = run_batch(spark, sink, 2, [ev.Unsubscribe("bob", "gb", "/t/*", US0 + 20),
                                      ev.Subscribe("bob", "gb", "/t/*", US0 + 21)], offset=20)
    assert delivered(anew) == [("bob", 1)]


def test_an_expiring_message_goes_to_the_trash_alike_from_the_jobs_memory_and_from_the_table(spark, tmp_path):
    """The rows the sink keeps of the messages it committed (``streaming.sink.recent``) give the Trash
    the row the ``messages`` table gives a restarted job, which keeps nothing yet."""
    config = load_config(env={}, data_dir=str(tmp_path))
    section = ev.Section([("Content-Type", "text/plain")], b"body")
    warm = CommandSink(config)
    run_batch(spark, warm, 0, [
        ev.Subscribe("bob", "gb", "/t/x", US0),
        ev.Publish(1, "/t/x", "c1", "alice", "gp", US0 + 1, 2, [("Timeout", "00:00:00:02")], [section],
                   expires_at=US0 + 2_000_000),
        ev.Publish(2, "/t/x", "c2", "alice", "gp", US0 + 2),  # no Timeout: not kept
    ])
    assert len(warm.recent) == 1
    later = spark.createDataFrame([(None, ev.Tick(US0 + 3_000_000).to_bytes(), "cmd", 0, 10, T0, 0)], KAFKA_RECORD)

    from_memory = warm.outputs(later, 1, T0)
    restarted = CommandSink(config)
    assert restarted.recent.take([1]) is None
    from_table = restarted.outputs(later, 1, T0)

    assert from_memory["trash"].num_rows == 1
    (trashed,) = from_memory["trash"].to_pylist()  # with what LIST …/Trash shows, copied from the message
    assert (trashed["publisher_guid"], trashed["priority"], trashed["accepted_at"]) == (
        "gp", 2, T0 + timedelta(microseconds=1))
    assert from_memory["trash"].to_pylist() == from_table["trash"].to_pylist()
    assert withdrawn(from_memory) == withdrawn(from_table) == [("bob", 1, "expired")]


def test_a_message_expiring_before_every_stored_one_expires_at_its_time(spark, tmp_path):
    """The sink asks the tables what expires only once a batch's clock reaches the earliest stored
    expiry it knows of; a message committed since, expiring before that, brings that time forward.
    A message that expires is answered as such whichever of the two the batch found it by."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    expiring = lambda smuid, at, expires_at: ev.Publish(smuid, "/t", f"c{smuid}", "alice", "gp", at,
                                                        expires_at=expires_at)
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t", US0), expiring(1, US0 + 1, US0 + 10_000_000)])
    assert withdrawn(run_batch(spark, sink, 1, [ev.Tick(US0 + 1_000_000)], offset=10)) == []
    run_batch(spark, sink, 2, [expiring(2, US0 + 1_500_000, US0 + 2_000_000)], offset=20)
    assert withdrawn(run_batch(spark, sink, 3, [ev.Tick(US0 + 3_000_000)], offset=30)) == [("bob", 2, "expired")]
    assert withdrawn(run_batch(spark, sink, 4, [ev.Tick(US0 + 9_000_000)], offset=40)) == []
    assert withdrawn(run_batch(spark, sink, 5, [ev.Tick(US0 + 10_000_000)], offset=50)) == [("bob", 1, "expired")]
    assert withdrawn(run_batch(spark, sink, 6, [ev.Tick(US0 + 20_000_000)], offset=60)) == []
    assert sorted((r["smuid"], r["reason"]) for r in DeltaTable(sink.config.table_path("trash")).to_pyarrow_table()
                  .to_pylist()) == [(1, "expired"), (2, "expired")]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.lists(st.one_of(st.none(), st.integers(1, 8)), max_size=4),  # Timeouts, s
                                st.booleans(),  # the batch ACKs what it can
                                st.integers(0, 4)),  # seconds the clock moves on
                      min_size=2, max_size=6))
def test_a_sink_that_keeps_its_expiry_floor_expires_what_one_asking_the_tables_each_batch_does(
        spark, tmp_path_factory, steps):
    """Batches of publishes (some with a Timeout), ACKs and ticks through one long-lived sink, and
    each through a sink just made (which knows no floor and asks the tables): the same expiries,
    batch by batch."""
    kept = CommandSink(load_config(env={}, data_dir=str(tmp_path_factory.mktemp("kept"))))
    fresh_config = load_config(env={}, data_dir=str(tmp_path_factory.mktemp("fresh")))
    smuid, clock, offset, unacked = 0, US0, 0, []
    for batch_id, (timeouts, acking, moves) in enumerate(steps):
        commands = [ev.Subscribe("bob", "gb", "/t", US0)] if batch_id == 0 else []
        for timeout in timeouts:
            smuid += 1
            clock += 1000
            commands.append(ev.Publish(smuid, "/t", f"c{smuid}", "alice", "gp", clock,
                                       expires_at=None if timeout is None else clock + timeout * 1_000_000))
        if acking and unacked:
            commands.append(ev.Ack("bob", "gb", unacked.pop(0), clock + 1))
        unacked += [c.smuid for c in commands if isinstance(c, ev.Publish)]
        clock += moves * 1_000_000
        commands.append(ev.Tick(clock))
        expired = [withdrawn(run_batch(spark, sink, batch_id, commands, offset=offset))
                   for sink in (kept, CommandSink(fresh_config))]
        assert expired[0] == expired[1]
        offset += len(commands)


def test_a_subscribe_with_since_clears_what_is_pending_before_it(spark, tmp_path):
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t/*", US0),
                               ev.Publish(1, "/t/x", "c1", "alice", "gp", US0 + 1),
                               ev.Publish(2, "/t/x", "c2", "alice", "gp", US0 + 3)])
    out = run_batch(spark, sink, 1, [ev.Subscribe("bob", "gb", "/t/*", US0 + 5, since=US0 + 2)], offset=10)
    assert [ev.decode(v) for v in out["expired"].column("value").to_pylist()] == [ev.Acked("bob", 1, "cleared")]
    rows = DeltaTable(sink.config.table_path("deliveries")).to_pyarrow_table().to_pylist()
    assert sorted((r["smuid"], r["status"]) for r in rows) == [(1, "cleared"), (2, "pending")]


def test_a_removed_topics_messages_nobody_holds_go_to_its_trash(spark, tmp_path):
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t/x", US0),
                               ev.Publish(1, "/t/x", "c1", "alice", "gp", US0 + 1),  # bob acknowledges it
                               ev.Publish(2, "/t/x", "c2", "alice", "gp", US0 + 2),  # still pending for bob
                               ev.Publish(3, "/t/x/y", "c3", "alice", "gp", US0 + 3, expires_at=US0 + 60_000_000),
                               ev.Publish(4, "/u", "c4", "alice", "gp", US0 + 4),  # another topic
                               ev.Ack("bob", "gb", 1, US0 + 5)])
    out = run_batch(spark, sink, 1, [ev.RemoveTopic("r", "alice", "/t/x", US0 + 10)], offset=10)
    assert sorted(zip(out["trash"].column("smuid").to_pylist(), out["trash"].column("reason").to_pylist(),
                      out["trash"].column("trash_topic").to_pylist())) == [
        (1, "topic_removed", "/t/x/Trash"), (3, "topic_removed", "/t/x/y/Trash")]
    unrouted = DeltaTable(sink.config.table_path("unrouted")).to_pyarrow_table().to_pylist()
    # 3 is never trashed again at expiry; 2, still held by bob, waits for his ACK
    assert sorted((r["smuid"], r["status"]) for r in unrouted) == [(2, "removed"), (3, "trashed")]

def run_limited(spark, sink, batch_id, commands, offset=0) -> dict:
    """:func:`run_batch` with DELIVERY ONE's in-flight limit applied, as the sink's ``__call__`` does."""
    rows = [(None, c.to_bytes(), "cmd", 0, offset + i, T0 + timedelta(milliseconds=offset + i), 0)
            for i, c in enumerate(commands)]
    frame = spark.createDataFrame(rows, KAFKA_RECORD)
    out = sink.outputs(frame, batch_id, T0)
    sink.limit_in_flight(out, frame.toArrow(), batch_id, T0)
    sink.commit_outputs(out, batch_id)
    return out


def work_queue_sink(tmp_path, max_in_flight=2) -> CommandSink:
    return CommandSink(load_config(env={}, data_dir=str(tmp_path),
                                   topics={"/w": {"delivery": "one", "max_in_flight": max_in_flight}}))


def jobs(smuids, expires_at=US0 + 60_000_000):
    return [ev.Publish(s, "/w", f"c{s}", "alice", "gp", US0 + s, expires_at=expires_at, delivery="one")
            for s in smuids]


def table_rows(sink, name) -> list[tuple]:
    rows = DeltaTable(sink.config.table_path(name)).to_pyarrow_table().to_pylist()
    return sorted((r["account"], r["smuid"], r["status"]) for r in rows)


def test_delivery_one_holds_each_subscriber_to_max_in_flight_and_the_rest_wait_for_room(spark, tmp_path):
    """XEP-0254 queue_requests: at most ``max_in_flight`` unacknowledged per subscriber; an ACK frees a
    slot for the oldest waiting message in the same batch; a waiting message expires into the Trash."""
    sink = work_queue_sink(tmp_path)
    first = run_limited(spark, sink, 0, [ev.Subscribe("ann", "ga", "/w", US0), ev.Subscribe("bob", "gb", "/w", US0)]
                        + jobs(range(1, 7)))
    held = delivered(first)
    assert sorted(account for account, _ in held) == ["ann", "ann", "bob", "bob"]
    assert sorted(smuid for _, smuid in held) == [1, 2, 3, 4]  # the oldest go first
    assert table_rows(sink, "unrouted") == [("", 5, "waiting"), ("", 6, "waiting")]

    ann_first = min(smuid for account, smuid in held if account == "ann")
    second = run_limited(spark, sink, 1, [ev.Ack("ann", "ga", ann_first, US0 + 100)], offset=10)
    assert delivered(second) == [("ann", 5)]  # ann's freed slot; bob is still full
    assert table_rows(sink, "unrouted") == [("", 5, "routed"), ("", 6, "waiting")]
    assert ("ann", 5, "pending") in table_rows(sink, "deliveries")

    third = run_limited(spark, sink, 2, [ev.Tick(US0 + 61_000_000)], offset=20)
    assert delivered(third) == []
    dead = sorted(zip(third["trash"].column("smuid").to_pylist(), third["trash"].column("reason").to_pylist()))
    assert dead == [(s, "expired") for s in range(1, 6) if s != ann_first] + [(6, "undeliverable")]  # it reached nobody
    assert table_rows(sink, "unrouted") == [("", 5, "routed"), ("", 6, "expired")]


def test_a_released_delivery_one_message_waits_for_room_and_a_replay_sends_what_was_recorded(spark, tmp_path):
    """A subscriber that leaves hands its messages on, but only to one with room; a replayed batch whose
    deliveries were committed sends the same Delivers as its first attempt (DESIGN Property 4)."""
    sink = work_queue_sink(tmp_path, max_in_flight=1)
    first = run_limited(spark, sink, 0, [ev.Subscribe("ann", "ga", "/w", US0), ev.Subscribe("bob", "gb", "/w", US0)]
                        + jobs(range(1, 4)))
    held = dict((smuid, account) for account, smuid in delivered(first))
    assert sorted(held) == [1, 2] and sorted(held.values()) == ["ann", "bob"]
    leaver = held[1]
    stayer = held[2]
    leaving = [ev.Nack(leaver, "g", 1, US0 + 100, max_retries=5, reason="disconnect"),
               ev.Unsubscribe(leaver, "g", "/w", US0 + 101)]
    second = run_limited(spark, sink, 1, leaving, offset=10)
    assert delivered(second) == []  # the stayer holds its one already: 1 and 3 wait for it
    assert table_rows(sink, "unrouted") == [("", 1, "waiting"), ("", 3, "waiting")]

    ack = [ev.Ack(stayer, "g", 2, US0 + 200)]
    third = run_limited(spark, sink, 2, ack, offset=20)
    assert delivered(third) == [(stayer, 1)]  # the oldest waiting message
    restarted = work_queue_sink(tmp_path, max_in_flight=1)  # the job restarted: the batch is replayed
    assert delivered(run_limited(spark, restarted, 2, ack, offset=20)) == [(stayer, 1)]
    assert (stayer, 1, "pending") in table_rows(sink, "deliveries")
    assert table_rows(sink, "unrouted") == [("", 1, "routed"), ("", 3, "waiting")]


def test_a_delivery_one_message_a_since_clears_goes_to_another_subscriber(spark, tmp_path):
    """SINCE clears the subscriber's pending messages; a DELIVERY ONE message was meant for one of
    the topic's subscribers, so it goes to another one instead: stored ones (1, 2), and one routed
    earlier in the SUBSCRIBE's own batch and withheld (10)."""
    sink = work_queue_sink(tmp_path, max_in_flight=5)
    first = run_limited(spark, sink, 0, [ev.Subscribe("ann", "ga", "/w", US0)] + jobs([1, 2]))
    assert delivered(first) == [("ann", 1), ("ann", 2)]
    second = run_limited(spark, sink, 1, jobs([10]) + [ev.Subscribe("bob", "gb", "/w", US0 + 20),
                                                       ev.Subscribe("ann", "ga", "/w", US0 + 21, since=US0 + 15)],
                         offset=10)
    assert delivered(second) == [("bob", 1), ("bob", 2), ("bob", 10)]
    rows = table_rows(sink, "deliveries")
    assert [r for r in rows if r[0] == "ann"] == [("ann", 1, "cleared"), ("ann", 2, "cleared"), ("ann", 10, "cleared")]
    assert [r for r in rows if r[0] == "bob"] == [("bob", 1, "pending"), ("bob", 2, "pending"), ("bob", 10, "pending")]


def test_a_batch_of_only_ticks_and_gateway_control_events_hasnothing_to_route():
    """Logins' presence and topic registry events are the gateways' alone: a batch of only those (and
    the clock) runs no routing query; one that also holds a routed event (REMOVE TOPIC too) does."""
    def records(*events):
        return pa.table({"value": [e.to_bytes() for e in events]})

    control = [ev.Tick(US0), ev.Presence(1, "ann", True), ev.NodeReset(2), ev.CreateTopic("r", "ann", "/t", US0)]
    assert nothing_to_route(records(*control))
    assert not nothing_to_route(records(*control, ev.RemoveTopic("r", "ann", "/t", US0)))
    assert not nothing_to_route(records(*control, ev.Ack("bob", "gb", 1, US0)))
    assert not nothing_to_route(records(ev.Publish(1, "/t", "c1", "alice", "gp", US0)))



def test_a_subscribe_with_since_clears_what_its_own_batch_routed_to_it_before(spark, tmp_path):
    """A publish routed to bob earlier in the batch than bob's re-SUBSCRIBE with a later SINCE is
    never sent to bob: its delivery row is ``cleared`` (a later one still goes out)."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t/*", US0)])
    out = run_batch(spark, sink, 1, [ev.Publish(1, "/t/x", "c1", "alice", "gp", US0 + 1),
                                     ev.Subscribe("bob", "gb", "/t/*", US0 + 5, since=US0 + 2),
                                     ev.Publish(2, "/t/x", "c2", "alice", "gp", US0 + 6)], offset=10)
    assert delivered(out) == [("bob", 2)]
    # a gateway routing early may have notified it: it is withdrawn there
    assert withdrawn(out) == [("bob", 1, "cleared")]
    rows = DeltaTable(sink.config.table_path("deliveries")).to_pyarrow_table().to_pylist()
    assert sorted((r["smuid"], r["status"]) for r in rows) == [(1, "cleared"), (2, "pending")]
    # the next SUBSCRIBE of bob's (a new pattern) does not bring it back
    again = run_batch(spark, sink, 2, [ev.Subscribe("bob", "gb", "/t/x", US0 + 7)], offset=20)
    assert delivered(again) == []


def test_a_message_routed_already_expired_gets_its_x_of_y_receipt_at_once(spark, tmp_path):
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/u", US0)])
    out = run_batch(spark, sink, 1, [ev.Publish(1, "/u", "c1", "alice", "ga", US0 + 1, expires_at=US0 + 5,
                                                receipt="all"), ev.Tick(US0 + 10)], offset=10)
    assert delivered(out) == [("alice", out["receipts"].column("receipt_smuid")[0].as_py())]  # never bob
    assert withdrawn(out) == [("bob", 1, "expired")]  # from a gateway that routed it early
    assert [(r["smuid"], r["mode"], r["acked"], r["targeted"]) for r in out["receipts"].to_pylist()] == [
        (1, "all", 0, 1)]


def test_a_message_acknowledged_in_the_batch_that_routes_it_is_recorded_acked_and_gets_its_receipt(
        spark, tmp_path):
    """A gateway routing early lets bob acknowledge a message before the job has routed it: the
    batch holding both records the delivery ``acked``, answers the ACK and owes the receipt now."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/u", US0), ev.Subscribe("cat", "gc", "/u", US0)])
    out = run_batch(spark, sink, 1, [
        ev.Publish(1, "/u", "c1", "alice", "ga", US0 + 1, expires_at=US0 + 10**9, receipt="all"),
        ev.Publish(2, "/u", "c2", "alice", "ga", US0 + 2, expires_at=US0 + 10**9, receipt="one"),
        ev.Ack("bob", "gb", 1, US0 + 3), ev.Ack("bob", "gb", 2, US0 + 4)], offset=10)
    assert sorted((a.account, a.smuid) for a in map(ev.decode, out["acked"].column("value").to_pylist())) == [
        ("bob", 1), ("bob", 2)]
    rows = DeltaTable(sink.config.table_path("deliveries")).to_pyarrow_table().to_pylist()
    assert sorted((r["account"], r["smuid"], r["status"]) for r in rows if r["account"] != "alice") == [
        ("bob", 1, "acked"), ("bob", 2, "acked"), ("cat", 1, "pending"), ("cat", 2, "pending")]
    # RECEIPT ONE is due at bob's ACK; RECEIPT ALL waits for cat's
    assert [(r["smuid"], r["mode"], r["acked"], r["targeted"]) for r in out["receipts"].to_pylist()] == [
        (2, "one", 1, 2)]


def test_a_message_that_reached_nobody_and_expires_in_its_own_batch_gets_a_0_of_0_receipt(spark, tmp_path):
    """RECEIPT ONE / ALL with nobody subscribed, already expired by the batch's clock: ``0/0`` goes
    to the publisher's account topic at once, as it would from a later batch."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    out = run_batch(spark, sink, 0, [
        ev.Publish(1, "/u", "c1", "alice", "ga", US0 + 1, expires_at=US0 + 5, receipt="all"),
        ev.Publish(2, "/u", "c2", "alice", "ga", US0 + 2, expires_at=US0 + 5),  # asked for none
        ev.Tick(US0 + 10)])
    assert [(r["smuid"], r["mode"], r["acked"], r["targeted"]) for r in out["receipts"].to_pylist()] == [
        (1, "all", 0, 0)]
    receipts = [ev.decode(v) for v in out["deliver"].column("value").to_pylist()]
    assert [(d.account, d.topic, dict(d.headers)["Delivered"]) for d in receipts] == [
        ("alice", "/accounts/alice", "0/0")]
    assert sorted(out["trash"].column("smuid").to_pylist()) == [1, 2]


def test_a_message_published_just_before_its_topics_removal_that_nobody_holds_goes_to_its_trash(spark, tmp_path):
    """Published in the same batch just before the REMOVE TOPIC of its topic (or an ancestor) and held
    by nobody: ``topic_removed``, never kept ``unrouted``; one a subscriber got is still delivered."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t/x/w", US0)])
    out = run_batch(spark, sink, 1, [
        ev.Publish(1, "/t/x", "c1", "alice", "gp", US0 + 1, expires_at=US0 + 60_000_000),  # nobody
        ev.Publish(2, "/t/x/z", "c2", "alice", "gp", US0 + 2),  # a state message, nobody
        ev.Publish(3, "/t/x/w", "c3", "alice", "gp", US0 + 3),  # bob's
        ev.Publish(4, "/t/y", "c4", "alice", "gp", US0 + 4, expires_at=US0 + 60_000_000),  # another topic
        ev.RemoveTopic("r", "alice", "/t/x", US0 + 5)], offset=10)
    assert sorted(zip(out["trash"].column("smuid").to_pylist(), out["trash"].column("reason").to_pylist(),
                      out["trash"].column("trash_topic").to_pylist())) == [
        (1, "topic_removed", "/t/x/Trash"), (2, "topic_removed", "/t/x/z/Trash")]
    assert delivered(out) == [("bob", 3)]
    unrouted = DeltaTable(sink.config.table_path("unrouted")).to_pyarrow_table().to_pylist()
    assert [(r["smuid"], r["status"]) for r in unrouted] == [(4, "unrouted")]  # 1 is never trashed again


def test_a_removed_topics_message_goes_to_its_trash_once_acks_settle_its_last_pending_delivery(spark, tmp_path):
    """Held at the removal (bob's and ann's deliveries pending), it stays while any is pending; the
    ACK that settles the last one sends it to ``<topic>/Trash`` (``topic_removed``), also after a
    restart of the job between the removal and the ACKs."""
    config = load_config(env={}, data_dir=str(tmp_path))
    sink = CommandSink(config)
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t/x", US0), ev.Subscribe("ann", "ga", "/t/*", US0),
                               ev.Publish(1, "/t/x", "c1", "alice", "gp", US0 + 1),  # both hold it
                               ev.Publish(2, "/t/y", "c2", "alice", "gp", US0 + 2)])  # another topic
    removal = run_batch(spark, sink, 1, [ev.RemoveTopic("r", "alice", "/t/x", US0 + 10)], offset=10)
    assert removal["trash"].num_rows == 0  # still held: its deliveries go out
    sink = CommandSink(config)  # a restart: what is held is read back from the table
    first = run_batch(spark, sink, 2, [ev.Ack("bob", "gb", 1, US0 + 11), ev.Ack("bob", "gb", 2, US0 + 12)],
                      offset=20)
    assert first["trash"].num_rows == 0  # ann still holds it
    last = run_batch(spark, sink, 3, [ev.Ack("ann", "ga", 1, US0 + 13), ev.Ack("ann", "ga", 2, US0 + 14)],
                     offset=30)
    assert sorted(zip(last["trash"].column("smuid").to_pylist(), last["trash"].column("reason").to_pylist(),
                      last["trash"].column("trash_topic").to_pylist())) == [(1, "topic_removed", "/t/x/Trash")]
    unrouted = DeltaTable(config.table_path("unrouted")).to_pyarrow_table().to_pylist()
    assert [(r["smuid"], r["status"]) for r in unrouted] == [(1, "trashed")]
    assert sink.removed_held() == set()


def test_the_routing_query_reads_each_kind_of_event_from_a_relation_of_its_own():
    """Every command lands in the relation of its kind; a record of no kind (not JSON, an unknown type)
    in none, as the routing query's validity filter would drop it anyway."""
    records = pa.table({"value": [e.to_bytes() for e in (
        ev.Publish(1, "/t", "c1", "alice", "ga", US0), ev.Ack("bob", "gb", 1, US0 + 1),
        ev.Subscribe("bob", "gb", "/t", US0 + 2), ev.Unsubscribe("bob", "gb", "/t", US0 + 3),
        ev.Nack("bob", "gb", 1, US0 + 4, 3, "disconnect"), ev.Tick(US0 + 5))] + [b"not json"],
        "timestamp": [T0] * 7, "partition": [0] * 7, "offset": list(range(7))})

    kinds = events_by_kind(decode_records(records))

    assert {kind: rows.column("type").to_pylist() for kind, rows in kinds.items()} == {
        "publish": ["publish"], "subscription": ["subscribe", "unsubscribe"], "ack": ["ack"], "nack": ["nack"]}
    assert kinds["ack"].column("kafka_offset").to_pylist() == [1]


def test_a_backlog_batch_with_a_subscribe_is_routed_from_stored_rows_not_a_plan_holding_them(spark, tmp_path):
    """A batch that must go through the routing query (a SUBSCRIBE) and holds a backlog of publishes: every
    publish reaches the subscriber, and no relation of that size is handed to Spark as a LocalRelation.

    Why: the optimiser copies a LocalRelation's rows for every Filter or Project over it, and the routing
    query reads its publishes in many places.  SUBSCRIBE + 100,000 publishes so ran out of the job's 1 GiB
    heap while planning (``bench-results/drain-oom-2026-11-29-4c3e5bf-job.log``)."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path)))
    backlog = LOCAL_RELATION_ROWS + 200
    section = ev.Section([("Content-Type", "text/plain")], b"x" * 200)
    commands = [ev.Subscribe("bob", "gb", "/q/backlog", US0)] + [
        ev.Publish(100 + i, "/q/backlog", f"c{i}", "alice", "ga", US0 + 1 + i, sections=[section])
        for i in range(backlog)]

    out = run_batch(spark, sink, 1, commands)

    assert sorted(delivered(out)) == [("bob", 100 + i) for i in range(backlog)]
    publishes = events_by_kind(decode_records(pa.Table.from_pylist(
        [{"value": c.to_bytes(), "timestamp": T0, "partition": 0, "offset": i} for i, c in enumerate(commands)])))
    relation = sink._relation(spark, publishes["publish"], EVENTS)
    assert relation._jdf.queryExecution().analyzed().getClass().getSimpleName() != "LocalRelation"
    assert relation.count() == backlog
    small = sink._relation(spark, publishes["publish"].slice(0, 10), EVENTS)  # small ones stay cheap to plan
    assert small._jdf.queryExecution().analyzed().getClass().getSimpleName() == "LocalRelation"
