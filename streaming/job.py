"""The routing job: ``smqp.commands`` → routing → ``smqp.deliveries`` + Delta tables.

Run it with ``python -m streaming.job [--config smqp.toml]`` (or ``smqp-router``),
or on a Spark cluster with ``deploy/spark-submit.sh --master spark://host:7077``
(spark-submit runs this file; see ``deploy/cluster.md``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from schemas.config import SMQPConfig, load_config
from schemas.spark import KAFKA_RECORD
from streaming import EXIT_REFUSED
from streaming.metrics import attach_metrics, flush_metrics, parse_offsets
from streaming.session import build_session, is_local_path, use_local_checkpoint_writes
from streaming.sink import CommandSink
from streaming.ticker import Ticker
from streaming.warm_up import warm_up

log = logging.getLogger("streaming.job")

#: ``kafka.fetch.max.wait.ms`` of Spark's Kafka source (see :func:`source_options`).
KAFKA_SOURCE_FETCH_WAIT_MS = 5


def source_options(config: SMQPConfig) -> tuple[str, dict[str, str]]:
    """The stream reader's format and options for ``[streaming] source``.

    ``"python"``: our ``smqp_kafka`` source (kafka-python on the driver; no jars).
    ``"kafka"``: Spark's built-in Kafka source, which needs the spark-sql-kafka
    jars on the cluster (``--packages`` / ``--jars``).  Both read every
    partition of the commands topic from the earliest offset, at most
    ``max_records_per_batch`` records per micro-batch, and emit the same
    columns (``schemas.spark.KAFKA_RECORD``).  ``failOnDataLoss``: a batch whose
    offsets retention already deleted fails the query instead of skipping
    commands silently — as ``smqp_kafka``'s replay does.
    """
    kafka, streaming = config.kafka, config.streaming
    if streaming.source == "kafka":
        return "kafka", {
            "kafka.bootstrap.servers": kafka.bootstrap,
            "subscribe": kafka.commands_topic,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": str(streaming.max_records_per_batch),
            "failOnDataLoss": "true",
            "includeHeaders": "false",
            # The executor's consumer, pooled across batches, leaves a prefetch at the broker after
            # each task; the next batch's fetch waits behind it, up to fetch.max.wait.ms (Kafka's
            # default 500).  A quiet micro-batch of 2 records reached the driver in 224 ms (p50)
            # with it, 98 with 50, 60 with 10, 46 with 1 (``python -m deploy.kafka_source_probe``).
            # The offsets a batch reads are already in the log, so no fetch ever waits for data.
            "kafka.fetch.max.wait.ms": str(KAFKA_SOURCE_FETCH_WAIT_MS),
        }
    options = {
        "bootstrap": kafka.bootstrap,
        "topic": kafka.commands_topic,
        "maxRecordsPerBatch": str(streaming.max_records_per_batch),
        "maxRecordsPerQueryBatch": str(streaming.max_records_per_query_batch),
        "pollTimeoutMs": str(streaming.poll_timeout_ms),
        "deferWhileBusyMs": str(round(streaming.defer_while_busy_s * 1000)),
        "busyGapMs": str(streaming.busy_gap_ms),
        "busyRate": str(streaming.busy_rate),
    }
    return "smqp_kafka", options


def checkpoint_source(checkpoint_dir: str) -> str | None:
    """The ``[streaming] source`` that began the checkpoint at ``checkpoint_dir`` ("kafka" or "python"),
    told by the form of its last offsets; None for a checkpoint that holds none yet (or one not on a
    local path, which is not looked at).

    Spark's offset log keeps each source's offsets in that source's own JSON (its third line), the two
    forms :func:`streaming.metrics.parse_offsets` reads: Spark's Kafka source names the topic, ours
    does not.  Neither source reads the other's."""
    batch = last_checkpoint_batch(checkpoint_dir)
    if batch is None:
        return None
    lines = Path(urlparse(checkpoint_dir).path, "offsets", str(batch)).read_text().splitlines()
    positions = parse_offsets(lines[2]) if len(lines) > 2 else {}  # {}: half written, Spark's recovery decides
    if not positions:
        return None
    return "python" if any(topic is None for topic, _ in positions) else "kafka"


def last_checkpoint_batch(checkpoint_dir: str) -> int | None:
    """The newest batch id in the offset log of the checkpoint at ``checkpoint_dir``: the last batch
    the query began (None: none yet, or a checkpoint not on a local path, which is not looked at)."""
    if not is_local_path(checkpoint_dir):
        return None
    offsets = Path(urlparse(checkpoint_dir).path, "offsets")
    if not offsets.is_dir():
        return None
    return max((int(path.name) for path in offsets.iterdir() if path.name.isdigit()), default=None)


