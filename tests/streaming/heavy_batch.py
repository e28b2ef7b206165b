"""Route ``heavy_batch.repr`` through the routing query on a driver of the job's own heap, in a
process of its own, and print one JSON line per batch: what it routed and how long it took.

    python -m tests.streaming.heavy_batch            # the job's heap (streaming.session.LEAN_CONF)
    python -m tests.streaming.heavy_batch 2g         # another

The example is what hypothesis found while proving the driver's routing equal to the query
(``bench-results/routing-query-oom-2026-11-29``): stored subscriptions, a first batch, then a second
of two UNSUBSCRIBEs, two SUBSCRIBEs that make late subscribers, five publishes (one asking for every
receipt) and two ACKs.  A process of its own, because the point is the heap a JVM is started with:
once out of it, the job's JVM exits (``-XX:+ExitOnOutOfMemoryError``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from schemas.config import FederationConfig, StreamingConfig, load_config
from schemas.events import Ack, Publish, Section, Subscribe, Tick, Unsubscribe
from streaming.session import LEAN_CONF, build_session
from streaming.sink import CommandSink
from tests.streaming.test_simple_batch import PEERS, T0, records, store_subscriptions

EXAMPLE = Path(__file__).with_name("heavy_batch.repr")
EVENTS = {kind.__name__: kind for kind in (Ack, Publish, Section, Subscribe, Tick, Unsubscribe)}


def main(heap: str) -> None:
    with tempfile.TemporaryDirectory(prefix="smqp-heavy-batch-") as data_dir:
        route_example(heap, data_dir)


def route_example(heap: str, data_dir: str) -> None:
    current, first, second = eval(EXAMPLE.read_text(), dict(EVENTS))  # noqa: S307 (our own file)
    spark = build_session(StreamingConfig(spark_conf={"spark.driver.memory": heap}), app_name="heavy-batch")
    config = replace(load_config(env={}, data_dir=data_dir), federation=FederationConfig(peers=PEERS))
    config = replace(config, streaming=replace(config.streaming, simple_batches=False))
    store_subscriptions(config, current)
    sink = CommandSink(config)
    try:
        for batch_id, batch, at in ((6, first, T0), (7, second, T0 + timedelta(hours=1))):
            started = time.monotonic()
            out = sink.outputs(records(spark, batch), batch_id, at)
            sink.commit_outputs(out, batch_id)
            print(json.dumps({"batch": batch_id, "seconds": round(time.monotonic() - started, 1), **sink.query_ms,
                              **{kind: rows.num_rows for kind, rows in out.items()}}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else LEAN_CONF["spark.driver.memory"])
