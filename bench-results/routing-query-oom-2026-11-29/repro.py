"""Route the two batches of ``example.repr`` (current subscriptions, a first batch, a second) through
the routing query, on a Spark driver of the heap given, and print what each took.

    .venv/bin/python bench-results/routing-query-oom-2026-11-29/repro.py 512m   # the job's heap
    .venv/bin/python bench-results/routing-query-oom-2026-11-29/repro.py 2g     # the tests' heap

Run from the repository's root.  A one-off finding's reproduction, not a tool: see README.md here.
"""

import sys
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, ".")

from schemas.config import FederationConfig, StreamingConfig, load_config  # noqa: E402
from schemas.events import Ack, Publish, Section, Subscribe, Tick, Unsubscribe  # noqa: E402,F401 (for eval)
from streaming.session import build_session  # noqa: E402
from streaming.sink import CommandSink  # noqa: E402
from tests.streaming.test_simple_batch import PEERS, T0, records, store_subscriptions  # noqa: E402

current, first, second = eval(Path(__file__).with_name("example.repr").read_text())
spark = build_session(StreamingConfig(spark_conf={"spark.driver.memory": sys.argv[1]}), app_name="oom-repro")
config = replace(load_config(env={}, data_dir=tempfile.mkdtemp()), federation=FederationConfig(peers=PEERS))
config = replace(config, streaming=replace(config.streaming, simple_batches=False))
store_subscriptions(config, current)
sink = CommandSink(config)
for batch_id, batch, at in ((6, first, T0), (7, second, T0 + timedelta(hours=1))):
    started = time.monotonic()
    sink.commit_outputs(sink.outputs(records(spark, batch), batch_id, at), batch_id)
    print(f"batch {batch_id}: {time.monotonic() - started:.1f} s, routing query {sink.query_ms}", flush=True)
