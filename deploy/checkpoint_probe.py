"""What Spark's checkpoint costs a trigger on a local disk, per way of writing it.

    python -m deploy.checkpoint_probe [--rounds 2] [--triggers 60]    # ~10 minutes

Why: every trigger of the job writes two small files to its checkpoint, the offset log before the
batch (``walCommit``) and the commit log after it (``commitOffsets``), and they took ~20 ms each on an
idle host, a fifth of a quiet trigger.  Without Hadoop's native library, Hadoop's local file system
starts a child process (``chmod``, ``readlink``) for each permission it sets and each symbolic link it
looks up; how many depends on the API Spark writes through.  Ways compared:

- ``spark``: Spark's and Hadoop's defaults (FileContext over ChecksumFs: a ``.crc`` beside each file);
- ``filecontext``: FileContext over ``RawLocalFs`` (no ``.crc``): the job until 2026-11-30;
- ``job``: the job's session now (:data:`streaming.session.LEAN_CONF` and
  :func:`streaming.session.use_local_checkpoint_writes`): Hadoop's FileSystem API over
  ``RawLocalFileSystem``.

Each way runs in a JVM of its own (Hadoop caches a file system per JVM), the ways alternating
``--rounds`` times: a query on Spark's ``rate`` source with a foreachBatch that does nothing, a
trigger every 100 ms, checkpoint in a fresh temporary directory.  Printed per run: p50 / p90 ms of
``walCommit``, ``commitOffsets`` and ``triggerExecution``, the first 20 triggers left out.  Bounded:
``--triggers`` triggers, at most 3 minutes a run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time

from deploy.compare_report import percentile

WAYS = ("spark", "filecontext", "job")
#: The job's session properties this probe leaves out: the Delta extension needs jars a rate source does not.
NOT_NEEDED = ("spark.sql.extensions", "spark.sql.catalog.spark_catalog")
PHASES = ("walCommit", "commitOffsets", "triggerExecution")
SKIPPED = 20
RUN_LIMIT_S = 180


def session_conf_for(way: str) -> dict[str, str]:
    """The session properties of ``way`` (:data:`WAYS`)."""
    from streaming.session import LEAN_CONF

    conf = {key: value for key, value in LEAN_CONF.items() if key not in NOT_NEEDED}
    conf["spark.master"] = "local[2]"
    if way != "job":
        del conf["spark.hadoop.fs.file.impl"]
    if way == "spark":
        del conf["spark.hadoop.fs.AbstractFileSystem.file.impl"]
    return conf


def run_one(way: str, triggers: int) -> dict:
    """One query in this process's JVM, written ``way``; its phases' p50 / p90 (ms)."""
    from pyspark.sql import SparkSession

    from streaming.session import use_local_checkpoint_writes

    builder = SparkSession.builder.appName(f"checkpoint-probe-{way}").config(
        "spark.sql.streaming.numRecentProgressUpdates", str(triggers + SKIPPED + 10))
    for key, value in session_conf_for(way).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    checkpoint = tempfile.mkdtemp(prefix="smqp-checkpoint-probe-")
    if way == "job":
        use_local_checkpoint_writes(spark, checkpoint)
    query = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
             .writeStream.foreachBatch(lambda _frame, _batch_id: None).option("checkpointLocation", checkpoint)
             .trigger(processingTime="100 milliseconds").start())
    deadline = time.monotonic() + RUN_LIMIT_S
    try:  # PySpark builds each progress through ~100 py4j calls: look at the last one now and then
        while time.monotonic() < deadline and (query.lastProgress or {}).get("batchId", -1) < triggers + SKIPPED:
            time.sleep(1)
        progress = query.recentProgress
    finally:
        query.stop()
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    kept = [p["durationMs"] for p in progress if p["batchId"] >= SKIPPED]
    if not kept:
        raise RuntimeError(f"{way}: no trigger past the first {SKIPPED} in {RUN_LIMIT_S} s")
    return {"way": way, "triggers": len(kept),
            **{phase: [percentile([d.get(phase, 0) for d in kept], q) for q in (0.5, 0.9)] for phase in PHASES}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.checkpoint_probe", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="times each way runs, alternating (default 2)")
    parser.add_argument("--triggers", type=int, default=60, help="triggers timed per run (default 60)")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)} (default all)")
    parser.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)  # a run's own process
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.triggers)), flush=True)
        return 0
    ways = [way.strip() for way in args.ways.split(",") if way.strip()]
    if not ways or set(ways) - set(WAYS) or args.rounds < 1 or args.triggers < 10:
        parser.error(f"--ways takes {', '.join(WAYS)}; --rounds at least 1, --triggers at least 10")
    print(f"{'way':>12} | walCommit p50 / p90 ms | commitOffsets p50 / p90 | trigger p50 / p90", flush=True)
    for _ in range(args.rounds):
        for way in ways:
            child = subprocess.run([sys.executable, "-m", "deploy.checkpoint_probe", "--one", way,
                                    "--triggers", str(args.triggers)],
                                   capture_output=True, text=True, timeout=RUN_LIMIT_S + 120)
            lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
            if child.returncode or not lines:
                print(child.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"the {way} run failed (exit {child.returncode})")
            r = json.loads(lines[-1])
            print(f"{way:>12} | {r['walCommit'][0]:>9g} / {r['walCommit'][1]:<10g} | "
                  f"{r['commitOffsets'][0]:>13g} / {r['commitOffsets'][1]:<8g} | "
                  f"{r['triggerExecution'][0]:g} / {r['triggerExecution'][1]:g}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