class CheckpointMismatch(RuntimeError):
    """The job's Delta tables were written by batches its checkpoint never began."""


def ensure_checkpoint_wrote_tables(config: SMQPConfig, sink: CommandSink) -> None:
    """Refuse to start on a checkpoint that is not the one that wrote the tables.

    Why: the tables' app transactions ``(query:table, batch id)`` make a replayed batch write nothing
    twice, by its batch id.  A new checkpoint (one deleted, or moved) beside tables that hold batch N
    numbers its batches from 0 again: each up to N would be taken for one already committed and
    skipped, its messages lost, and later ones would route the start of the commands topic again.
    The sink commits a batch before Spark records it done, so the tables are never more than the
    checkpoint's last begun batch ahead.  A checkpoint not on a local path is not looked at."""
    if not is_local_path(config.checkpoint_dir):
        return
    committed, begun = sink.last_committed_batch(), last_checkpoint_batch(config.checkpoint_dir)
    if committed is None or (begun is not None and committed <= begun):
        return
    where = "has no batch" if begun is None else f"ends at batch {begun}"
    raise CheckpointMismatch(
        f"the Delta tables under {config.table_path('')} hold batch {committed} of query "
        f"{config.streaming.query_name!r}, but its checkpoint {config.checkpoint_dir} {where}: it is not the "
        "checkpoint that wrote them, and its batches would be taken for ones already committed (their "
        "commands lost). Restore that checkpoint. If the commands topic holds none of the commands the tables "
        "have (a new Kafka log), go on under another [streaming] query_name instead (SMQP_STREAMING_QUERY_NAME): "
        "a new checkpoint, reading the topic from its start, whose batches the tables count apart. Else start "
        "on a new data dir.")


def with_checkpoint_source(config: SMQPConfig) -> SMQPConfig:
    """``config``, but reading with the source its checkpoint began with, if that is the other one
    (:func:`checkpoint_source`): a checkpoint keeps its source, so a data dir whose setting (or
    default) changed goes on from where the job stopped.  ``source`` applies to a new data dir, not to
    a new checkpoint beside old tables, whose app transactions count the old one's batches."""
    began = checkpoint_source(config.checkpoint_dir)
    if began is None or began == config.streaming.source:
        return config
    log.warning("checkpoint %s was begun by the %r commands source: reading on with it, not %r "
                "([streaming] source applies to a new data dir)",
                config.checkpoint_dir, began, config.streaming.source)
    return replace(config, streaming=replace(config.streaming, source=began))


def read_commands(spark: SparkSession, config: SMQPConfig) -> DataFrame:
    """The commands topic as a stream with exactly the ``KAFKA_RECORD`` columns."""
    source, options = source_options(config)
    records = spark.readStream.format(source).options(**options).load()
    return records.select(*KAFKA_RECORD.fieldNames())


