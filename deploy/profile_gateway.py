"""Where the gateway's CPU goes per delivery: py-spy samples it through one benchmark workload.

Starts our stack (``deploy.smqp_adapter``), runs ``--workload`` (fan-out by
default: one publisher, 10 subscribers acknowledging every message; ingest: 8
publishers to a topic nobody reads; latency: ``--rate`` messages a second
to one subscriber, each alone; drain: a backlog to one subscriber; the
benchmark's own code) while ``py-spy record`` samples the gateway process, and
writes the samples as collapsed stacks (``<out>.raw.txt``: open it in
https://www.speedscope.app for the flame graph).  Then prints, and writes to
``<out>.txt``, the functions that cost the most CPU in microseconds per
delivery (a publish, for ingest): *self* (in the function itself) and *total* (with what it calls).

    python -m deploy.profile_gateway                       # fan-out, 5,000 messages x 10 subscribers
    python -m deploy.profile_gateway --workload drain --messages 20000
    python -m deploy.profile_gateway --workload ingest --messages 50000
    python -m deploy.profile_gateway --workload latency --messages 20000 --pace 1000

py-spy comes with the 'bench' extra.  It reads the gateway's memory from outside
(ptrace), so the gateway runs unchanged; sampling costs it nothing measurable.
Only samples that hold the GIL count (``--gil``): py-spy samples wall-clock time,
and on a host whose cores are all busy a thread that wakes Kafka with a
``send`` is often descheduled inside that call, GIL released.  Without
``--gil`` that wait for a core showed as 36 % of the gateway's "CPU" in
``socket.send``, where ``perf`` measured 4.5 % of its CPU in the kernel.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

from deploy import compare_workloads as workloads
from deploy.smqp_adapter import running_smqp
from deploy.stack import stopping_on_sigterm


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.profile_gateway", description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("fanout", "ingest", "latency", "drain"), default="fanout")
    parser.add_argument("--messages", type=int, default=5000, help="messages published (default 5000)")
    parser.add_argument("--subscribers", type=int, default=10, help="fan-out: subscribers (default 10)")
    parser.add_argument("--window", type=int, default=100, help="publish window and SET NOTIFY WINDOW (default 100)")
    parser.add_argument("--pace", type=int, default=1000, help="latency: messages a second (default 1000)")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second (default 200)")
    parser.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    parser.add_argument("--out", default="bench-results/profile-gateway",
                        help="path prefix of the .txt and .raw.txt written (default bench-results/profile-gateway)")
    return parser.parse_args(argv)


LINE_NUMBER = re.compile(r":\d+\)$")


def _py_spy() -> str | None:
    """py-spy's executable: beside this Python's (a virtualenv not activated), else on the PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def collapsed(lines: Iterable[str]) -> list[tuple[list[str], int]]:
    """py-spy's raw output ("frame;frame;frame count" per line) as (frames, samples), root first; a
    frame is "function (file)": the line number is left out, so a function's lines add up."""
    stacks = []
    for line in lines:
        frames, _, count = line.rstrip("\n").rpartition(" ")
        if frames and count.isdigit():
            stacks.append(([LINE_NUMBER.sub(")", frame) for frame in frames.split(";")], int(count)))
    return stacks


def costs(stacks: list[tuple[list[str], int]]) -> tuple[collections.Counter, collections.Counter, int]:
    """Samples per function: where it was the running frame (self), and where it was on the stack
    at all (total, counted once per sample however deep it recurses); and all samples."""
    own, total, samples = collections.Counter(), collections.Counter(), 0
    for frames, count in stacks:
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    return own, total, samples


#: The packages whose functions the "total" list shows (the event loop's frames are on every stack).
OURS = ("gateway/", "kafka_edge/", "schemas/")


def _ours(frame: str) -> bool:
    return frame.partition(" (")[2].startswith(OURS)


def table(stacks: list[tuple[list[str], int]], rate: int, deliveries: int, top: int) -> str:
    """The ``top`` functions by self time, and our ``top`` functions by total time, in µs of gateway
    CPU per delivery."""
    own, total, samples = costs(stacks)
    total = collections.Counter({frame: n for frame, n in total.items() if _ours(frame)})
    per = 1e6 / rate / max(1, deliveries)  # µs of CPU one sample stands for, per delivery
    lines = [f"{samples:,} samples at {rate}/s = {samples / rate:.1f} s of gateway CPU for {deliveries:,} "
             f"deliveries: {samples * per:.1f} µs per delivery", "", "self µs/delivery  function"]
    lines += [f"{n * per:16.2f}  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "total µs/delivery  function (with what it calls)"]
    lines += [f"{n * per:17.2f}  {frame}" for frame, n in total.most_common(top)]
    return "\n".join(lines)


async def _workload(system, args) -> dict:
    say = lambda text: print(f"  {text}", flush=True)  # noqa: E731
    if args.workload == "fanout":
        return await workloads.fanout(system, "profile", args.subscribers, args.messages, args.window, 900, say)
    if args.workload == "ingest":
        return await workloads.ingest(system, "profile", args.messages, 8, args.window, 900)
    if args.workload == "latency":
        return await workloads.paced(system, "profile", args.pace, args.messages / args.pace, 60,
                                     max(1000, 2 * args.pace), say)
    return await workloads.drain(system, "profile", args.messages, 8, args.window, 900, say)


async def _sampled(system, args, out: Path) -> tuple[dict, float]:
    """Warm the stack up, then run the workload while py-spy samples the gateway."""
    await workloads.warm_up(system, "ours", 120)
    raw = out.with_suffix(".raw.txt")
    spy = subprocess.Popen([_py_spy(), "record", "--pid", str(system.processes()["gateway"]),
                            "--rate", str(args.rate), "--format", "raw", "--output", str(raw), "--nonblocking", "--gil"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    await asyncio.sleep(1.0)  # py-spy attached
    started = time.monotonic()
    try:
        result = await _workload(system, args)
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        await asyncio.to_thread(spy.wait, 60)
    if spy.returncode not in (0, -signal.SIGINT):
        raise SystemExit(f"py-spy failed ({spy.returncode}): {spy.stderr.read().decode()[-500:]}")
    return result, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not _py_spy():
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    subscribers = args.subscribers if args.workload == "fanout" else 0 if args.workload == "ingest" else 1
    with stopping_on_sigterm(), running_smqp(subscribers + 1, args.window) as system:
        print(f"stack up (logs in {system.stack.workdir}); {args.workload} with py-spy on the gateway ...", flush=True)
        result, seconds = asyncio.run(_sampled(system, args, out))
    deliveries = result.get("deliveries") or result.get("delivered") or result.get("published") or 0
    stacks = collapsed(out.with_suffix(".raw.txt").read_text().splitlines())
    report = table(stacks, args.rate, deliveries, args.top)
    header = (f"{args.workload}: {deliveries:,} deliveries in {seconds:.1f} s "
              f"({result.get('deliveries_per_s') or result.get('msgs_per_s') or result.get('delivered_per_s')}/s)\n")
    out.with_suffix(".txt").write_text(header + report + "\n")
    print(header + report)
    print(f"\nwritten: {out.with_suffix('.txt')}, {out.with_suffix('.raw.txt')} (collapsed stacks: "
          "open in https://www.speedscope.app or flamegraph.pl)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
