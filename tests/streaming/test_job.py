"""The whole job: real broker, real Spark, Delta tables on disk."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from deploy.broker import create_topics
from schemas import events as ev
from schemas.config import load_config
from schemas.spark import KAFKA_RECORD, SUBSCRIPTIONS_TABLE, arrow_schema
from streaming.job import CheckpointMismatch, build_query, checkpoint_source, main
from streaming.session import LOCAL_CHECKPOINT_CONF, use_local_checkpoint_writes
from streaming.sink import CommandSink

pytestmark = pytest.mark.e2e

T0 = 1_700_000_000_000_000  # accepted_at, microseconds


@pytest.fixture
def config(broker, tmp_path, request):
    """The job's configuration on topics of its own; ``[streaming] source`` is the test's
    indirect parameter when it has one (``"python"`` otherwise)."""
    uid = uuid.uuid4().hex[:8]
    cfg = load_config(env={}, data_dir=str(tmp_path), kafka={
        "bootstrap": broker.bootstrap, "commands_topic": f"cmd-{uid}", "deliveries_topic": f"dlv-{uid}",
    }, streaming={"query_name": f"router-{uid}", "source": getattr(request, "param", "python")})
    create_topics(cfg.kafka)
    return cfg


@pytest.fixture
def sink(config):
    s = CommandSink(config)
    yield s
    s.close()


def produce(config, events) -> None:
    """As gateways append them, to the one commands partition in order."""
    producer = KafkaProducer(bootstrap_servers=config.kafka.bootstrap, acks="all")
    try:
        futures = [producer.send(config.kafka.commands_topic, value=e.to_bytes(), partition=0) for e in events]
        producer.flush(timeout=30)
        for f in futures:
            f.get(timeout=30)
    finally:
        producer.close(timeout=10)


def run_available_now(spark, config, sink) -> None:
    query = build_query(spark, config, available_now=True, sink=sink)
    try:
        assert query.awaitTermination(120), "availableNow run did not finish in 120 s"
        assert query.exception() is None
    finally:
        query.stop()


def deliveries_topic(config, at_least: int, timeout: float = 30.0) -> list:
    """Every event on the deliveries topic (waits until ``at_least`` arrived)."""
    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap, group_id=None,
                             enable_auto_commit=False)
    try:
        tp = TopicPartition(config.kafka.deliveries_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        out, deadline = [], time.monotonic() + timeout
        while True:
            for batch in consumer.poll(timeout_ms=200).values():
                out.extend((r.key, event) for r in batch for event in ev.decode_all(r.value))
            hw = consumer.highwater(tp)
            if len(out) >= at_least and hw is not None and consumer.position(tp) >= hw:
                return out
            assert time.monotonic() < deadline, f"{len(out)} records on the deliveries topic, wanted {at_least}"
    finally:
        consumer.close()


def table(config, name):
    return DeltaTable(config.table_path(name)).to_pyarrow_table().to_pylist()


def publishes(smuids, topic="/stocks/quotes/ibm"):
    return [ev.Publish(s, topic, f"c{s}", "alice", "ga", T0 + s, priority=s % 3,
                       headers=[("Subject", f"quote {s}")],
                       sections=[ev.Section([("Content-Type", "text/plain")], f"IBM {s}".encode())])
            for s in smuids]


def expected_deliver(p: ev.Publish, account="bob") -> ev.Deliver:
    return ev.Deliver(account, p.smuid, p.topic, p.cmuid, p.account, p.guid, p.accepted_at, p.priority,
                      p.headers, p.sections)


@pytest.mark.parametrize("config", ["python", "kafka"], indirect=True)
def test_route_commit_emit_then_acks_on_the_same_checkpoint(spark, config, sink):
    """On either commands source: ours, or Spark's own Kafka connector (its jars from the Maven cache)."""
    pubs = publishes(range(1, 11))
    produce(config, [ev.Subscribe("bob", "gb", "/stocks/*", T0)] + pubs)
    run_available_now(spark, config, sink)

    messages = table(config, "messages")
    assert sorted(m["smuid"] for m in messages) == list(range(1, 11))
    m1 = next(m for m in messages if m["smuid"] == 1)
    assert m1["publisher"] == "alice" and m1["sections"][0]["data"] == "SUJNIDE="  # base64 of b"IBM 1"
    assert m1["accepted_at"] == datetime.fromtimestamp((T0 + 1) / 1e6, timezone.utc)
    deliveries = table(config, "deliveries")
    assert sorted((d["account"], d["smuid"], d["status"]) for d in deliveries) == [
        ("bob", s, "pending") for s in range(1, 11)]
    subs = table(config, "subscriptions")
    assert [(s["account"], s["pattern"], s["guid"], s["active"]) for s in subs] == [
        ("bob", "/stocks/*", "gb", True)]

    out = deliveries_topic(config, at_least=11)
    delivers = [(k, e) for k, e in out if isinstance(e, ev.Deliver)]
    assert sorted(delivers, key=lambda ke: ke[1].smuid) == [(b"bob", expected_deliver(p)) for p in pubs]
    progress = [e for _, e in out if isinstance(e, ev.Progress)]
    assert progress and progress[-1].commands_offsets == {"0": 11}

    produce(config, [ev.Ack("bob", "gb", s, T0 + 100 + s) for s in (2, 4, 6, 8)])
    run_available_now(spark, config, sink)
    deliveries = {d["smuid"]: d for d in table(config, "deliveries")}
    assert sorted(s for s, d in deliveries.items() if d["status"] == "acked") == [2, 4, 6, 8]
    assert sorted(s for s, d in deliveries.items() if d["status"] == "pending") == [1, 3, 5, 7, 9, 10]
    assert deliveries[4]["acked_guid"] == "gb"
    assert deliveries[4]["acked_at"] == datetime.fromtimestamp((T0 + 104) / 1e6, timezone.utc)
    out = deliveries_topic(config, at_least=11 + 4 + 1)
    assert sorted(e.smuid for _, e in out if isinstance(e, ev.Acked)) == [2, 4, 6, 8]
    assert [e for _, e in out if isinstance(e, ev.Progress)][-1].commands_offsets == {"0": 15}  # after the ACKs
    assert len(table(config, "messages")) == 10
    # Spark's offset and commit logs are written without Hadoop's ".crc" sidecars, which doubled the
    # files each trigger writes and added ~20 ms to each log on this host (streaming.session.LEAN_CONF),
    # and through Hadoop's FileSystem API (LOCAL_CHECKPOINT_CONF): each file whole, its temporary gone
    logs = [path.name for name in ("offsets", "commits") for path in Path(config.checkpoint_dir, name).iterdir()]
    assert set(logs) >= {"0", "1"}
    assert [name for name in logs if not name.isdigit()] == []
    assert spark.conf.get(CHECKPOINT_MANAGER) == LOCAL_CHECKPOINT_CONF[CHECKPOINT_MANAGER]


CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


def test_only_a_local_checkpoint_is_written_through_the_filesystem_api_and_an_operators_choice_wins(spark, tmp_path):
    """Hadoop's FileContext starts five child processes per checkpoint file on a local disk where its
    FileSystem API starts one; HDFS and object stores keep the writer Spark picks for them."""
    previous = spark.conf.get(CHECKPOINT_MANAGER, None)
    operators = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
    try:
        spark.conf.unset(CHECKPOINT_MANAGER)
        use_local_checkpoint_writes(spark, "hdfs://namenode:8020/smqp/checkpoints/smqp-router")
        assert spark.conf.get(CHECKPOINT_MANAGER, None) is None
        use_local_checkpoint_writes(spark, f"file://{tmp_path}")
        assert spark.conf.get(CHECKPOINT_MANAGER) == LOCAL_CHECKPOINT_CONF[CHECKPOINT_MANAGER]
        spark.conf.set(CHECKPOINT_MANAGER, operators)
        use_local_checkpoint_writes(spark, str(tmp_path))
        assert spark.conf.get(CHECKPOINT_MANAGER) == operators
    finally:
        spark.conf.unset(CHECKPOINT_MANAGER)
        if previous is not None:
            spark.conf.set(CHECKPOINT_MANAGER, previous)


def batch_frame(spark, events, first_offset=0):
    rows = [(None, e.to_bytes(), "cmd", 0, first_offset + i, datetime(2024, 1, 1, tzinfo=timezone.utc), 0)
            for i, e in enumerate(events)]
    return spark.createDataFrame(rows, KAFKA_RECORD)


