"""Our reference client's CPU per delivery, alone (a script, not a test).

The fan-out's consumer path without the rest of the stack: ``--subscribers``
clients in one event loop log in to a scripted server (a child process on
127.0.0.1 that answers at once), ask for a notify window and each take
``--messages`` 200-byte NOTIFY MESSAGEs as the gateway renders them, through
the benchmark's adapter (``deploy.smqp_adapter``), acknowledging every one with
``310 ACK <smuid>``.  It prints the client process's CPU per delivery for each
run and the median, so a change to ``gateway/client/`` or
``gateway/client/wire.py`` is measured in seconds.  ``deploy.compare``
measures the same path inside the whole system.

On a shared machine the figures move with what else runs; compare two
versions by alternating runs of each, not one run against another.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import statistics
import subprocess
import sys
import time

from deploy import compare_workloads
from deploy.smqp_adapter import _Subscriber
from deploy.broker import free_port, wait_for_port
from deploy.compare import collecting_like_the_gateway
from gateway.client import SMQPClient
from gateway.protocol.rendering import render_notify
from schemas.events import Deliver, Section

BODY = b"x" * compare_workloads.BODY_SIZE


def notify_frame(number: int) -> bytes:
    """The gateway's NOTIFY MESSAGE of a 200-byte benchmark message."""
    return render_notify(Deliver(
        account="bench", smuid=1_412_046_798_848_000 + number, topic="/bench/fanout", cmuid=f"C{number}",
        publisher="benchpub", publisher_guid="benchpub3f9c2a1b7e40", accepted_at=1_795_000_000_000_000 + number,
        sections=[Section([("Content-Type", "application/octet-stream"), ("Content-Length", str(len(BODY)))], BODY)]),
        "localhost")


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frames: list[bytes]) -> None:
    """Greet, answer every command ``200 OK``; after SET NOTIFY WINDOW send that many NOTIFYs and
    one more for each ``310 ACK`` read, each answered ``310 ACK <smuid>`` at once."""
    writer.write(b"SMQP/1.0 Ready. client_cpu scripted server\r\n")
    sent, unread = 0, b""
    while data := await reader.read(65536):
        *lines, unread = (unread + data).split(b"\r\n")
        out: list[bytes] = []
        more = 0
        for line in filter(None, lines):
            if line.startswith(b"310 ACK"):
                out.append(line + b"\r\n\r\n")
                more += 1
            else:
                out.append(b"200 OK\r\n\r\n")
                if line.startswith(b"SET NOTIFY WINDOW "):
                    more += int(line.split()[-1])
        out += frames[sent:sent + more]
        sent = min(len(frames), sent + more)
        writer.write(b"".join(out))
    writer.close()


async def serve(port: int, messages: int) -> None:
    frames = [notify_frame(number) for number in range(messages)]
    server = await asyncio.start_server(lambda r, w: _serve_one(r, w, frames), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def one_run(port: int, subscribers: int, messages: int, window: int) -> dict:
    """Connect and log in (not counted), then set the window, which starts the NOTIFYs, and take
    everything: the client's CPU and the wall time from there."""
    clients = [await SMQPClient.open("127.0.0.1", port, f"bsub{i}", "pw") for i in range(subscribers)]
    try:
        adapters = [_Subscriber(client) for client in clients]
        tallies = [compare_workloads._Tally() for _ in clients]
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        for client in clients:
            await client.set_notify_window(window)
        await asyncio.gather(*(tally.take(adapter, messages, started + 300)
                               for tally, adapter in zip(tallies, adapters)))
        after, seconds = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - started
    finally:
        for client in clients:
            await client.close()
    delivered = sum(tally.received for tally in tallies)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"delivered": delivered, "seconds": seconds, "cpu_us_per_delivery": 1e6 * cpu / max(delivered, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.client_cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscribers", type=int, default=10, help="subscribers in the one loop (default 10)")
    parser.add_argument("--messages", type=int, default=5000, help="NOTIFYs each subscriber takes (default 5000)")
    parser.add_argument("--window", type=int, default=100, help="SET NOTIFY WINDOW (default 100)")
    parser.add_argument("--runs", type=int, default=5, help="runs (default 5)")
    parser.add_argument("--gc", choices=("gateway", "default"), default="gateway",
                        help="collector thresholds: deploy.compare's (the gateway's; default) or Python's")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the scripted server
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.serve, args.messages))
        return 0
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "deploy.client_cpu", "--serve", str(port),
                               "--messages", str(args.messages)])
    collecting = collecting_like_the_gateway() if args.gc == "gateway" else contextlib.nullcontext()
    try:
        wait_for_port("127.0.0.1", port, 30)
        readings = []
        with collecting:
            for run in range(1, args.runs + 1):
                result = asyncio.run(one_run(port, args.subscribers, args.messages, args.window))
                readings.append(result["cpu_us_per_delivery"])
                print(f"run {run}: {result['delivered']:,} deliveries in {result['seconds']:.2f} s "
                      f"({result['delivered'] / result['seconds']:,.0f}/s), client CPU "
                      f"{result['cpu_us_per_delivery']:.1f} µs per delivery", flush=True)
    finally:
        server.terminate()
        server.wait(10)
    print(f"median of {args.runs}: {statistics.median(readings):.1f} µs per delivery "
          f"(min {min(readings):.1f}, max {max(readings):.1f}; collector thresholds: {args.gc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
