"""A bounded soak run (a script, not a test): many clients for a few minutes on 127.0.0.1.

Starts the whole engine (``deploy.stack``), then ``--publishers`` accounts publish
guaranteed messages to one topic at ``--rate`` msg/s in all for ``--duration``
seconds while ``--subscribers`` accounts receive and two-phase-ACK every one
of them.  After a drain period it reports: messages published (200 replies),
deliveries expected and received, acknowledged, lost (must be 0), duplicated
after ACK (must be 0), p50/p99 publish → NOTIFY latency, and the peak resident
memory of the gateway and of the streaming job (with its JVM).  Writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from deploy.stack import peak_memory_mb, running_stack
from gateway.client import SMQPClient

TOPIC = "/soak/t"


async def subscriber(address, account: str, received: dict, duplicates: list, latencies: list,
                     ready: asyncio.Event, stop: asyncio.Event) -> None:
    client = await SMQPClient.connect(*address)
    await client.login(account, f"{account}-pw")
    await client.subscribe(TOPIC)
    ready.set()
    acked: set[int] = set()
    while not stop.is_set():
        try:
            note = await client.next_notification(0.5)
        except asyncio.TimeoutError:
            continue
        if note.smuid in acked:
            duplicates.append((account, note.smuid))
        latencies.append(time.time() - float(note.data.split(b" ", 1)[0]))
        await note.ack()
        acked.add(note.smuid)
        received[account].add(note.smuid)
    await client.quit()


async def publisher(address, account: str, interval: float, until: float, published: list) -> None:
    async with await SMQPClient.connect(*address) as client:
        await client.login(account, f"{account}-pw")
        next_at = time.monotonic()
        while time.monotonic() < until:
            published.append(await client.publish(TOPIC, f"{time.time()} soak".ljust(200, "x")))
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def soak(address, args) -> dict:
    async with await SMQPClient.open(*address, "pub0", "pub0-pw") as admin:
        await admin.create_topic(TOPIC)
    subs = [f"sub{i}" for i in range(args.subscribers)]
    received = {account: set() for account in subs}
    duplicates: list = []
    latencies: list[float] = []
    published: list[int] = []
    stop = asyncio.Event()
    readies = [asyncio.Event() for _ in subs]
    tasks = [asyncio.create_task(subscriber(address, a, received, duplicates, latencies, r, stop))
             for a, r in zip(subs, readies)]
    await asyncio.gather(*(r.wait() for r in readies))
    until = time.monotonic() + args.duration
    interval = args.publishers / args.rate
    await asyncio.gather(*(publisher(address, f"pub{i}", interval, until, published)
                           for i in range(args.publishers)))
    print(f"  published {len(published)}; draining ...", flush=True)
    deadline = time.monotonic() + args.drain
    expected = set(published)
    while time.monotonic() < deadline and any(not expected <= got for got in received.values()):
        await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*tasks)
    delivered = sum(len(got & expected) for got in received.values())
    latencies.sort()
    return {
        "published": len(published), "deliveries_expected": len(published) * len(subs),
        "delivered_and_acked": delivered, "lost": len(published) * len(subs) - delivered,
        "duplicated_after_ack": len(duplicates),
        "notify_latency_p50_ms": round(statistics.median(latencies) * 1000) if latencies else None,
        "notify_latency_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000) if latencies else None,
    }


def _measure(accounts: dict[str, str], args) -> dict:
    """The soak on a stack of its own, stopped however this ends."""
    with running_stack(accounts) as stack:
        print(f"stack up (logs in {stack.workdir}{'' if args.keep else ', removed at the end'}); {args.publishers} publishers, {args.subscribers} subscribers, "
              f"{args.rate:g} msg/s for {args.duration:g} s ...", flush=True)
        result = asyncio.run(soak(stack.address, args))
        result["peak_memory_mb"] = {name: peak_memory_mb(child.pid) for name, child in stack.children.items()}
    if not args.keep:
        shutil.rmtree(stack.workdir, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishers", type=int, default=25, help="publishing accounts (default 25)")
    parser.add_argument("--subscribers", type=int, default=25, help="subscribing accounts (default 25)")
    parser.add_argument("--rate", type=float, default=20, help="messages per second in all (default 20)")
    parser.add_argument("--duration", type=float, default=180, help="seconds of publishing (default 180)")
    parser.add_argument("--drain", type=float, default=180, help="seconds allowed to deliver the rest")
    parser.add_argument("--json", default="bench-results/soak.json", help="where to write the figures")
    parser.add_argument("--keep", action="store_true", help="keep the stack's work directory (logs, Kafka, Delta)")
    args = parser.parse_args(argv)
    accounts = {f"{kind}{i}": f"{kind}{i}-pw" for kind, n in (("pub", args.publishers), ("sub", args.subscribers))
                for i in range(n)}
    try:
        result = _measure(accounts, args)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (deploy.stack.stopping_on_sigterm)
        print("soak: interrupted; the stack is stopped", flush=True)
        return 130
    print(json.dumps(result, indent=2))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    ok = result["lost"] == 0 and result["duplicated_after_ack"] == 0
    print("soak:", "no message lost, none duplicated" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
