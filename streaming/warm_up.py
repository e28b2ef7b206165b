"""The routing query planned and run once on made-up commands, before the job's stream starts.

Why: the first routing query a JVM plans is the slow one.  Catalyst's rules run interpreted until
the JIT has compiled them, so on this host a cold JVM took 7-16 s to plan the first batch holding a
SUBSCRIBE (a warm one 1.5-2.5 s), and the first client to subscribe after a start waited that long
for what the job routes.  Issue 31 asks that a cold JVM hold nothing up and that the stack say
"ready" only when the job can route: the job warms up first, then starts its stream, whose first
batch is what ``smqp-local`` waits for.

The made-up batch goes through :meth:`streaming.sink.CommandSink.outputs` only: on tables of a
throwaway directory, with nothing sent to Kafka and nothing committed.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
from pyspark.sql import SparkSession

from schemas import events as ev
from schemas.config import SMQPConfig
from schemas.spark import KAFKA_RECORD, arrow_schema
from streaming.sink import CommandSink

log = logging.getLogger("streaming.job")


def made_up_commands(at: int) -> list[ev._Event]:
    """A batch like the first ones after a start: a SUBSCRIBE, a publish it gets, the ACK, the job's
    clock (routed by the query here: :func:`warm_up`).  (One that also NACKed and expired took 8 s even on a
    warm JVM, against 3 s: longer than a start should wait.)"""
    return [ev.Subscribe("warm-up", "g-warm-up", "/warm-up/*", at),
            ev.Publish(1, "/warm-up/t", "c1", "warm-up-publisher", "g-p", at + 1, expires_at=at + 60_000_000),
            ev.Ack("warm-up", "g-warm-up", 1, at + 2),
            ev.Tick(at + 3)]


def kafka_records(commands: list[ev._Event], at: datetime, offset: int = 0, topic: str = "warm-up") -> pa.Table:
    """``commands`` as the Kafka records of a micro-batch (partition 0 from ``offset``, a microsecond
    apart from ``at``), as the stream hands them to the sink; ``deploy.sink_bench`` makes its too."""
    return pa.Table.from_pylist(
        [{"key": None, "value": command.to_bytes(), "topic": topic, "partition": 0, "offset": offset + n,
          "timestamp": at + timedelta(microseconds=n), "timestampType": 0} for n, command in enumerate(commands)],
        schema=arrow_schema(KAFKA_RECORD))


def warm_up(spark: SparkSession, config: SMQPConfig) -> CommandSink:
    """Route the made-up batch once; returns the throwaway sink (its ``query_ms`` says what the
    routing query took).  Its directory is gone when this returns."""
    started = time.monotonic()
    now = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="smqp-warm-up-") as scratch:
        # through the query even though the job would route this batch on the driver (simple_batch)
        sink = CommandSink(dataclasses.replace(config, data_dir=scratch, streaming=dataclasses.replace(
            config.streaming, simple_batches=False)))
        at = int(now.timestamp() * 1_000_000)
        sink.outputs(spark.createDataFrame([], KAFKA_RECORD), 0, now, kafka_records(made_up_commands(at), now))
    log.info("routing query warmed up in %.1f s (planning %.0f ms, running %.0f ms)",
             time.monotonic() - started, sink.query_ms["plan"], sink.query_ms["run"])
    return sink