@pytest.mark.parametrize("config", ["python", "kafka"], indirect=True)
def test_a_checkpoint_keeps_the_commands_source_that_began_it_when_the_setting_changes(spark, config, sink, caplog):
    """A data dir begun with one commands source, reopened with the other (its setting or the default
    changed): the job reads on with the checkpoint's own, from where it stopped, and says so.
    Spark keeps each source's offsets in a form of its own, and the other could not read them."""
    produce(config, [ev.Subscribe("bob", "gb", "/stocks/*", T0)] + publishes(range(1, 4)))
    run_available_now(spark, config, sink)
    other = "kafka" if config.streaming.source == "python" else "python"
    assert checkpoint_source(config.checkpoint_dir) == config.streaming.source
    reopened = dataclasses.replace(config, streaming=dataclasses.replace(config.streaming, source=other))

    produce(config, publishes(range(4, 7)))
    with caplog.at_level("WARNING", logger="streaming.job"):
        run_available_now(spark, reopened, sink)
    assert f"begun by the '{config.streaming.source}' commands source: reading on with it, not '{other}'" in caplog.text
    assert sorted(m["smuid"] for m in table(config, "messages")) == list(range(1, 7))  # each once
    assert sorted(d["smuid"] for d in table(config, "deliveries")) == list(range(1, 7))
    out = deliveries_topic(config, at_least=6)
    assert [e for _, e in out if isinstance(e, ev.Progress)][-1].commands_offsets == {"0": 7}


def test_a_new_checkpoint_has_no_commands_source_yet(tmp_path):
    assert checkpoint_source(str(tmp_path / "nothing-here")) is None
    (tmp_path / "offsets").mkdir()
    assert checkpoint_source(str(tmp_path)) is None


def test_sink_replay_of_a_batch_never_duplicates_rows(spark, config, sink):
    first = batch_frame(spark, [ev.Subscribe("bob", "gb", "/t/*", T0)] + publishes(range(1, 6), "/t/x"))
    sink(first, 0)
    sink(first, 0)  # replay: subscriptions already hold batch 0 → skipped whole
    second = batch_frame(spark, publishes(range(6, 9), "/t/x") + [ev.Ack("bob", "gb", 1, T0 + 50)], 6)
    sink(second, 1)
    sink(second, 1)  # replay with no subscription change: skipped table by table
    assert sorted(m["smuid"] for m in table(config, "messages")) == list(range(1, 9))
    rows = table(config, "deliveries")
    assert sorted((d["smuid"], d["status"]) for d in rows) == [(1, "acked")] + [(s, "pending") for s in range(2, 9)]
    assert len(table(config, "subscriptions")) == 1
    for name in ("messages", "deliveries"):
        assert sink.committed_version(name) == 1
    assert sink.committed_version("subscriptions") == 0


def test_batch_failing_midway_is_completed_by_its_replay(spark, config, sink, monkeypatch):
    frame = batch_frame(spark, [ev.Subscribe("bob", "gb", "/t", T0)] + publishes(range(1, 4), "/t")
                        + [ev.Ack("bob", "gb", 2, T0 + 9), ev.Ack("nobody", "gx", 77, T0 + 9)])
    real = CommandSink._commit_subscriptions

    def crash(self, frame, batch_id):
        raise RuntimeError("crash before the subscriptions commit")

    monkeypatch.setattr(CommandSink, "_commit_subscriptions", crash)
    with pytest.raises(RuntimeError, match="crash"):
        sink(frame, 3)
    monkeypatch.setattr(CommandSink, "_commit_subscriptions", real)
    sink(frame, 3)
    assert sorted(m["smuid"] for m in table(config, "messages")) == [1, 2, 3]
    # an ACK in the same batch as its delivery ends acked; one for an unknown delivery adds no row
    assert sorted((d["account"], d["smuid"], d["status"]) for d in table(config, "deliveries")) == [
        ("bob", 1, "pending"), ("bob", 2, "acked"), ("bob", 3, "pending")]
    assert [(s["account"], s["active"]) for s in table(config, "subscriptions")] == [("bob", True)]


