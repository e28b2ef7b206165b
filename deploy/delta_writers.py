"""delta-rs against delta-spark for the job's per-batch Delta commits, measured side by side.

    python -m deploy.delta_writers [--commits 20] [--rounds 3] [--rows 500]

Each micro-batch of the routing job commits a handful of tables, each idempotently for its batch
id: an append (``messages``) and merges (``deliveries``, ``subscriptions`` …) carrying a Delta app
transaction, so a replayed batch writes nothing twice.  This script makes the same two kinds of
commit, ``--rows`` rows each, into a scratch table with both writers, in alternating rounds (this
host's speed drifts about 2x from minute to minute), and prints per-commit p50 / p90 per writer:

- **delta-rs** (``deltalake``): ``write_deltalake(..., commit_properties=Transaction(app, batch))``
  and ``DeltaTable.merge(...)`` from Arrow, in this process;
- **delta-spark**: ``DataFrameWriter`` with ``txnAppId`` / ``txnVersion``, and ``DeltaTable.merge``
  with the session's ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``, on the job's own
  session (:func:`streaming.session.build_session`: local[2], lean settings, jars from the Maven cache).

The first ``--warmup`` commits of each kind are left out (a cold JVM compiles as it goes).  The JSON
goes to ``bench-results/delta-writers-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pyarrow as pa

from deploy.compare_report import percentile

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "smuid long, account string, status string"


def _rows(batch: int, rows: int) -> pa.Table:
    """``rows`` rows for batch ``batch``: half of them keys the previous batch wrote (the merge updates those)."""
    start = batch * rows // 2
    keys = pa.array(range(start, start + rows), pa.int64())
    return pa.table({"smuid": keys, "account": pa.array([f"a{k % 7}" for k in keys.to_pylist()]),
                     "status": pa.array(["pending"] * rows)})


class DeltaRs:
    name = "delta-rs"

    def __init__(self, path: str):
        from deltalake import write_deltalake

        self.path = path
        write_deltalake(path, _rows(0, 1).slice(0, 0))

    def append(self, batch: int, rows: pa.Table) -> None:
        from deltalake import CommitProperties, Transaction, write_deltalake

        write_deltalake(self.path, rows, mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction("bench:append", batch)]))

    def merge(self, batch: int, rows: pa.Table) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction

        (DeltaTable(self.path).merge(rows, predicate="t.smuid = s.smuid AND t.account = s.account",
                                     source_alias="s", target_alias="t",
                                     commit_properties=CommitProperties(
                                         app_transactions=[Transaction("bench:merge", batch)]))
         .when_matched_update(updates={"status": "s.status"}).when_not_matched_insert_all().execute())


class DeltaSpark:
    name = "delta-spark"

    def __init__(self, path: str, spark):
        self.path, self.spark = path, spark
        spark.createDataFrame(_rows(0, 1).slice(0, 0), schema=SCHEMA).write.format("delta").save(path)

    def append(self, batch: int, rows: pa.Table) -> None:
        (self.spark.createDataFrame(rows, schema=SCHEMA).write.format("delta").mode("append")
         .option("txnAppId", "bench:append").option("txnVersion", batch).save(self.path))

    def merge(self, batch: int, rows: pa.Table) -> None:
        from delta.tables import DeltaTable

        conf = self.spark.conf
        conf.set("spark.databricks.delta.write.txnAppId", "bench:merge")
        conf.set("spark.databricks.delta.write.txnVersion", str(batch))
        try:
            (DeltaTable.forPath(self.spark, self.path).alias("t")
             .merge(self.spark.createDataFrame(rows, schema=SCHEMA).alias("s"),
                    "t.smuid = s.smuid AND t.account = s.account")
             .whenMatchedUpdate(set={"status": "s.status"}).whenNotMatchedInsertAll().execute())
        finally:
            conf.unset("spark.databricks.delta.write.txnAppId")
            conf.unset("spark.databricks.delta.write.txnVersion")


def _timed(commit: Callable[[int, pa.Table], None], commits: int, rows: int, first_batch: int) -> list[float]:
    times = []
    for batch in range(first_batch, first_batch + commits):
        table = _rows(batch, rows)
        started = time.perf_counter()
        commit(batch, table)
        times.append((time.perf_counter() - started) * 1000)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.delta_writers", description=__doc__.split("\n\n")[0],
                                     epilog="See the module docstring for what is measured.")
    parser.add_argument("--commits", type=int, default=20, help="commits of each kind per writer and round")
    parser.add_argument("--warmup", type=int, default=3, help="first commits of each kind left out")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (delta-rs, delta-spark, ...)")
    parser.add_argument("--rows", type=int, default=500, help="rows per commit")
    parser.add_argument("--out", default=str(ROOT / "bench-results"), help="directory for the JSON result")
    args = parser.parse_args(argv)

    from schemas.config import StreamingConfig
    from streaming.session import build_session

    print("starting the job's Spark session (local[2]) ...", file=sys.stderr, flush=True)
    spark = build_session(StreamingConfig(), app_name="delta-writers")
    scratch = Path(tempfile.mkdtemp(prefix="delta-writers-"))
    results: dict[str, dict[str, list[float]]] = {"delta-rs": {"append": [], "merge": []},
                                                   "delta-spark": {"append": [], "merge": []}}
    try:
        for round_ in range(args.rounds):
            writers = [DeltaRs(str(scratch / f"rs-{round_}")), DeltaSpark(str(scratch / f"spark-{round_}"), spark)]
            for writer in writers:
                for kind in ("append", "merge"):
                    times = _timed(getattr(writer, kind), args.commits, args.rows, 1)[args.warmup:]
                    results[writer.name][kind] += times
                    print(f"round {round_ + 1}/{args.rounds} {writer.name:11} {kind:6} "
                          f"p50 {statistics.median(times):7.1f} ms", file=sys.stderr, flush=True)
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    summary = {writer: {kind: {"p50_ms": round(statistics.median(times), 1),
                               "p90_ms": round(percentile(times, 0.9), 1), "commits": len(times)}
                        for kind, times in kinds.items()} for writer, kinds in results.items()}
    print(f"\nper commit of {args.rows} rows with an app transaction ({args.rounds} alternating rounds):")
    print(f"{'writer':12} {'append p50/p90 ms':>20} {'merge p50/p90 ms':>20}")
    for writer, kinds in summary.items():
        print(f"{writer:12} {kinds['append']['p50_ms']:>9} / {kinds['append']['p90_ms']:<8}"
              f" {kinds['merge']['p50_ms']:>9} / {kinds['merge']['p90_ms']:<8}")
    ratio = {kind: round(summary["delta-spark"][kind]["p50_ms"] / summary["delta-rs"][kind]["p50_ms"], 1)
             for kind in ("append", "merge")}
    print(f"delta-spark / delta-rs at p50: append {ratio['append']}x, merge {ratio['merge']}x")
    stamp = datetime.now(timezone.utc)
    out = Path(args.out) / f"delta-writers-{stamp:%Y-%m-%d}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": stamp.isoformat(timespec="seconds"), "host": platform.node(),
                               "args": vars(args), "summary": summary, "ratio_p50": ratio,
                               "samples_ms": results}, indent=1) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
