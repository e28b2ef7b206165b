"""Benchmark of the walking skeleton on this machine (a script, not a test).

Starts the dev broker, the streaming job and one gateway as separate
processes, then measures through the reference client:

1. ingest: guaranteed PUB throughput through one gateway (200-byte bodies,
   several pipelining publishers), msgs/s counted on 200 replies;
2. latency: publish -> NOTIFY at a steady rate (default 200 msg/s for 60 s),
   p50/p90/p99 in ms, with every NOTIFY acknowledged (two-phase ACK).

Prints a table and writes JSON (``--json``).  Everything targets 127.0.0.1
and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

from deploy.stack import running_stack
from gateway.client import SMQPClient, SMQPError

BODY_SIZE = 200
# Separate accounts: every login of an account is sent its messages (spec section 3),
# so publishers logged in as the subscriber would be sent copies too.
PUBLISHER = ("benchpub", "bench-pub-pw")
SUBSCRIBER = ("benchsub", "bench-sub-pw")


def _body(stamp_ns: int) -> bytes:
    head = str(stamp_ns).encode() + b" "
    return head + b"x" * (BODY_SIZE - len(head))


async def ingest(host: str, port: int, messages: int, publishers: int, window: int) -> dict:
    """``publishers`` connections, each keeping ``window`` PUBs in flight, until ``messages`` are acked."""
    per_publisher = messages // publishers

    async def one(index: int) -> None:
        async with await SMQPClient.connect(host, port) as client:
            await client.login(*PUBLISHER)
            with contextlib.suppress(SMQPError):  # 409: a previous run created it
                await client.create_topic(f"/bench/ingest/p{index}")
            in_flight: set[asyncio.Task] = set()
            for i in range(per_publisher):
                if len(in_flight) >= window:
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()
                in_flight.add(asyncio.ensure_future(client.publish(f"/bench/ingest/p{index}", _body(0))))
            await asyncio.gather(*in_flight)
            await client.quit()

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(publishers)))
    elapsed = time.perf_counter() - started
    total = per_publisher * publishers
    return {"messages": total, "seconds": round(elapsed, 2), "msgs_per_s": round(total / elapsed)}


async def latency(host: str, port: int, rate: float, duration: float) -> dict:
    """Publish at ``rate`` msg/s for ``duration`` s; time each until its NOTIFY reaches the subscriber."""
    sub = await SMQPClient.connect(host, port)
    await sub.login(*SUBSCRIBER)
    with contextlib.suppress(SMQPError):
        await sub.create_topic("/bench/latency")
    await sub.subscribe("/bench/latency")
    samples: list[float] = []
    total = int(rate * duration)

    async def consume() -> None:
        while len(samples) < total:
            note = await sub.next_notification(60)
            samples.append((time.time_ns() - int(note.data.split(b" ", 1)[0])) / 1e6)
            await note.ack()

    consumer = asyncio.create_task(consume())
    async with await SMQPClient.connect(host, port) as pub:
        await pub.login(*PUBLISHER)
        await pub.publish("/bench/latency", _body(time.time_ns()))  # warm-up, counted too
        started = time.perf_counter()
        pending = []
        for i in range(1, total):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            pending.append(asyncio.ensure_future(pub.publish("/bench/latency", _body(time.time_ns()))))
        await asyncio.gather(*pending)
        await asyncio.wait_for(consumer, duration + 120)
    await sub.quit()
    ordered = sorted(samples)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)  # noqa: E731
    return {"messages": len(samples), "rate": rate, "seconds": duration, "p50_ms": pick(0.50),
            "p90_ms": pick(0.90), "p99_ms": pick(0.99), "max_ms": round(ordered[-1], 1),
            "mean_ms": round(statistics.fmean(ordered), 1)}


def wait_for_routing(table_path: str, expected: int, timeout: float = 900) -> float:
    """Seconds until the job has committed ``expected`` messages to Delta (its backlog drained)."""
    from deltalake import DeltaTable

    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if DeltaTable.is_deltatable(table_path):
            if DeltaTable(table_path).to_pyarrow_dataset().count_rows() >= expected:
                return time.perf_counter() - started
        time.sleep(0.5)
    raise TimeoutError(f"the streaming job did not commit {expected} messages within {timeout}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000, help="ingest: messages in all (default 20000)")
    parser.add_argument("--publishers", type=int, default=8, help="ingest: concurrent publishers (default 8)")
    parser.add_argument("--window", type=int, default=100, help="ingest: PUBs in flight per publisher")
    parser.add_argument("--rate", type=float, default=200, help="latency: msg/s (default 200)")
    parser.add_argument("--duration", type=float, default=60, help="latency: seconds (default 60)")
    parser.add_argument("--json", default="bench-results/skeleton.json", help="where to write the figures")
    args = parser.parse_args(argv)

    with running_stack(dict([PUBLISHER, SUBSCRIBER])) as stack:
        config = stack.config
        host, port = stack.address
        print(f"stack up (logs in {stack.workdir}); warming up the streaming job ...", flush=True)
        asyncio.run(latency(host, port, rate=20, duration=5))
        print(f"ingest: {args.messages} x {BODY_SIZE} B, {args.publishers} publishers ...", flush=True)
        ingest_result = asyncio.run(ingest(host, port, args.messages, args.publishers, args.window))
        drained = wait_for_routing(config.table_path("messages"), 100 + ingest_result["messages"])
        ingest_result["job_drain_s_after_ingest"] = round(drained, 1)
        print(f"  job committed the ingest backlog {drained:.1f} s after the last PUB reply", flush=True)
        print(f"latency: {args.rate:g} msg/s for {args.duration:g} s ...", flush=True)
        latency_result = asyncio.run(latency(host, port, args.rate, args.duration))
    results = {"machine": f"{os.cpu_count()} cores", "ingest": ingest_result, "latency": latency_result}
    print("\n| figure | value |\n|---|---|")
    print(f"| PUB throughput, one gateway, {args.publishers} publishers | {ingest_result['msgs_per_s']} msg/s |")
    print(f"| streaming job: backlog of the ingest run committed after | {ingest_result['job_drain_s_after_ingest']} s |")
    for q in ("p50", "p90", "p99"):
        print(f"| publish -> NOTIFY {q} at {args.rate:g} msg/s | {latency_result[q + '_ms']} ms |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