def test_a_commit_that_lands_and_then_raises_is_not_made_again_by_the_batchs_replay(spark, config, sink, monkeypatch):
    """The sink keeps the batch each table last committed, from its own commits, rather than asking the
    Delta log each time.  A commit may land and still raise (a failure after the log entry is written),
    so a batch that fails forgets what it kept, and its replay finds the commit in the table."""
    import streaming.sink.commits as commits

    sink(batch_frame(spark, [ev.Subscribe("bob", "gb", "/t", T0)] + publishes(range(1, 3), "/t")), 0)
    real = commits.write_deltalake

    def lands_then_raises(table, rows, **options):
        real(table, rows, **options)
        raise OSError("connection reset after the commit")

    frame = batch_frame(spark, publishes(range(3, 5), "/t"), 3)
    monkeypatch.setattr(commits, "write_deltalake", lands_then_raises)
    with pytest.raises(OSError, match="after the commit"):
        sink(frame, 1)
    monkeypatch.setattr(commits, "write_deltalake", real)
    sink(frame, 1)
    assert sorted(m["smuid"] for m in table(config, "messages")) == [1, 2, 3, 4]
    assert sorted((d["smuid"], d["status"]) for d in table(config, "deliveries")) == [
        (s, "pending") for s in range(1, 5)]
    assert sink.committed_version("messages") == sink.committed_version("deliveries") == 1


@pytest.mark.parametrize("config", ["python", "kafka"], indirect=True)
def test_a_job_that_dies_between_its_kafka_emission_and_its_delta_commit_replays_the_batch_once(
        spark, config, sink, monkeypatch):
    """The query's first attempt at a batch emits its Deliver records, commits ``messages``, then dies
    before the other tables: Spark's checkpoint has the batch's offsets but no commit.  The query
    started again on that checkpoint replays the same batch id, and the app transactions
    (``txnAppId`` / ``txnVersion``: query:table, batch id) leave every table with each row once."""
    pubs = publishes(range(1, 6), "/t/x")
    produce(config, [ev.Subscribe("bob", "gb", "/t/*", T0)] + pubs + [ev.Ack("bob", "gb", 3, T0 + 50)])

    def die_midway(self, out, batch_id):
        self._commit_messages(out["messages"], batch_id)
        raise RuntimeError("the job died before its other commits")

    monkeypatch.setattr(CommandSink, "commit_outputs", die_midway)
    query = build_query(spark, config, available_now=True, sink=sink)
    with pytest.raises(Exception, match="the job died"):
        query.awaitTermination(120)
    assert deliveries_topic(config, at_least=5)  # the batch's records were out before it died
    assert sorted(m["smuid"] for m in table(config, "messages")) == [1, 2, 3, 4, 5]
    monkeypatch.undo()

    restarted = CommandSink(config)  # a new job process: the dead one's sink is gone with it
    run_available_now(spark, config, restarted)
    assert sorted(m["smuid"] for m in table(config, "messages")) == [1, 2, 3, 4, 5]
    assert sorted((d["account"], d["smuid"], d["status"]) for d in table(config, "deliveries")) == [
        ("bob", s, "acked" if s == 3 else "pending") for s in range(1, 6)]
    assert [(s["account"], s["pattern"]) for s in table(config, "subscriptions")] == [("bob", "/t/*")]
    assert {name: restarted.committed_version(name) for name in ("messages", "deliveries", "subscriptions")} == {
        "messages": 0, "deliveries": 0, "subscriptions": 0}  # one batch, replayed under its own id


