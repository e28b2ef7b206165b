"""transformWithState against foreachBatch SQL for per-subscriber delivery state, measured side by side.

    python -m deploy.tws_probe [--seconds 60] [--rounds 2] [--rate 1000] [--trigger-ms 200]

A prototype, not part of the job: does Spark 4's stateful operator (``groupBy(key).transformWithState``,
row-based :class:`~pyspark.sql.streaming.StatefulProcessor` with processing-time timers) keep the
routing job's per-subscriber queue state for less per micro-batch than the job's way, one
``spark.sql`` per batch in foreachBatch over the batch and the stored state?  The routing rule is
trivial on purpose (a publish names its subscribers), so what is measured is the operator's fixed
and per-row cost.

A scratch Kafka node (:func:`deploy.broker.scratch_broker`, 127.0.0.1) holds one topic; a producer
thread appends ``--rate`` JSON events a second to it for the whole run:

- ``{"type": "publish", "smuid", "priority", "timeout_ms", "to": [accounts], "at"}`` — each to
  ``--fanout`` of ``--accounts`` subscribers;
- ``{"type": "ack", "smuid", "account", "at"}`` — ``--ack-ratio`` of the deliveries, ``--ack-delay-ms``
  after their publish; the others expire ``timeout_ms`` after it.

Spark's built-in Kafka source reads it (``startingOffsets=latest``, at most ``--max-batch`` records a
batch, a ``--trigger-ms`` processing-time trigger) on the job's own session
(:func:`streaming.session.build_session`, local[2], one shuffle partition, RocksDB state store).
Three queries, one after the other in each of ``--rounds`` alternating rounds (this host's speed
drifts about 2x from minute to minute), each from a fresh checkpoint for ``--seconds / --rounds``:

- ``tws``: ``groupBy("account").transformWithState(PendingDeliveries())`` into the ``noop`` sink:
  MapState smuid -> (priority, expires_at) per subscriber, a timer at each expires_at, rows
  deliver / acked / expired out;
- ``tws-fb``: the same operator, its rows collected to Arrow in foreachBatch (as the job would
  have to, to write Delta with delta-rs and deliveries to Kafka);
- ``sql``: foreachBatch as the job does it: the batch's commands to Arrow, then one ``spark.sql``
  over them and the pending deliveries (an Arrow table kept on the driver, the job's Delta table's
  stand-in), collected to Arrow; the ``pending`` rows of the result are the next batch's state.

Each query's ``recentProgress`` gives every micro-batch's ``durationMs`` (triggerExecution,
addBatch, queryPlanning …); the ``sql`` query also times its own planning inside addBatch (analysis
at ``spark.sql``, optimisation and physical planning forced through ``queryExecution().executedPlan``).
The first ``--warmup`` batches of each query are left out.  The script prints p50 / p90 / p99 per
variant and writes ``bench-results/tws-probe-<date>[-<name>].json``; docs/transform-with-state.md
reads the figures.  Stopping a foreachBatch query mid-batch (here, at the end of each one) may
print a ``StackOverflowError`` (regex frames) from its stream thread: after its last batch, harmless
to the figures.

PySpark's transformWithState needs pandas (>= 2.2; ``pandas_udf`` checks for it even for the
row-based API) and protobuf (its state-API messages) in the interpreter: neither is a dependency of
this project, so install them into the virtualenv to run this probe
(``pip install "pandas>=2.2,<3" protobuf``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from deploy.compare_report import percentile

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "tws-probe.commands"
VARIANTS = ("tws", "tws-fb", "sql")

#: A command as the producer writes it (JSON); ``to`` for a publish, ``account`` for an ACK.
EVENT_DDL = "type string, smuid long, priority int, timeout_ms long, `to` array<string>, account string, at long"
#: One row per (subscriber, command): what both variants start from.
COMMAND_COLUMNS = ("account", "type", "smuid", "priority", "expires_at")
#: What both variants emit: a delivery routed, acknowledged or expired.
OUTPUT_DDL = "account string, smuid long, event string, priority int, expires_at long"


# --- transformWithState ----------------------------------------------------------------------------

def _processor(delete_timers: bool = False):
    """A :class:`PendingDeliveries`, defined on first use: importing its base class needs pyspark's
    streaming package (and the probe's ``--help`` should not)."""
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    class PendingDeliveries(StatefulProcessor):
        """One subscriber's (the grouping key's) deliveries not yet acknowledged, each expiring by a timer.

        State: ``pending``, a MapState smuid -> (priority, expires_at ms).  A publish adds an entry and
        registers a processing-time timer at its expires_at; an ACK removes the entry (its timer stays:
        a timer is one per key and millisecond, so deleting it would also cancel another delivery due
        the same millisecond); a timer that fires expires every entry due by then, so a stale one finds
        nothing.  Out: one row per event.  ``delete_timers`` (measured as a variation, not correct in
        general): an ACK deletes its timer, so fewer fire."""

        def init(self, handle: StatefulProcessorHandle) -> None:
            self.handle = handle
            self.pending = handle.getMapState("pending", "smuid long", "priority int, expires_at long")

        def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
            (account,) = key
            # rows of one key come in no particular order: a batch's publishes before its ACKs
            publishes, acks = [], []
            for row in rows:
                (publishes if row.type == "publish" else acks).append(row)
            for row in publishes:
                self.pending.updateValue((row.smuid,), (row.priority, row.expires_at))
                if row.expires_at is not None:
                    self.handle.registerTimer(row.expires_at)
                yield Row(account=account, smuid=row.smuid, event="deliver", priority=row.priority,
                          expires_at=row.expires_at)
            for row in acks:
                held = self.pending.getValue((row.smuid,))
                if held is not None:
                    self.pending.removeKey((row.smuid,))
                    if delete_timers and held[1] is not None:
                        self.handle.deleteTimer(held[1])
                    yield Row(account=account, smuid=row.smuid, event="acked", priority=held[0], expires_at=held[1])

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:
            (account,) = key
            due = expiredTimerInfo.getExpiryTimeInMs()
            expired = [(smuid, priority, expires_at) for (smuid,), (priority, expires_at) in self.pending.iterator()
                       if expires_at is not None and expires_at <= due]
            for smuid, priority, expires_at in expired:
                self.pending.removeKey((smuid,))
                yield Row(account=account, smuid=smuid, event="expired", priority=priority, expires_at=expires_at)

        def close(self) -> None:
            pass

    return PendingDeliveries()


# --- foreachBatch SQL ------------------------------------------------------------------------------

#: The batch's work as one query, as ``streaming.sink.query.batch_sql`` does it for the job: relations
#: ``{commands}`` (the batch, COMMAND_COLUMNS) and ``{pending}`` (the stored deliveries), the
#: batch's clock ``{now}``; one row per event out, and ``pending`` rows: the state after the batch.
BATCH_SQL = """
WITH routed AS (SELECT account, smuid, priority, expires_at FROM {commands} WHERE type = 'publish'),
acks AS (SELECT DISTINCT account, smuid FROM {commands} WHERE type = 'ack'),
queued AS (SELECT * FROM {pending} UNION ALL SELECT * FROM routed),
acked AS (SELECT q.* FROM queued q LEFT SEMI JOIN acks a ON q.account = a.account AND q.smuid = a.smuid),
unacked AS (SELECT q.* FROM queued q LEFT ANTI JOIN acks a ON q.account = a.account AND q.smuid = a.smuid),
expired AS (SELECT * FROM unacked WHERE expires_at <= {now}),
kept AS (SELECT * FROM unacked WHERE expires_at IS NULL OR expires_at > {now})
SELECT account, smuid, 'deliver' AS event, priority, expires_at FROM routed
UNION ALL SELECT account, smuid, 'acked', priority, expires_at FROM acked
UNION ALL SELECT account, smuid, 'expired', priority, expires_at FROM expired
UNION ALL SELECT account, smuid, 'pending', priority, expires_at FROM kept
"""


class SqlBatch:
    """The ``sql`` variant's foreachBatch function; ``timings[batch_id]``: its own split of addBatch."""

    def __init__(self, spark):
        import pyarrow as pa

        self.spark = spark
        self.pending = pa.table({"account": pa.array([], pa.string()), "smuid": pa.array([], pa.int64()),
                                 "priority": pa.array([], pa.int32()), "expires_at": pa.array([], pa.int64())})
        self.timings: dict[int, dict[str, float]] = {}
        self.events: Counter = Counter()

    def __call__(self, batch, batch_id: int) -> None:
        import pyarrow.compute as pc

        started = time.perf_counter()
        commands = batch.toArrow()  # the job collects its records first too (streaming.sink.decoding.decode_records)
        read = time.perf_counter()
        now = int(time.time() * 1000)
        query = self.spark.sql(BATCH_SQL, commands=self.spark.createDataFrame(commands),
                               pending=self.spark.createDataFrame(self.pending), now=now)
        analysed = time.perf_counter()
        query._jdf.queryExecution().executedPlan()  # optimised and planned: toArrow reuses it
        planned = time.perf_counter()
        out = query.toArrow()
        done = time.perf_counter()
        is_pending = pc.equal(out["event"], "pending")
        self.pending = out.filter(is_pending).select(["account", "smuid", "priority", "expires_at"])
        self.events.update(out.filter(pc.invert(is_pending))["event"].to_pylist())
        self.timings[batch_id] = {"read_ms": (read - started) * 1e3, "analysis_ms": (analysed - read) * 1e3,
                                  "plan_ms": (planned - analysed) * 1e3, "execute_ms": (done - planned) * 1e3,
                                  "pending": self.pending.num_rows}


class CollectBatch:
    """The ``tws-fb`` variant's foreachBatch function: the operator's rows to Arrow, counted."""

    def __init__(self):
        self.events: Counter = Counter()
        self.timings: dict[int, dict[str, float]] = {}

    def __call__(self, batch, batch_id: int) -> None:
        started = time.perf_counter()
        out = batch.toArrow()
        self.events.update(out["event"].to_pylist())
        self.timings[batch_id] = {"collect_ms": (time.perf_counter() - started) * 1e3}


# --- the load --------------------------------------------------------------------------------------

def _json(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


class Producer(threading.Thread):
    """``rate`` events a second into ``TOPIC`` until :meth:`stop`: ACKs when due, publishes otherwise."""

    def __init__(self, bootstrap: str, args: argparse.Namespace):
        super().__init__(name="tws-probe-producer", daemon=True)
        self.bootstrap, self.args = bootstrap, args
        self.stopping = threading.Event()
        self.sent: Counter = Counter()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # noqa: BLE001 - reported by main
            self.error = error

    def _run(self) -> None:
        from kafka import KafkaProducer

        args = self.args
        rng = random.Random(7)
        accounts = [f"acct{i:03d}" for i in range(args.accounts)]
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks=1, linger_ms=5)
        acks: deque[tuple[float, int, str]] = deque()  # (due, smuid, account), in due order
        smuid, tick = 0, 0.01
        per_tick = args.rate * tick
        owed, next_tick = 0.0, time.monotonic()
        try:
            while not self.stopping.is_set():
                owed += per_tick
                while owed >= 1:
                    owed -= 1
                    now_s = time.time()
                    at = int(now_s * 1000)  # each its own clock reading, as a gateway stamps each command
                    if acks and acks[0][0] <= now_s:
                        _, acked, account = acks.popleft()
                        producer.send(TOPIC, _json({"type": "ack", "smuid": acked, "account": account, "at": at}))
                        self.sent["ack"] += 1
                        continue
                    smuid += 1
                    to = rng.sample(accounts, args.fanout)
                    producer.send(TOPIC, _json({"type": "publish", "smuid": smuid, "priority": rng.randint(0, 9),
                                                "timeout_ms": args.timeout_ms, "to": to, "at": at}))
                    self.sent["publish"] += 1
                    for account in to:
                        if rng.random() < args.ack_ratio:
                            acks.append((now_s + args.ack_delay_ms / 1000, smuid, account))
                next_tick += tick
                delay = next_tick - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:  # fell behind (a busy host): do not burst to catch up by more than a second
                    next_tick = max(next_tick, time.monotonic() - 1)
        finally:
            producer.close(timeout=5)


# --- the queries -----------------------------------------------------------------------------------

def commands(spark, bootstrap: str, args: argparse.Namespace):
    """The topic as one row per (subscriber, command): a publish once per subscriber it names."""
    from pyspark.sql import functions as F

    records = (spark.readStream.format("kafka")
               .option("kafka.bootstrap.servers", bootstrap).option("subscribe", TOPIC)
               .option("startingOffsets", "latest").option("maxOffsetsPerTrigger", str(args.max_batch))
               .option("failOnDataLoss", "false").load())
    event = F.from_json(F.col("value").cast("string"), EVENT_DDL).alias("e")
    return (records.select(event).select("e.*")
            .select(F.explode(F.when(F.col("type") == "publish", F.col("to"))
                              .otherwise(F.array(F.col("account")))).alias("account"),
                    "type", "smuid", "priority",
                    F.when(F.col("timeout_ms") >= 0, F.col("at") + F.col("timeout_ms")).alias("expires_at")))


def start(variant: str, spark, bootstrap: str, checkpoint: str, args: argparse.Namespace):
    """The query of ``variant`` (:data:`VARIANTS`), started; and its foreachBatch function, if any."""
    stream = commands(spark, bootstrap, args)
    trigger = {"processingTime": f"{args.trigger_ms} milliseconds"}
    if variant == "sql":
        sink = SqlBatch(spark)
        writer = stream.writeStream.foreachBatch(sink)
    else:
        sink = CollectBatch() if variant == "tws-fb" else None
        routed = stream.groupBy("account").transformWithState(
            statefulProcessor=_processor(args.delete_timers), outputStructType=OUTPUT_DDL, outputMode="Append",
            timeMode="ProcessingTime")
        writer = routed.writeStream.outputMode("append")
        writer = writer.foreachBatch(sink) if sink else writer.format("noop")
    query = (writer.queryName(f"tws_probe_{variant.replace('-', '_')}")
             .option("checkpointLocation", checkpoint).trigger(**trigger).start())
    return query, sink


def run_segment(variant: str, spark, bootstrap: str, seconds: float, args: argparse.Namespace,
                scratch: str) -> dict:
    """One query of ``variant`` for ``seconds``: its batches (progress + the sink's own timings).

    Its checkpoint is a new directory in ``scratch``, which the caller removes once Spark stopped: the
    state store's maintenance thread may still upload a RocksDB snapshot after the query stopped."""
    checkpoint = tempfile.mkdtemp(prefix=f"{variant}-", dir=scratch)
    query = None
    try:
        query, sink = start(variant, spark, bootstrap, checkpoint, args)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and query.isActive:
            time.sleep(0.5)
        if query.exception() is not None:
            raise RuntimeError(f"{variant} query failed: {query.exception()}")
        query.stop()
        progress = [json.loads(p.json) for p in query.recentProgress]
    finally:
        if query is not None and query.isActive:
            with contextlib.suppress(Exception):
                query.stop()
    batches = []
    for p in progress:
        if "addBatch" not in p.get("durationMs", {}):  # a trigger that found nothing to run
            continue
        row = {"batch": p["batchId"], "rows": p.get("numInputRows", 0), **p.get("durationMs", {})}
        ops = p.get("stateOperators") or []
        if ops:
            op = ops[0]
            row["state_rows"] = op.get("numRowsTotal")
            row["state_commit_ms"] = op.get("commitTimeMs")
            row["state_update_ms"] = op.get("allUpdatesTimeMs")
            row["state_custom"] = op.get("customMetrics", {})
        if sink is not None:
            row.update(sink.timings.get(p["batchId"], {}))
        batches.append(row)
    return {"variant": variant, "seconds": seconds, "batches": batches,
            "events": dict(sink.events) if sink is not None else None}


# --- figures ---------------------------------------------------------------------------------------

def summary(segments: list[dict], warmup: int, target_ms: float) -> dict:
    """p50 / p90 / p99 of each duration over every segment's batches after the first ``warmup``."""
    batches = [b for s in segments for i, b in enumerate(sorted(s["batches"], key=lambda b: b["batch"]))
               if i >= warmup and b["rows"] > 0]
    figures: dict = {"batches": len(batches)}
    keys = ["triggerExecution", "addBatch", "queryPlanning", "latestOffset", "walCommit", "commitOffsets",
            "rows", "state_commit_ms", "state_update_ms", "read_ms", "analysis_ms", "plan_ms", "execute_ms",
            "collect_ms", "pending", "state_rows"]
    for key in keys:
        values = [b[key] for b in batches if b.get(key) is not None]
        if values:
            figures[key] = {"p50": percentile(values, 0.5), "p90": percentile(values, 0.9),
                            "p99": percentile(values, 0.99), "mean": round(statistics.fmean(values), 1)}
    total = sum(b.get("triggerExecution", 0) for b in batches)
    planning = sum(b.get("queryPlanning", 0) + b.get("analysis_ms", 0) + b.get("plan_ms", 0) for b in batches)
    figures["planning_share"] = round(planning / total, 3) if total else None
    figures["within_target"] = (round(sum(b.get("triggerExecution", 0) <= target_ms for b in batches) / len(batches), 3)
                                if batches else None)
    # batches grow when a variant falls behind: batch time = fixed + per-command cost x commands
    sizes = [b["rows"] for b in batches]
    if len(set(sizes)) > 1:
        fit = statistics.linear_regression(sizes, [b["triggerExecution"] for b in batches])
        figures["fit"] = {"fixed_ms": round(fit.intercept, 1), "ms_per_100_commands": round(fit.slope * 100, 1),
                          "at_1000_ms": round(fit.intercept + fit.slope * 1000, 1)}
    rows = sum(sizes)
    figures["rows_per_s"] = round(rows / (total / 1000), 1) if total else None  # processing rate while busy
    events = Counter()
    for s in segments:
        events.update(s["events"] or {})
    figures["events"] = dict(events) or None
    return figures


def loadavg() -> list[float]:
    with contextlib.suppress(OSError):
        return [round(x, 2) for x in os.getloadavg()]
    return []


def _fmt(figure: dict | None, key: str) -> str:
    if not figure or key not in figure:
        return "      -"
    return f"{figure[key]:7.0f}"


def print_table(summaries: dict[str, dict]) -> None:
    print(f"\n{'variant':8} {'batches':>7} {'measure':>16} {'p50':>7} {'p90':>7} {'p99':>7}   (ms)")
    for variant, figures in summaries.items():
        first = True
        for key in ("triggerExecution", "addBatch", "queryPlanning", "analysis_ms", "plan_ms", "execute_ms",
                    "read_ms", "collect_ms", "state_update_ms", "state_commit_ms", "rows"):
            figure = figures.get(key)
            if not figure:
                continue
            print(f"{variant if first else '':8} {figures['batches'] if first else '':>7} {key:>16} "
                  f"{_fmt(figure, 'p50')} {_fmt(figure, 'p90')} {_fmt(figure, 'p99')}")
            first = False
        print(f"{'':8} {'':>7} {'planning share':>16} {figures.get('planning_share')}; "
              f"batches <= target: {figures.get('within_target')}; commands/s while busy: {figures.get('rows_per_s')}")
        print(f"{'':8} {'':>7} {'fit':>16} {figures.get('fit')}; events: {figures.get('events')}")


# --- main ------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.tws_probe", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60, help="running time of each variant, over all rounds")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (each variant once per round)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--rate", type=int, default=1000, help="events a second appended to the topic")
    parser.add_argument("--trigger-ms", type=int, default=200, help="processing-time trigger interval")
    parser.add_argument("--max-batch", type=int, default=1000, help="maxOffsetsPerTrigger: commands per batch at most")
    parser.add_argument("--accounts", type=int, default=50, help="subscribers (the operator's keys)")
    parser.add_argument("--fanout", type=int, default=2, help="subscribers each publish names")
    parser.add_argument("--ack-ratio", type=float, default=0.8, help="share of deliveries acknowledged")
    parser.add_argument("--ack-delay-ms", type=int, default=300, help="an ACK's delay after its publish")
    parser.add_argument("--timeout-ms", type=int, default=2000, help="a publish's Timeout (-1: never expires)")
    parser.add_argument("--warmup", type=int, default=10, help="first batches of each query left out")
    parser.add_argument("--target-ms", type=float, default=300, help="batch-time target the summary counts against")
    parser.add_argument("--changelog", action=argparse.BooleanOptionalAction, default=True,
                        help="RocksDB changelog checkpointing (instead of a snapshot upload every batch)")
    parser.add_argument("--delete-timers", action="store_true",
                        help="an ACK deletes its delivery's timer (fewer timers fire; wrong when two share a ms)")
    parser.add_argument("--log-level", default="ERROR", help="Spark's log level during the run")
    parser.add_argument("--name", default="", help="suffix of the JSON's name (tws-probe-<date>-<name>.json)")
    parser.add_argument("--out", default=str(ROOT / "bench-results"), help="directory for the JSON result")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := set(variants) - set(VARIANTS):
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")

    # a SIGTERM ends the run through the finally blocks below: the Kafka node and Spark stop too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from kafka.admin import KafkaAdminClient, NewTopic
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    import pyspark
    from deploy.broker import scratch_broker
    from schemas.config import StreamingConfig
    from streaming.session import build_session

    require_minimum_pandas_version()  # transformWithState's pandas_udf wrapper, before a Kafka node starts
    import google.protobuf  # noqa: F401 - its state API's messages

    conf = {
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": str(args.changelog).lower(),
        "spark.sql.streaming.numRecentProgressUpdates": "5000",
    }
    segments: list[dict] = []
    load = {"before": loadavg()}
    started = datetime.now(timezone.utc)
    with (scratch_broker() as broker,
          tempfile.TemporaryDirectory(prefix="tws-probe-", ignore_cleanup_errors=True) as scratch):
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="tws-probe")
        try:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
            admin.wait_for_topics([TOPIC], timeout_ms=30000)
        finally:
            admin.close()
        producer = Producer(broker.bootstrap, args)
        spark = None
        try:
            producer.start()
            spark = build_session(StreamingConfig(spark_conf=conf), app_name="tws-probe")
            spark.sparkContext.setLogLevel(args.log_level)
            seconds = args.seconds / args.rounds
            for round_ in range(args.rounds):
                order = variants if round_ % 2 == 0 else variants[::-1]
                for variant in order:
                    before = loadavg()
                    print(f"round {round_ + 1}/{args.rounds}: {variant} for {seconds:.0f} s (load {before})",
                          flush=True)
                    segment = run_segment(variant, spark, broker.bootstrap, seconds, args, scratch)
                    segment.update(round=round_, load_before=before, load_after=loadavg())
                    segments.append(segment)
                    if producer.error is not None:
                        raise RuntimeError(f"producer failed: {producer.error!r}")
            effective = {key: spark.conf.get(key) for key in conf}
        finally:
            producer.stop()
            if spark is not None:
                spark.stop()
    load["after"] = loadavg()
    summaries = {v: summary([s for s in segments if s["variant"] == v], args.warmup, args.target_ms)
                 for v in variants}
    print_table(summaries)
    print(f"\nload average before {load['before']}, after {load['after']}; produced {dict(producer.sent)}")

    result = {
        "what": "transformWithState (row-based StatefulProcessor, MapState + processing-time timers) against "
                "foreachBatch + one spark.sql over the batch and the pending deliveries; per-batch durationMs",
        "started": started.isoformat(timespec="seconds"), "args": vars(args), "spark_conf": effective,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "pyspark": pyspark.__version__,
                 "load_average": load},
        "produced": dict(producer.sent), "summary": summaries, "segments": segments,
    }
    out = Path(args.out) / f"tws-probe-{started:%Y-%m-%d}{'-' + args.name if args.name else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
