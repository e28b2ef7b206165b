"""How long the job's sink takes per micro-batch on its own: routing a batch and committing it to Delta.

``python -m deploy.sink_bench`` drives :class:`streaming.sink.CommandSink` with made-up batches, as
the streaming query would hand them over, without Kafka or a running query: each batch holds
``--publishes`` publishes to topics ``--subscribers`` accounts subscribe to, the ACKs of the
previous batch's deliveries and a tick, so it is a *simple* batch (:mod:`streaming.simple_batch`)
and the Delta tables grow as they would.  With ``--subscribe`` each batch also holds a SUBSCRIBE (of
a new account, to a topic nobody publishes to): still routed on the driver, with its look for late
messages.  With ``--receipts`` a tenth of the publishes ask for RECEIPT ONE, so receipts fall due at
the next batch's ACKs: on the driver too (:mod:`streaming.simple_receipts`).  With ``--nack`` each
batch also holds a NACK of one of the previous batch's deliveries: on the driver too
(:mod:`streaming.simple_nacks`; before, the routing query routed such a batch).  With ``--since`` the
first subscriber SUBSCRIBEs again with SINCE in each batch, clearing what it left unacknowledged
(:mod:`streaming.simple_clearing`).  With ``--expiring`` each batch's last publish expires unacknowledged
before the batch's tick, so every batch commits Trash rows too, as the job's under the expiry probe of
:mod:`deploy.job_latency`; ``--through-query`` routes every batch by the routing query, as
such a batch was before.  It prints, per batch, the time to compute the outputs
(``outputs()``: the Delta reads and the routing), to commit them (``commit_outputs()``) and to
compact the tables after it, as the job does between batches (``compact_ms``: most batches none, one
in some fifty a table's files; in ``total_ms`` since 2026-12-07), and
their p50 / p90 / p99 over ``--batches`` batches after ``--warmup`` discarded ones.  The Kafka
producer and the query's own overhead are not in it: see :mod:`deploy.job_latency` for the whole
stack.  Everything runs in a temporary directory, removed at the end.

This host's speed drifts about 2x minute to minute: compare two versions of the code only across
alternating runs (``PYTHONPATH=<checkout> python -m deploy.sink_bench``, one checkout after the other).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
from deltalake import write_deltalake

from schemas import events as ev
from schemas.config import load_config
from schemas.spark import KAFKA_RECORD, SUBSCRIPTIONS_TABLE, arrow_schema

T0 = datetime.now(timezone.utc).replace(microsecond=0)
US0 = int(T0.timestamp() * 1_000_000)


def subscribe(config, accounts: list[str]) -> None:
    """Every account subscribed to ``/bench/*``, as committed subscriptions."""
    rows = [{"account": account, "pattern": "/bench/*", "guid": f"g-{account}", "active": True,
             "subscribed_at": T0, "unsubscribed_at": None, "since": None, "until": None, "batch_id": 0}
            for account in accounts]
    write_deltalake(config.table_path("subscriptions"), pa.Table.from_pylist(rows, arrow_schema(SUBSCRIPTIONS_TABLE)),
                    mode="overwrite")


def batch_events(index: int, publishes: int, accounts: list[str], subscribe: bool = False, receipts: bool = False,
                 nack: bool = False, since: bool = False, expiring: bool = False) -> list:
    """Batch ``index``: a SUBSCRIBE if ``subscribe``, a NACK of the previous batch's first delivery if
    ``nack``, and if ``since`` the first account SUBSCRIBing again with SINCE at the batch's start, its
    publishes (a minute's Timeout; every tenth asking for RECEIPT ONE if ``receipts``; with ``expiring``
    the last half a second's, and never ACKed), the ACKs of the previous batch's (with ``since``, the first
    account's but every tenth, which SINCE clears), a tick."""
    at = US0 + index * 1_000_000
    events = [ev.Subscribe(f"new{index}", f"g-new{index}", "/elsewhere", at - 1)] if subscribe else []
    if since and index:
        events.append(ev.Subscribe(accounts[0], f"g-{accounts[0]}", "/bench/*", at - 1, since=at - 1))
    if nack and index:
        events.append(ev.Nack(accounts[0], f"g-{accounts[0]}", (index - 1) * publishes + 1, at - 1, 3))
    events += [ev.Publish(index * publishes + n + 1, f"/bench/{n % 10}", f"c{index}-{n}", "pub", "g-pub", at + n,
                          expires_at=at + (500_000 if expiring and n == publishes - 1 else 60_000_000), receipt="one" if receipts and n % 10 == 0 else "none")
               for n in range(publishes)]
    if index:
        events += [ev.Ack(account, f"g-{account}", (index - 1) * publishes + n + 1, at + publishes + n)
                   for n in range(publishes) for account in accounts
                   if not (since and account == accounts[0] and n % 10 == 0) and not (expiring and n == publishes - 1)]
    return events + [ev.Tick(at + 900_000)]


def percentiles(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)  # noqa: E731
    return {"p50": round(statistics.median(ordered), 1), "p90": pick(0.9), "p99": pick(0.99), "max": round(ordered[-1], 1)}


def run(args) -> dict:
    from streaming.session import build_session
    from streaming.sink import CommandSink
    from streaming.sink.records import batch_now
    from streaming.warm_up import kafka_records

    workdir = tempfile.mkdtemp(prefix="smqp-sink-bench-")
    config = load_config(env={}, data_dir=f"{workdir}/data", streaming={"simple_batches": not args.through_query})
    spark = build_session(config.streaming, app_name="sink-bench")  # the job's session, its settings
    try:
        accounts = [f"sub{n}" for n in range(args.subscribers)]
        subscribe(config, accounts)
        sink = CommandSink(config)
        frame = spark.createDataFrame([], KAFKA_RECORD)  # outputs() asks it only for its session
        timings = []
        offset = 0
        for index in range(args.warmup + args.batches):
            arrow = kafka_records(batch_events(index, args.publishes, accounts, args.subscribe, args.receipts,
                                               args.nack, args.since, args.expiring),
                                  datetime.now(timezone.utc), offset, topic="bench")
            offset += arrow.num_rows
            started = time.perf_counter()
            out = sink.outputs(frame, index + 1, T0 + timedelta(seconds=index), arrow)
            routed = time.perf_counter()
            sink.commit_outputs(out, index + 1)
            committed = time.perf_counter()
            sink.compact(batch_now(arrow))  # as the job does after each batch
            done = time.perf_counter()
            if index >= args.warmup:
                timings.append(((routed - started) * 1000, (committed - routed) * 1000, sink.query_ms["plan"],
                                (done - committed) * 1000))
            if (index + 1) % 20 == 0:
                print(f"  {index + 1} batches", flush=True)
        return {"batches": args.batches, "publishes": args.publishes, "subscribers": args.subscribers,
                "subscribe": args.subscribe, "receipts": args.receipts, "nack": args.nack, "since": args.since, "expiring": args.expiring,
                "through_query": args.through_query,
                "outputs_ms": percentiles([t[0] for t in timings]),
                "query_plan_ms": percentiles([t[2] for t in timings]),
                "commit_ms": percentiles([t[1] for t in timings]),
                "compact_ms": percentiles([t[3] for t in timings]),
                "total_ms": percentiles([t[0] + t[1] + t[3] for t in timings])}
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.sink_bench", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=100, help="measured batches (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="batches run first, not counted (default 10)")
    parser.add_argument("--publishes", type=int, default=200, help="publishes per batch (default 200)")
    parser.add_argument("--subscribers", type=int, default=2,
                        help="accounts subscribed to them (default 2; 0: nobody, so every publish waits "
                             "in 'unrouted', as deploy.job_latency's load does)")
    parser.add_argument("--subscribe", action="store_true",
                        help="a SUBSCRIBE in every batch (routed on the driver)")
    parser.add_argument("--receipts", action="store_true",
                        help="every tenth publish asks for RECEIPT ONE, due at the next batch's ACKs")
    parser.add_argument("--nack", action="store_true",
                        help="a NACK in every batch (routed on the driver)")
    parser.add_argument("--since", action="store_true",
                        help="the first subscriber SUBSCRIBEs again with SINCE in every batch, clearing the tenth "
                             "of its deliveries it did not ACK (routed on the driver)")
    parser.add_argument("--expiring", action="store_true",
                        help="each batch's last publish expires unacknowledged within it: Trash rows in every batch")
    parser.add_argument("--through-query", action="store_true",
                        help="every batch through the routing query ([streaming] simple_batches = false), "
                             "for comparison")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if min(args.batches, args.publishes) < 1 or min(args.subscribers, args.warmup) < 0:
        parser.error("--batches and --publishes must be at least 1, --subscribers and --warmup not negative")
    print(f"sink bench: {args.batches} batches of {args.publishes} publishes to {args.subscribers} subscribers "
          f"(+ their ACKs{', a SUBSCRIBE' if args.subscribe else ''}{', receipts' if args.receipts else ''}"
          f"{', a NACK' if args.nack else ''}{', a SUBSCRIBE with SINCE' if args.since else ''}{', an expiry' if args.expiring else ''})"
          f"{', all through the routing query' if args.through_query else ''}, after {args.warmup} warm-up batches ...",
          flush=True)
    figures = run(args)
    for name in ("outputs_ms", "query_plan_ms", "commit_ms", "compact_ms", "total_ms"):
        print(f"{name:>13}: " + "  ".join(f"{k} {v:,}" for k, v in figures[name].items()))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
