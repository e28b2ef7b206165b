"""How long a quiet micro-batch of Spark's Kafka source takes to reach the driver, per ``fetch.max.wait.ms``.

    python -m deploy.kafka_source_probe [--waits 500,50,10,5,1] [--batches 60] [--gap 0.3]

Why: with ``[streaming] source = "kafka"`` a batch of two commands took ~240 ms in the job's
foreachBatch on an idle stack, against ~100 with our Python source, nearly all of it in
``batch_df.toArrow()``.  Spark's Kafka source keeps one consumer per partition on the executor
across batches; after each task that consumer has a prefetch outstanding at the broker, and the
next batch's fetch to the same broker waits behind it, up to the consumer's ``fetch.max.wait.ms``
(Kafka's default 500).  The job sets it low (:data:`streaming.job.KAFKA_SOURCE_FETCH_WAIT_MS`).

A scratch Kafka node (:func:`deploy.broker.scratch_broker`, 127.0.0.1) holds one topic.  For each
value of ``--waits``, one streaming query on the job's own session
(:func:`streaming.session.build_session`) reads it with Spark's Kafka source and that
``kafka.fetch.max.wait.ms``, while two records are appended every ``--gap`` seconds,
``--batches`` times; its foreachBatch times ``toArrow()``.  Printed per value: ``toArrow`` p50 / p90 /
max and Spark's own ``addBatch`` and ``triggerExecution`` p50 (ms), the first five batches left
out.  Bounded: ``--batches × --gap`` seconds per value, then the query, Spark and the node stop.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from deploy.broker import scratch_broker
from deploy.compare_report import percentile

TOPIC = "probe"


def probe(spark, bootstrap: str, wait_ms: int, batches: int, gap: float) -> dict:
    """One query's figures (ms) with ``kafka.fetch.max.wait.ms`` = ``wait_ms``."""
    from kafka import KafkaProducer

    timings: list[tuple[float, int]] = []

    def sink(frame, _batch_id):
        started = time.perf_counter()
        rows = frame.toArrow().num_rows
        timings.append(((time.perf_counter() - started) * 1000, rows))

    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", TOPIC).option("startingOffsets", "latest")
             .option("kafka.fetch.max.wait.ms", str(wait_ms)).load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", tempfile.mkdtemp(prefix="smqp-probe-"))
             .trigger(processingTime="0 seconds").start())
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        while not query.recentProgress:  # the query has read where the topic ends
            time.sleep(0.1)
        for _ in range(batches):
            producer.send(TOPIC, b'{"type":"tick","at":1}')
            producer.send(TOPIC, b'{"type":"tick","at":2}')
            producer.flush()
            time.sleep(gap)
    finally:
        producer.close()
        query.stop()
    arrow = [ms for ms, rows in timings if rows][5:]
    spark_ms = [p["durationMs"] for p in query.recentProgress if p["numInputRows"]][5:]
    if not arrow:
        raise RuntimeError(f"no batch with records arrived with fetch.max.wait.ms={wait_ms}")
    return {"wait_ms": wait_ms, "batches": len(arrow),
            "to_arrow_p50": round(statistics.median(arrow), 1), "to_arrow_p90": round(percentile(arrow, 0.9), 1),
            "to_arrow_max": round(max(arrow), 1),
            "add_batch_p50": statistics.median(d.get("addBatch", 0) for d in spark_ms),
            "trigger_p50": statistics.median(d.get("triggerExecution", 0) for d in spark_ms)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.kafka_source_probe", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waits", default="500,50,10,5,1",
                        help="comma-separated kafka.fetch.max.wait.ms values, one query each (default 500,50,10,5,1)")
    parser.add_argument("--batches", type=int, default=60, help="pairs of records appended per value (default 60)")
    parser.add_argument("--gap", type=float, default=0.3, help="seconds between two pairs (default 0.3)")
    args = parser.parse_args(argv)
    try:
        waits = [int(value) for value in args.waits.split(",") if value.strip()]
    except ValueError:
        parser.error(f"--waits must be comma-separated integers, not {args.waits!r}")
    if not waits or min(waits) < 0 or args.batches < 10 or args.gap <= 0:
        parser.error("--waits needs values of 0 or more, --batches at least 10, --gap above 0")

    from kafka.admin import KafkaAdminClient, NewTopic

    from schemas.config import load_config
    from streaming.session import build_session

    with scratch_broker() as broker:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        admin.create_topics([NewTopic(TOPIC, 1, 1)])
        admin.close()
        spark = build_session(load_config(env={}).streaming, app_name="kafka-source-probe")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            print(f"{'fetch.max.wait.ms':>17} | toArrow p50 / p90 / max ms | addBatch p50 | trigger p50")
            for wait in waits:
                r = probe(spark, broker.bootstrap, wait, args.batches, args.gap)
                print(f"{wait:>17} | {r['to_arrow_p50']:>7} / {r['to_arrow_p90']} / {r['to_arrow_max']}"
                      f"{'':>6} | {r['add_batch_p50']:>12} | {r['trigger_p50']:>11}", flush=True)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
