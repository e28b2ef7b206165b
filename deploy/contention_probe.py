"""How much of publish → NOTIFY latency is the streaming job's CPU on the gateway's host.

    python -m deploy.contention_probe [--rate 1000] [--seconds 30] [--rounds 2] [--modes running,idle,stopped]
                                      [--json PATH]   # ~10 minutes

Why: at 1,000 msg/s the benchmark's NOTIFY p99 missed issue 35's 20 ms. The gateways route a
DELIVERY ALL message without the job, so the job is not on that path. It still shares the two cores,
and at that rate it takes half a core or more. This probe starts one stack and runs the benchmark's
paced workload (``deploy.compare_workloads.paced``: one publisher, one subscriber acknowledging
each message, window 100) once per mode in each round, the modes in turn:

- ``running``: the job as configured (``[streaming] nice``);
- ``idle``: every thread of the job's process tree (its driver, JVM and Python workers) in Linux's
  ``SCHED_IDLE`` class, which runs only on CPU no other process wants, and which a waking gateway
  preempts at once, where a niced job finishes its time slice first;
- ``stopped``: the job's whole process tree stopped (SIGSTOP).

After each run the job is put back and given 50 s to route what it missed, so the next run starts
on a quiet job. It prints each run's p50 / p90 / p99 and the CPU share (cores) the job and the
gateway used while it ran. Bounded: ``--rounds`` × the modes' runs of ``--seconds``, on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time
from typing import Iterator

from deploy import compare_workloads as workloads
from deploy.smqp_adapter import SMQPSystem, running_smqp
from deploy.stack import cpu_seconds, process_tree, stopping_on_sigterm

MODES = ("running", "idle", "stopped")
#: a resumed job routes the run's backlog before the next run: ~40,000 commands after a 20-30 s
#: run stopped, which took it 5-40 s (2026-12-07, its log)
CATCH_UP_S = 50.0
GRACE_S = 30.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.contention_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=1000, help="messages a second (default 1000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each run (default 30)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each running every mode once (default 2)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, run in this order each round (default {','.join(MODES)})")
    parser.add_argument("--json", help="also write the runs to this file")
    args = parser.parse_args(argv)
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not args.modes or set(args.modes) - set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    return args


def _signal_tree(pid: int, signum: int) -> None:
    for current in process_tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(current, signum)


def _schedule_tree(pid: int, policy: int) -> None:
    """Every thread of ``pid``'s process tree under ``policy`` (its nice value is kept); the processes
    a thread starts later inherit it."""
    for current in process_tree(pid):
        with contextlib.suppress(FileNotFoundError):  # the process ended
            for thread in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(ProcessLookupError):  # the thread ended
                    os.sched_setscheduler(int(thread), policy, os.sched_param(0))


@contextlib.contextmanager
def _job_as(mode: str, job: int) -> Iterator[None]:
    """The job's processes ``mode`` (:data:`MODES`) while the block runs, then as they were."""
    if mode == "stopped":
        _signal_tree(job, signal.SIGSTOP)
    elif mode == "idle":
        _schedule_tree(job, os.SCHED_IDLE)
    try:
        yield
    finally:
        _signal_tree(job, signal.SIGCONT)
        _schedule_tree(job, os.SCHED_OTHER)


async def _one_run(system: SMQPSystem, mode: str, dest: str, args: argparse.Namespace) -> dict:
    job, gateway = system.processes()["Spark driver + JVM"], system.processes()["gateway"]
    began = time.strftime("%H:%M:%S", time.gmtime())
    with _job_as(mode, job):
        before, started = (cpu_seconds(job), cpu_seconds(gateway)), time.monotonic()
        result = await workloads.paced(system, dest, args.rate, args.seconds, GRACE_S, 2 * args.rate,
                                       lambda _text: None)
        after, seconds = (cpu_seconds(job), cpu_seconds(gateway)), time.monotonic() - started
    return {"mode": mode, "began_utc": began, "sent": result["sent"], "delivered": result["delivered"],
            **{key: result[key] for key in ("p50_ms", "p90_ms", "p99_ms")},
            "job_cores": round((after[0] - before[0]) / seconds, 2),
            "gateway_cores": round((after[1] - before[1]) / seconds, 2)}


async def _runs(system: SMQPSystem, args: argparse.Namespace) -> list[dict]:
    await workloads.warm_up(system, "ours", 120)
    runs = []
    for round_ in range(1, args.rounds + 1):
        for index, mode in enumerate(args.modes):
            run = {"round": round_, **await _one_run(system, mode, f"contention{round_}{index}", args)}
            print(f"[{run['began_utc']}] round {round_}, job {mode}: p50 {run['p50_ms']} / p90 {run['p90_ms']} / p99 {run['p99_ms']} ms, "
                  f"delivered {run['delivered']:,} of {run['sent']:,}; job {run['job_cores']} cores, "
                  f"gateway {run['gateway_cores']}", flush=True)
            runs.append(run)
            await asyncio.sleep(CATCH_UP_S)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    accounts = len(args.modes) * args.rounds + 1  # a subscriber of its own for the warm-up and each run
    with stopping_on_sigterm(), running_smqp(accounts + 1, 100) as system:
        print(f"stack up (logs in {system.stack.workdir}); {args.rounds} rounds of {args.seconds:g} s "
              f"at {args.rate:,} msg/s, the job {', '.join(args.modes)} in turn ...", flush=True)
        runs = asyncio.run(_runs(system, args))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rate": args.rate, "seconds": args.seconds, "modes": args.modes, "runs": runs}, out, indent=1)
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
