"""Eight batches of 200 publishes (a tenth asking for a receipt, a quarter DELIVERY ONE) and bob's ACKs of half
of them, so receipts fall due in each; routed as the job routes them (on the driver when it may), and timed.
Run from a checkout's root:

    .venv/bin/python bench-results/receipts-on-driver-2026-11-29/receipt_batches.py 512m
"""
import sys, tempfile, time
from dataclasses import replace
from datetime import timedelta
sys.path.insert(0, ".")
from schemas import events as ev
from schemas.config import StreamingConfig, load_config
from streaming.session import build_session
from streaming.sink import CommandSink
from tests.streaming.test_simple_batch import T0, US0, records, store_subscriptions

spark = build_session(StreamingConfig(spark_conf={"spark.driver.memory": sys.argv[1]}), app_name="qbench")
config = load_config(env={}, data_dir=tempfile.mkdtemp())
store_subscriptions(config, {("bob", "/t/x"): (None, None), ("carol", "/t/*"): (None, None)})
sink = CommandSink(config)
smuid = 0
for batch_id in range(1, 9):
    at = US0 + batch_id * 1_000_000
    batch = []
    for i in range(200):
        smuid += 1
        batch.append(ev.Publish(smuid, "/t/x", f"alice/{smuid}", "alice", "g-alice", at + i, i % 3,
                                expires_at=at + 3_600_000_000, receipt="one" if i % 10 == 0 else "none",
                                delivery="one" if i % 4 == 0 else "all"))
        if i % 2 == 0:  # bob acknowledges the even ones, those asking for a receipt among them
            batch.append(ev.Ack("bob", "g-bob", smuid, at + i + 1))
    started = time.monotonic()
    out = sink.outputs(records(spark, batch), batch_id, T0 + timedelta(seconds=batch_id))
    sink.commit_outputs(out, batch_id)
    print(f"batch {batch_id}: {(time.monotonic() - started) * 1000:.0f} ms, plan {sink.query_ms['plan']:.0f} "
          f"run {sink.query_ms['run']:.0f}, receipts {out['receipts'].num_rows}", flush=True)