def build_query(spark: SparkSession, config: SMQPConfig, trigger_interval: str | None = None, *,
                available_now: bool = False, sink: CommandSink | None = None,
                metrics: bool = True) -> StreamingQuery:
    """Start the routing query: commands source (:func:`source_options`) → :class:`CommandSink` in foreachBatch.

    ``trigger_interval`` overrides ``config.streaming.trigger_interval``;
    ``available_now=True`` processes what the topic holds now and stops.
    Pass ``sink`` to keep a handle on it (its ``close()`` releases the producer).
    ``metrics`` records every micro-batch's progress to the ``metrics`` Delta
    table (:mod:`streaming.metrics`).  Unless ``available_now``, a
    :class:`~streaming.ticker.Ticker` (``query.ticker``) appends the job's clock
    to the commands topic every ``streaming.tick_interval_s`` while the query runs, and
    whenever a delivery the sink routed expires.
    """
    config = with_checkpoint_source(config)
    use_local_checkpoint_writes(spark, config.checkpoint_dir)
    streaming = config.streaming
    records = read_commands(spark, config)
    sink = sink or CommandSink(config)
    ensure_checkpoint_wrote_tables(config, sink)
    writer = (
        records.writeStream.queryName(streaming.query_name)
        .foreachBatch(sink)
        .option("checkpointLocation", config.checkpoint_dir)
    )
    if metrics:
        attach_metrics(spark, config)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=trigger_interval or streaming.trigger_interval)
    query = writer.start()
    if not available_now and streaming.tick_interval_s > 0:
        query.ticker = Ticker(config, alive=lambda: query.isActive).start()  # ends with the query
        sink.expiry_alarm = query.ticker.wake_at  # and ticks when what the sink routes expires
    return query


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smqp-router",
        description=(
            "The SMQP routing job (Spark Structured Streaming). Reads the commands topic "
            "(PUBLISH / SUBSCRIBE / UNSUBSCRIBE / ACK events written by the gateways), routes "
            "every publish to the subscriptions open at that moment, writes one Deliver per "
            "subscriber to the deliveries topic, and commits messages, deliveries and "
            "subscriptions to Delta tables under <data_dir>/tables with exactly-once app "
            "transactions; each micro-batch's progress (rows, rates, phase durations, Kafka "
            "lag) goes to the metrics table there. Offsets live in the checkpoint "
            "<data_dir>/checkpoints/<query_name>. Stops cleanly on SIGINT / SIGTERM."
        ),
        epilog=(
            "Configuration: defaults, then the TOML file (--config or $SMQP_CONFIG), then "
            "SMQP_<SECTION>_<KEY> environment variables (e.g. SMQP_KAFKA_BOOTSTRAP=host:9092, "
            "SMQP_STREAMING_TRIGGER_INTERVAL='1 second'). See deploy/smqp.example.toml."
        ),
    )
    parser.add_argument("--config", metavar="PATH", help="TOML configuration file (default: $SMQP_CONFIG)")
    parser.add_argument("--available-now", action="store_true",
                        help="process everything the commands topic holds now, then exit")
    parser.add_argument("--log-level", default="INFO", help="Python log level (default INFO)")
    return parser


def yield_cpu(nice: int) -> None:
    """Run this process and what it starts at ``nice``, so the gateways on this host go first.

    Where the kernel groups processes by session for scheduling (``autogroup``), a nice value
    only ranks processes within their session's group, and the groups share the CPU equally: a
    job started in a session of its own (the launcher and the benchmark start every process so)
    would take half the cores at any nice.  Such a job, leading its session, also gives the
    group its nice value (``/proc/self/autogroup``), which ranks the groups."""
    os.nice(nice)
    group = Path("/proc/self/autogroup")
    grouped = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if os.getsid(0) == os.getpid() and group.exists() and grouped.exists() and grouped.read_text().strip() == "1":
        try:
            group.write_text(str(nice))
        except OSError as error:
            log.warning("could not set this session's scheduling group to nice %d: %s", nice, error)
    log.info("running at nice %d (gateways first on a shared host)", os.nice(0))


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("kafka", "py4j"):  # their INFO is per-connection / per-callback chatter
        logging.getLogger(chatty).setLevel(logging.WARNING)
    config = load_config(args.config)
    if config.streaming.nice:  # before Spark starts: its JVM and Python workers inherit it
        yield_cpu(config.streaming.nice)
    log.info("commands %s (source %s) → deliveries %s on %s", config.kafka.commands_topic,
             config.streaming.source, config.kafka.deliveries_topic, config.kafka.bootstrap)
    for table in ("messages", "deliveries", "subscriptions", "metrics"):
        log.info("Delta table %s: %s", table, config.table_path(table))
    log.info("checkpoint: %s", config.checkpoint_dir)

    sink = CommandSink(config)
    try:
        ensure_checkpoint_wrote_tables(config, sink)  # before Spark starts: refused in a second, not a minute
    except CheckpointMismatch as mismatch:
        log.error("%s", mismatch)
        return EXIT_REFUSED
    spark = build_session(config.streaming, app_name=config.streaming.query_name)
    log.info("Spark master %s, application %s", spark.sparkContext.master, spark.sparkContext.applicationId)
    if config.streaming.warm_up:
        warm_up(spark, config)  # before the stream: its first batch, "ready" to smqp-local, can route
    stopping = threading.Event()

    def request_stop(signum, _frame):
        log.info("signal %d: stopping", signum)
        stopping.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    query = None
    try:
        query = build_query(spark, config, available_now=args.available_now, sink=sink)
        while not stopping.is_set() and query.isActive:
            query.awaitTermination(0.5)
        if query.exception() is not None:
            log.error("query failed: %s", query.exception())
            return 1
        return 0
    finally:
        if query is not None and getattr(query, "ticker", None) is not None:
            query.ticker.stop()
        if query is not None and query.isActive:
            query.stop()
        flush_metrics(spark)  # the last rows, before the listener bus stops with the session
        sink.close()
        spark.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    raise SystemExit(main())