def test_a_new_or_older_checkpoint_beside_the_tables_is_refused_and_nothing_is_written(spark, config, sink,
                                                                                        tmp_path):
    """The tables hold batches their checkpoint never began: it was deleted (a new one would number its
    batches from 0 again, and each be skipped as committed) or an older copy was put back.  The job
    refuses to start, says why, and writes nothing; ``smqp-router`` exits 2 with the same words,
    before Spark starts.  Under another query name (the way on after a lost Kafka log) it routes again."""
    produce(config, [ev.Subscribe("bob", "gb", "/t/*", T0)] + publishes(range(1, 4), "/t/x"))
    run_available_now(spark, config, sink)
    older = shutil.copytree(config.checkpoint_dir, tmp_path / "older")
    produce(config, publishes(range(4, 6), "/t/x"))
    run_available_now(spark, config, sink)
    produce(config, publishes(range(6, 8), "/t/x"))

    for copy, where in ((None, "has no batch"), (older, "ends at batch 0")):
        shutil.rmtree(config.checkpoint_dir, ignore_errors=True)
        if copy is not None:
            shutil.copytree(copy, config.checkpoint_dir)
        with pytest.raises(CheckpointMismatch, match=f"hold batch 1 of query '{config.streaming.query_name}', "
                                                     f"but its checkpoint .* {where}: .* Restore that checkpoint"):
            build_query(spark, config, available_now=True, sink=CommandSink(config))
    assert sorted(m["smuid"] for m in table(config, "messages")) == [1, 2, 3, 4, 5]

    # the way on after a lost Kafka log: another query name, a new checkpoint, batches counted apart
    renamed = dataclasses.replace(
        config, kafka=dataclasses.replace(config.kafka, commands_topic=f"{config.kafka.commands_topic}-new"),
        streaming=dataclasses.replace(config.streaming, query_name=f"{config.streaming.query_name}-2"))
    create_topics(renamed.kafka)
    produce(renamed, publishes(range(8, 10), "/t/x"))
    renamed_sink = CommandSink(renamed)
    try:
        run_available_now(spark, renamed, renamed_sink)
    finally:
        renamed_sink.close()
    assert sorted(m["smuid"] for m in table(config, "messages")) == [1, 2, 3, 4, 5, 8, 9]
    assert sorted(d["smuid"] for d in table(config, "deliveries") if d["account"] == "bob") == [1, 2, 3, 4, 5, 8, 9]

    toml = tmp_path / "smqp.toml"
    toml.write_text(f'data_dir = "{config.data_dir}"\n[streaming]\nquery_name = "{config.streaming.query_name}"\n')
    run = subprocess.run([sys.executable, "-m", "streaming.job", "--config", str(toml)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "SMQP_STREAMING_NICE": "0"})
    assert run.returncode == 2
    assert "it is not the checkpoint that wrote them" in run.stderr and "Spark master" not in run.stderr


def test_subscription_bounds_survive_batches_in_a_table_written_before_they_existed(spark, config, sink):
    """SINCE/UNTIL are stored with the subscription; a data dir from before those columns keeps working."""
    legacy = arrow_schema(SUBSCRIPTIONS_TABLE)
    legacy = pa.schema([f for f in legacy if f.name not in ("since", "until")])
    day_before = datetime.fromtimestamp(T0 / 1e6 - 86400, timezone.utc)
    write_deltalake(config.table_path("subscriptions"),
                    pa.Table.from_pylist([{"account": "bob", "pattern": "/t/*", "guid": "g0", "active": True,
                                           "subscribed_at": day_before, "batch_id": 0}], schema=legacy))

    sink(batch_frame(spark, [ev.Subscribe("carol", "gc", "/t/*", T0, since=T0 + 5, until=T0 + 8)]), 0)
    sink(batch_frame(spark, publishes(range(1, 11), "/t/x"), 1), 1)

    assert sorted((d["account"], d["smuid"]) for d in table(config, "deliveries")) == (
        [("bob", s) for s in range(1, 11)] + [("carol", s) for s in (5, 6, 7)])
    bounds = {s["account"]: (s["active"], s["since"], s["until"]) for s in table(config, "subscriptions")}
    assert bounds == {
        "bob": (True, None, None),
        "carol": (True, datetime.fromtimestamp((T0 + 5) / 1e6, timezone.utc),
                  datetime.fromtimestamp((T0 + 8) / 1e6, timezone.utc)),
    }


def test_main_help_explains_the_job(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--config" in text and "Delta" in text and "SIGTERM" in text


# -- expiry and Trash


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def rows_of(config, name):
    path = config.table_path(name)
    return table(config, name) if DeltaTable.is_deltatable(path) else []


def with_ticks(config, tick_interval_s: float):
    """``config`` with the job's regular ticks ``tick_interval_s`` apart."""
    return dataclasses.replace(config, streaming=dataclasses.replace(config.streaming, tick_interval_s=tick_interval_s))


def ticking_job(spark, config, sink):
    """The job started, once its first (tick) batch ran: that batch is slow (Spark warms up), and the
    tests' clocks start after it."""
    query = build_query(spark, config, "0.1 seconds", sink=sink, metrics=False)
    try:
        wait_for(lambda: any(isinstance(e, ev.Progress) for _, e in deliveries_topic(config, 1, 90)), 90,
                 "the first tick batch")
    except BaseException:
        query.stop()
        raise
    return query


def test_a_five_second_timeout_expires_into_the_trash_by_ticks_and_a_restart_adds_no_row(spark, config, sink):
    """Bob subscribed, then went offline: nothing acknowledges message 1, and no command arrives after
    it; the job's ticks alone expire it 5 s later into ``/t/x/Trash``.  A message nobody subscribed to
    goes there too; an acknowledged one and a state message never do.

    5 s, not less: the batch that routes message 1 must read it before it expires, or bob is never
    sent it (no Deliver), and on a slow machine the batch running when it is published took 1.8 s."""
    config = with_ticks(config, 0.25)
    query = ticking_job(spark, config, sink)
    try:
        start = time.time_ns() // 1000
        five_s = start + 5_000_000
        produce(config, [
            ev.Subscribe("bob", "gb", "/t/*", start),
            ev.Publish(1, "/t/x", "c1", "alice", "ga", start + 1, expires_at=five_s),
            ev.Publish(2, "/t/x", "c2", "alice", "ga", start + 2),  # state message
            ev.Publish(3, "/t/x", "c3", "alice", "ga", start + 3, expires_at=five_s),
            ev.Publish(4, "/u", "c4", "alice", "ga", start + 4, expires_at=five_s),  # no subscriber
            ev.Ack("bob", "gb", 3, start + 5),
        ])
        trash = wait_for(lambda: len(rows_of(config, "trash")) == 2 and rows_of(config, "trash"), 60,
                         "two messages in the trash table")
        assert query.ticker.sent >= 1
    finally:
        query.stop()
    assert time.time_ns() // 1000 >= five_s
    assert sorted((t["smuid"], t["topic"], t["trash_topic"], t["reason"], t["publisher"], t["cmuid"])
                  for t in trash) == [(1, "/t/x", "/t/x/Trash", "expired", "alice", "c1"),
                                      (4, "/u", "/u/Trash", "undeliverable", "alice", "c4")]
    expires = datetime.fromtimestamp(five_s / 1e6, timezone.utc)
    assert all(t["trashed_at"] >= expires for t in trash)
    assert sorted((d["account"], d["smuid"], d["status"]) for d in table(config, "deliveries") + rows_of(config, "unrouted")) == [
        ("", 4, "expired"), ("bob", 1, "expired"), ("bob", 2, "pending"), ("bob", 3, "acked")]
    assert {m["smuid"]: m["expires_at"] for m in table(config, "messages")} == {
        1: expires, 2: None, 3: expires, 4: expires}
    # the gateways are told to drop it from their books, after its Deliver
    def delivered_then_dropped():
        out = [e for _, e in deliveries_topic(config, at_least=1)]
        one = [type(e).__name__ for e in out if isinstance(e, (ev.Deliver, ev.Acked)) and e.smuid == 1]
        return one == ["Deliver", "Acked"] and out

    out = wait_for(delivered_then_dropped, 30, "Deliver then Acked of message 1 on the deliveries topic")

    # restart on the same checkpoint: more ticks, more batches, no new Trash row
    ticks_before = len([e for e in out if isinstance(e, ev.Progress)])
    query = build_query(spark, config, "0.1 seconds", sink=sink, metrics=False)
    try:
        wait_for(lambda: len([e for _, e in deliveries_topic(config, at_least=1) if isinstance(e, ev.Progress)])
                 > ticks_before + 2, 60, "batches after the restart")
    finally:
        query.stop()
    assert len(table(config, "trash")) == 2
    assert sorted((d["account"], d["smuid"], d["status"]) for d in table(config, "deliveries") + rows_of(config, "unrouted")) == [
        ("", 4, "expired"), ("bob", 1, "expired"), ("bob", 2, "pending"), ("bob", 3, "acked")]


def test_a_delivery_expires_at_its_own_time_not_at_the_next_regular_tick(spark, config, sink):
    """The regular ticks are five minutes apart here; the alarm the sink sets when it routes message 1
    brings a tick of its own when it expires, so it is in the Trash long before the next regular one."""
    config = with_ticks(config, 300)
    query = ticking_job(spark, config, sink)
    try:
        start = time.time_ns() // 1000
        produce(config, [ev.Subscribe("bob", "gb", "/t/*", start),
                         ev.Publish(1, "/t/x", "c1", "alice", "ga", start + 1, expires_at=start + 3_000_000)])
        trash = wait_for(lambda: rows_of(config, "trash"), 40, "message 1 in the trash table")
        assert query.ticker.sent >= 2  # the first regular tick, and the alarm's
    finally:
        query.stop()
    assert [(t["smuid"], t["reason"]) for t in trash] == [(1, "expired")]


def test_a_commit_failing_beside_another_fails_its_batch_once_both_ended_and_the_replay_commits_each_once(
        spark, config, sink, monkeypatch):
    """``messages`` is committed beside the Trash and then deliveries (``DeltaCommits._beside``).  When
    the Trash's commit fails, deliveries are not committed, and the batch fails only after the
    ``messages`` commit beside it has landed: its replay, started at once, must never run beside a
    commit of the batch it replays."""
    sink(batch_frame(spark, [ev.Subscribe("bob", "gb", "/t", T0)]), 0)
    frame = batch_frame(spark, [ev.Publish(1, "/t", "c1", "alice", "ga", T0 + 1, expires_at=T0 + 50),
                                ev.Publish(2, "/t", "c2", "alice", "ga", T0 + 2), ev.Tick(T0 + 60)], 3)
    real_trash, real_messages = CommandSink._commit_trash, CommandSink._commit_messages

    def trash_fails(self, rows, batch_id):
        raise OSError("the disk refused the Trash")

    def messages_slowly(self, rows, batch_id):
        time.sleep(1.0)
        return real_messages(self, rows, batch_id)

    monkeypatch.setattr(CommandSink, "_commit_trash", trash_fails)
    monkeypatch.setattr(CommandSink, "_commit_messages", messages_slowly)
    with pytest.raises(OSError, match="refused the Trash"):
        sink(frame, 1)
    assert sorted(m["smuid"] for m in table(config, "messages")) == [1, 2]  # landed before the batch failed
    assert not table(config, "trash") and not table(config, "deliveries")
    monkeypatch.setattr(CommandSink, "_commit_trash", real_trash)
    monkeypatch.setattr(CommandSink, "_commit_messages", real_messages)
    sink(frame, 1)
    sink(frame, 1)
    assert sorted(m["smuid"] for m in table(config, "messages")) == [1, 2]
    assert [(t["smuid"], t["account"]) for t in table(config, "trash")] == [(1, "")]  # the message, as a whole
    assert sorted((d["smuid"], d["status"]) for d in table(config, "deliveries")) == [(1, "expired"), (2, "pending")]


def test_expiry_replayed_after_a_crash_between_trash_and_deliveries_trashes_once(spark, config, sink, monkeypatch):
    sink(batch_frame(spark, [ev.Subscribe("bob", "gb", "/t", T0),
                             ev.Publish(1, "/t", "c1", "alice", "ga", T0 + 1, expires_at=T0 + 100),
                             ev.Publish(2, "/u", "c2", "alice", "ga", T0 + 2, expires_at=T0 + 100)]), 0)
    assert sorted((d["account"], d["smuid"], d["status"]) for d in table(config, "deliveries") + table(config, "unrouted")) == [
        ("", 2, "unrouted"), ("bob", 1, "pending")]
    ticks = batch_frame(spark, [ev.Tick(T0 + 99), ev.Tick(T0 + 100)], 3)
    real = CommandSink._commit_deliveries

    def crash(self, frame, batch_id, own, name="deliveries"):
        raise RuntimeError(f"crash before the {name} commit")

    monkeypatch.setattr(CommandSink, "_commit_deliveries", crash)
    with pytest.raises(RuntimeError, match="crash"):
        sink(ticks, 1)
    assert sorted(t["smuid"] for t in table(config, "trash")) == [1, 2]  # committed before the crash
    monkeypatch.setattr(CommandSink, "_commit_deliveries", real)
    sink(ticks, 1)  # the replay: the trash commit is skipped, the deliveries commit done
    sink(ticks, 1)  # and once more: everything committed already
    sink(batch_frame(spark, [ev.Tick(T0 + 200)], 5), 2)  # later ticks find nothing left to expire
    assert sorted(t["smuid"] for t in table(config, "trash")) == [1, 2]
    assert sorted((d["account"], d["smuid"], d["status"]) for d in table(config, "deliveries") + table(config, "unrouted")) == [
        ("", 2, "expired"), ("bob", 1, "expired")]
    acked = [e for _, e in deliveries_topic(config, at_least=1) if isinstance(e, ev.Acked)]
    assert acked and {(e.account, e.smuid) for e in acked} == {("bob", 1)}


def _last_merge(config, name):
    """The operation metrics of the newest MERGE into table ``name``."""
    return next(c["operationMetrics"] for c in DeltaTable(config.table_path(name)).history()
                if c["operation"] == "MERGE")


def test_a_batch_rewrites_the_deliveries_its_acks_change_not_every_earlier_one(spark, config, sink):
    """Each batch brings new deliveries and ACKs the last batch's.  Merged in one commit, the new
    rows went into the file the ACKs rewrote, so every batch rewrote the whole table: its commit grew
    with the history (``python -m deploy.sink_bench --expiring``: 31 ms at 5,600 rows, 109 ms at
    81,000, every row copied each time).  A batch's commit must cost what the batch changes."""
    sink(batch_frame(spark, [ev.Subscribe("bob", "gb", "/t", T0)]), 0)
    per_batch, offset = 20, 1
    for batch in range(1, 7):
        first = batch * per_batch
        events = [ev.Publish(s, "/t", f"c{s}", "alice", "ga", T0 + s) for s in range(first, first + per_batch)]
        events += [ev.Ack("bob", "gb", s, T0 + first + per_batch) for s in range(first - per_batch, first)
                   if batch > 1]
        sink(batch_frame(spark, events, offset), batch)
        offset += len(events)
    metrics = _last_merge(config, "deliveries")
    assert metrics["num_target_rows_updated"] == per_batch  # the ACKed ones
    assert metrics["num_target_rows_copied"] == 0  # and none of the four batches' before them
    statuses = sorted((d["smuid"], d["status"]) for d in table(config, "deliveries"))
    assert statuses == [(s, "acked") for s in range(20, 120)] + [(s, "pending") for s in range(120, 140)]


def test_a_batch_failing_between_its_new_deliveries_and_its_merge_is_replayed_with_each_row_once(
        spark, config, sink, monkeypatch):
    """A batch's new deliveries are appended before its merge of the rest (``_fresh``), without its
    app transaction.  When the merge fails, the replay removes what the append left, so it routes
    from the tables as they were, and every delivery is stored once."""
    sink(batch_frame(spark, [ev.Subscribe("bob", "gb", "/t", T0)]), 0)
    sink(batch_frame(spark, [ev.Publish(s, "/t", f"c{s}", "alice", "ga", T0 + s) for s in (1, 2, 3)], 1), 1)
    second = batch_frame(spark, [ev.Publish(s, "/t", f"c{s}", "alice", "ga", T0 + s) for s in (4, 5, 6)]
                         + [ev.Ack("bob", "gb", s, T0 + 10) for s in (1, 2, 3)], 4)
    real_merge = DeltaTable.merge

    def merge_fails(self, *args, **kwargs):
        raise OSError("the disk refused the merge")

    monkeypatch.setattr(DeltaTable, "merge", merge_fails)
    with pytest.raises(OSError, match="refused the merge"):
        sink(second, 2)
    monkeypatch.setattr(DeltaTable, "merge", real_merge)
    left = sorted((d["smuid"], d["status"]) for d in table(config, "deliveries"))
    assert left == [(1, "pending"), (2, "pending"), (3, "pending"), (4, "pending"), (5, "pending"), (6, "pending")]
    sink(second, 2)
    sink(second, 2)
    assert sorted((d["smuid"], d["status"]) for d in table(config, "deliveries")) == [
        (1, "acked"), (2, "acked"), (3, "acked"), (4, "pending"), (5, "pending"), (6, "pending")]
