"""Our engine against RabbitMQ on this machine, in one run (a script, not a test).

Starts our whole stack (a one-node Apache Kafka, streaming job, gateway: ``deploy.smqp_adapter``)
and a RabbitMQ node of its own (``deploy.rabbit``; Debian's package,
installed with apt when missing), both on 127.0.0.1, and runs the same
workloads against both with Python clients (our ``gateway.client`` and
pika), 200-byte guaranteed/persistent messages, each figure the
min/median/max of ``--runs`` runs (runs of the two systems alternate):

  ingest   acknowledged publishes (ours: 200 after Kafka acks; RabbitMQ: durable
           queue, persistent, publisher confirms), --publishers concurrent, msg/s
  latency  publish -> delivery at a steady --latency-rate for --latency-seconds,
           p50/p90/p99 ms, offered and delivered rates (bounded: what is not
           delivered --latency-grace s after the last publish counts as not delivered)
  burst    the same at --burst-rate (5,000 msg/s offered) for --burst-seconds: p99,
           and how many were not delivered
  fanout   one topic (fanout exchange) -> --fanout-subscribers acknowledging
           subscribers (ours: two-phase 310 ACK), deliveries/s
  drain    --backlog messages queued for an offline subscriber, then msg/s from
           its reconnecting to its last acknowledgement
  soak     --soak-rate msg/s for --soak-minutes (both systems at once) while the
           resident memory of each server process is sampled: growth, first vs
           last minute

Our subscribers (latency, fanout, drain, soak) ask for SET NOTIFY WINDOW
--notify-window (our pipelining extension; default: RabbitMQ's
--rabbit-prefetch, so both have as many deliveries unacknowledged at once);
--notify-window 1 measures the spec's one-at-a-time two-phase commit.

It also reports the peak resident memory of every server process: our gateway,
the Spark driver (with its JVM) and the Kafka broker's JVM, and RabbitMQ's
beam.smp.  Prints a table (ours, RabbitMQ, ratio,
the issue's target) and where our streaming job spent its time, and writes
everything as JSON.  Everything stops by itself, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import re
import resource
import shutil
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Awaitable, Iterator

from deploy import compare_workloads as workloads
from deploy.smqp_adapter import running_smqp
from deploy.broker import kafka_version
from deploy.compare_report import (LABELS, batch_stats, comparison_rows, jsonable, memory_rows, render_table,
                                   sink_stats, summarize)
from deploy.stack import cpu_seconds, host_cpu_ticks, peak_memory_mb, steal_percent, stopping_on_sigterm
from gateway.server.main import GC_THRESHOLDS

WORKLOADS = ("ingest", "latency", "burst", "fanout", "drain", "soak")
SYSTEMS = ("smqp", "rabbitmq")
#: Defaults of the full run and of ``--quick``; any flag given wins over both.
FULL = dict(runs=3, ingest_messages=20000, latency_seconds=60.0, latency_grace=60.0, burst_seconds=20.0,
            fanout_messages=5000, backlog=50000, soak_minutes=10.0, cooldown=5.0)
QUICK = dict(runs=1, ingest_messages=2000, latency_seconds=10.0, latency_grace=20.0, burst_seconds=5.0,
             fanout_messages=300, backlog=2000, soak_minutes=1.0, cooldown=2.0)


def parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true",
        help="smoke run: 1 run each, short durations, small backlog, 1-minute soak")
    add("--workloads", default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)} (default all)")
    add("--systems", default=",".join(SYSTEMS), help="comma-separated: smqp (ours), rabbitmq (default both)")
    add("--runs", type=int, help="runs per workload and system (default 3; quick 1)")
    add("--publishers", type=int, default=8, help="ingest and backlog: concurrent publishers (default 8)")
    add("--window", type=int, default=100, help="unacknowledged publishes per publisher (default 100)")
    add("--ingest-messages", type=int, help="ingest: messages per run (default 20000; quick 2000)")
    add("--latency-rate", type=float, default=1000, help="latency: offered msg/s (default 1000)")
    add("--latency-seconds", type=float, help="latency: seconds of publishing (default 60; quick 10)")
    add("--latency-grace", type=float, help="latency: seconds allowed after the last publish (default 60; quick 20)")
    add("--burst-rate", type=float, default=5000, help="burst: offered msg/s (default 5000)")
    add("--burst-seconds", type=float, help="burst: seconds of publishing (default 20; quick 5)")
    add("--fanout-subscribers", type=int, default=10, help="fanout: subscribers (default 10)")
    add("--fanout-messages", type=int, help="fanout: messages published (default 5000; quick 300)")
    add("--backlog", type=int, help="drain: messages queued (default 50000; quick 2000)")
    add("--soak-minutes", type=float, help="soak: minutes of steady load (default 10; quick 1)")
    add("--soak-rate", type=float, default=200, help="soak: msg/s (default 200)")
    add("--sample-seconds", type=float, default=5, help="soak: seconds between RSS samples (default 5)")
    add("--flat-tolerance", type=float, default=5, help="soak: growth in %% that still counts as flat (default 5)")
    add("--rabbit-prefetch", type=int, default=100, help="RabbitMQ consumers' prefetch (default 100)")
    add("--notify-window", type=int,
        help="our subscribers' SET NOTIFY WINDOW: NOTIFYs awaiting their ACK at once (default: the "
             "--rabbit-prefetch value; 1: the spec's one at a time)")
    add("--cooldown", type=float, help="seconds of rest between runs (default 5; quick 2)")
    add("--timeout", type=float, default=900, help="bound on any one workload run, seconds (default 900)")
    add("--json", default="bench-results/compare.json", help="where to write the results")
    add("--keep", action="store_true",
        help="keep the servers' work directories (logs, Kafka's log, Delta tables; up to ~700 MB a run)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.workloads = _choices(parser, "--workloads", args.workloads, WORKLOADS)
    args.systems = _choices(parser, "--systems", args.systems, SYSTEMS)
    if args.notify_window is None:
        args.notify_window = args.rabbit_prefetch
    if args.notify_window < 1:
        parser.error("--notify-window must be at least 1")
    return args


def _choices(parser: argparse.ArgumentParser, flag: str, text: str, allowed: tuple[str, ...]) -> list[str]:
    chosen = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in allowed]
    if unknown or not chosen:
        parser.error(f"{flag}: expected some of {','.join(allowed)}, got {text!r}")
    return [item for item in allowed if item in chosen]


def progress(text: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {text}", flush=True)


def _run(workload: str, system, dest: str, args, say) -> Awaitable[dict]:
    if workload == "ingest":
        return workloads.ingest(system, dest, args.ingest_messages, args.publishers, args.window, args.timeout)
    if workload in ("latency", "burst"):
        rate, seconds = ((args.latency_rate, args.latency_seconds) if workload == "latency"
                         else (args.burst_rate, args.burst_seconds))
        # up to 2 s of publishes unacknowledged before the offered rate gives way
        return workloads.paced(system, dest, rate, seconds, args.latency_grace, max(1000, int(rate * 2)), say)
    if workload == "fanout":
        return workloads.fanout(system, dest, args.fanout_subscribers, args.fanout_messages, args.window,
                                args.timeout, say)
    return workloads.drain(system, dest, args.backlog, args.publishers, args.window, args.timeout, say)


def headline(workload: str, result: dict) -> str:
    """One run's figures in a line of progress output."""
    if "error" in result:
        return f"FAILED: {result['error']}"
    if workload == "ingest":
        text = f"{result['msgs_per_s']:,} msg/s"
    elif workload in ("latency", "burst"):
        text = (f"p50 {result['p50_ms']} / p90 {result['p90_ms']} / p99 {result['p99_ms']} ms; offered "
                f"{result['offered_per_s']:,}/s, delivered {result['delivered']:,} of {result['sent']:,} "
                f"({result['delivered_per_s']:,}/s)")
    elif workload == "fanout":
        text = (f"{result['deliveries_per_s']:,} deliveries/s "
                f"({result['deliveries']:,} of {result['deliveries_expected']:,})")
    else:
        text = f"{result['msgs_per_s']:,} msg/s ({result['delivered']:,} of {result['backlog']:,})"
    if "ack_cycle_ms_mean" in result:
        text += f"; NOTIFY -> 310 ACK cycle {result['ack_cycle_ms_mean']} ms"
    if per := cpu_per_message(workload, result):
        text += "; CPU µs/msg: " + ", ".join(f"{name} {us:,}" for name, us in per.items())
    if result.get("settled_after_s"):
        text += f"; job done {result['settled_after_s']} s later"
    if "steal_pct" in result:
        text += f"; host steal {result['steal_pct']} %"
    return text


#: What each workload's CPU is divided by: the messages it counts in its figure.
CPU_UNITS = {"ingest": "published", "latency": "delivered", "burst": "delivered", "fanout": "deliveries",
             "drain": "delivered"}
CLIENTS = "benchmark clients"


def cpu_reading(system) -> dict[str, float]:
    """CPU seconds used so far by each of ``system``'s server processes, and by this process (the
    benchmark's clients, which share the machine's cores with the servers)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {**{name: cpu_seconds(pid) for name, pid in system.processes().items()},
            CLIENTS: usage.ru_utime + usage.ru_stime}


def cpu_per_message(workload: str, result: dict) -> dict[str, float]:
    """Microseconds of CPU per message the workload counted, per process (and in all)."""
    messages = result.get(CPU_UNITS[workload]) or 0
    if not messages or "cpu_s" not in result:
        return {}
    per = {name: round(1e6 * seconds / messages) for name, seconds in result["cpu_s"].items()}
    return {**per, "all": sum(per.values())}


async def _ack_cycle(system) -> dict:
    with contextlib.suppress(Exception):  # a status page that does not answer costs only this figure
        return (await system.observe()).get("ack_cycle", {})
    return {}


async def measure(workload: str, run: int, name: str, system, args) -> dict:
    """One run of ``workload`` on one system; a failure is recorded with its error.  Afterwards our
    job is let finish the run's messages (so the next run, of either system, starts on a quiet
    machine), and the gateway's mean NOTIFY -> 310 ACK cycle over the run is added."""
    say = lambda text: progress(f"  {LABELS[name]}: {text}")  # noqa: E731
    progress(f"{workload} run {run}/{args.runs}: {LABELS[name]} ...")
    dest = f"{workload}_r{run}"
    before, load, started = await _ack_cycle(system), os.getloadavg()[0], time.time()
    cpu_before, host_before = cpu_reading(system), host_cpu_ticks()
    try:
        result = await _run(workload, system, dest, args, say)
    except Exception as error:  # noqa: BLE001 - recorded, and the other runs go on
        result = {"error": f"{type(error).__name__}: {error}"}
    else:
        result["cpu_s"] = {name: round(seconds - cpu_before[name], 2) for name, seconds in cpu_reading(system).items()}
        result["steal_pct"] = steal_percent(host_before, host_cpu_ticks())
    if result.get("published"):
        with contextlib.suppress(Exception):
            result["settled_after_s"] = round(await system.settle(dest, result["published"], args.timeout), 1)
    after = await _ack_cycle(system)
    if after.get("count", 0) > before.get("count", 0):
        result["ack_cycle_ms_mean"] = round(
            1000 * (after["sum"] - before.get("sum", 0)) / (after["count"] - before.get("count", 0)), 2)
    result.update(run=run, load_avg_1m=round(load, 2), started=started, wall_s=round(time.time() - started, 1))
    say(headline(workload, result))
    return result


async def run_workloads(systems: dict, args) -> dict:
    """Every selected workload, ``args.runs`` times per system, the systems alternating who goes first."""
    for name, system in systems.items():
        progress(f"warming up {LABELS[name]}: 100 messages at 20 msg/s, until all are delivered ...")
        await workloads.warm_up(system, LABELS[name], args.timeout)
    results: dict = {}
    for workload in [w for w in args.workloads if w != "soak"]:
        results[workload] = {name: [] for name in systems}
        for run in range(1, args.runs + 1):
            for name in (list(systems) if run % 2 else list(reversed(systems))):
                results[workload][name].append(await measure(workload, run, name, systems[name], args))
                await asyncio.sleep(args.cooldown)
    if "soak" in args.workloads:
        progress(f"soak: {args.soak_rate:g} msg/s for {args.soak_minutes:g} min on "
                 f"{' and '.join(LABELS[n] for n in systems)} at once, "
                 f"sampling RSS every {args.sample_seconds:g} s ...")
        started = time.time()
        soaks = await asyncio.gather(*(
            workloads.soak(system, "soak", system.processes(), args.soak_minutes, args.soak_rate, args.sample_seconds,
                           lambda text, name=name: progress(f"  {LABELS[name]}: {text}"))
            for name, system in systems.items()), return_exceptions=True)
        wall_s = round(time.time() - started, 1)
        results["soak"] = {name: [{"error": f"{type(s).__name__}: {s}"} if isinstance(s, BaseException) else
                                  {**s, "started": started, "wall_s": wall_s}] for name, s in zip(systems, soaks)}
        for name, [result] in results["soak"].items():
            growth = ", ".join(f"{process} {g['first_mb']:,.0f} -> {g['last_mb']:,.0f} MiB ({g['growth_pct']:+.1f} %)"
                               for process, g in result.get("rss_growth", {}).items() if g)
            progress(f"  {LABELS[name]}: soak " + (f"FAILED: {result['error']}" if "error" in result else
                                                   f"RSS first -> last minute: {growth}"))
    return results


#: The sink's line per micro-batch in the job's log (streaming/sink/command_sink.py), timestamped when the batch ended.
SINK_LINE = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ INFO streaming\.sink: batch \d+: "
                       r"(?P<records>\d+) records in, .* (?P<ms>\d+) ms \(spark (?P<spark_ms>\d+), "
                       r"delta (?P<delta_ms>\d+)\)(?:; routing query: plan (?P<plan_ms>\d+) ms, run (?P<run_ms>\d+) ms)?")


def job_time(table: str, job_log: str, results: dict) -> dict:
    """Where our streaming job's time went during each workload (the batches that started, or for
    the sink ended, within one of our runs of it): Spark's phases from the job's ``metrics`` Delta
    ``table``, and the sink's own split (Spark / Delta / Kafka) from its log."""
    from deltalake import DeltaTable

    batches = DeltaTable(table).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(table) else []
    for row in batches:
        stamp = row["timestamp"]
        row["at"] = (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).timestamp()
    sink = []
    with contextlib.suppress(OSError), open(job_log, errors="replace") as log:
        for line in log:
            if match := SINK_LINE.match(line):
                fields = match.groupdict()
                sink.append({"at": datetime.strptime(fields.pop("at"), "%Y-%m-%d %H:%M:%S").timestamp(),
                             **{key: int(value) for key, value in fields.items() if value is not None}})
    per_workload = {}
    for workload, per_system in results.items():
        spans = [(run["started"], run["started"] + run["wall_s"]) for run in per_system.get("smqp", ())
                 if "started" in run]
        within = lambda rows: [r for r in rows if any(a <= r["at"] <= b for a, b in spans)]  # noqa: E731
        if spans:
            per_workload[workload] = {"batches": batch_stats(within(batches)), "sink": sink_stats(within(sink))}
    return per_workload


def render_cpu(results: dict) -> str:
    """Median CPU microseconds per message, per workload, system and process: where the 2 cores went."""
    lines = ["| workload | system | CPU µs per message, per process (median of runs) |", "|---|---|---|"]
    for workload, per_system in results.items():
        if workload not in CPU_UNITS:
            continue
        for name, runs in per_system.items():
            readings = [cpu_per_message(workload, run) for run in runs]
            readings = [r for r in readings if r]
            if readings:
                medians = {process: summarize(r.get(process, 0) for r in readings)["median"]
                           for process in readings[0]}
                lines.append(f"| {workload} | {LABELS[name]} | "
                             + ", ".join(f"{process} {us:,.0f}" for process, us in medians.items()) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def render_job_time(per_workload: dict) -> str:
    lines = ["| our job during | batches | rows / busy batch | batch p50 / p90 / max ms | share of batch time "
             "| sink (addBatch): Spark / Delta / Kafka wait | Spark: planning / running the routing query |",
             "|---|---|---|---|---|---|---|"]
    for workload, both in per_workload.items():
        stats, sink = both["batches"], both["sink"]
        if not stats:
            continue
        shares = ", ".join(f"{phase.removesuffix('_ms')} {pct:g} %" for phase, pct in
                           sorted(stats["phase_share_pct"].items(), key=lambda item: -item[1]) if pct >= 1)
        split = f"{sink['spark_pct']:g} / {sink['delta_pct']:g} / {sink['kafka_wait_pct']:g} %" if sink else "-"
        query = (f"{sink['plan_pct']:g} / {sink['run_pct']:g} %" if sink and sink.get("plan_pct") is not None
                 else "-")
        lines.append(f"| {workload} | {stats['batches']} | {stats['rows_per_busy_batch']:,} | "
                     f"{stats['batch_ms_p50']:,.0f} / {stats['batch_ms_p90']:,.0f} / {stats['batch_ms_max']:,.0f} | "
                     f"{shares}, other {stats['other_pct']:g} % | {split} | {query} |")
    return "\n".join(lines)


def durability(smqp) -> dict[str, str]:
    """What each side has done with a message by the time it acknowledges it."""
    flushes = smqp is not None and smqp.stack.broker.settings.flush_every_message
    return {"smqp": "200 once Kafka (acks=all) has the record "
                    + ("fsynced to disk ([local_kafka] flush_every_message = true)" if flushes else
                       "in the page cache of every in-sync replica (one node here), not fsynced: Kafka's default"),
            "rabbitmq": "confirm once the persistent message is fsynced to disk"}


def _versions(rabbit_server) -> dict:
    versions = {"python": platform.python_version()}
    for package in ("pika", "pyspark", "kafka-python", "deltalake"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    versions["kafka"] = kafka_version()
    if rabbit_server is not None:
        versions["rabbitmq"] = rabbit_server.version()
    return versions


def measure_all(args) -> dict:
    """Start the selected systems, run the workloads, read the peaks; the servers are stopped
    however this ends.  Returns the report (everything but the table)."""
    started = datetime.now(timezone.utc)
    load_before = os.getloadavg()
    accounts = args.runs * (3 + args.fanout_subscribers) + 2  # latency, burst, fanout, drain per run; warm-up, soak
    rabbit_server = smqp = None
    with contextlib.ExitStack() as servers:
        systems = {}
        if "smqp" in args.systems:
            progress("starting our stack (Kafka, streaming job, gateway) ...")
            smqp = systems["smqp"] = servers.enter_context(running_smqp(accounts, args.notify_window))
            progress(f"  up; logs in {smqp.stack.workdir}{_kept(args)}; "
                     f"our subscribers use {_window_text(args.notify_window)}")
        if "rabbitmq" in args.systems:
            try:
                from deploy import rabbit
            except ImportError as error:
                raise SystemExit(f"{error}: install the 'bench' extra (pip install -e '.[bench]')") from None
            progress("starting RabbitMQ ...")
            rabbit_server = servers.enter_context(rabbit.running_rabbitmq(progress))
            systems["rabbitmq"] = rabbit.RabbitSystem(rabbit_server, args.rabbit_prefetch)
            progress(f"  up on 127.0.0.1:{rabbit_server.port}; data and logs in {rabbit_server.workdir}{_kept(args)}")
        versions = _versions(rabbit_server)
        results = asyncio.run(run_workloads(systems, args))
        peaks = {name: {process: peak_memory_mb(pid) for process, pid in system.processes().items()}
                 for name, system in systems.items()}
        progress("stopping the servers ...")
    report = {
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "load_avg_before": load_before, "load_avg_after": os.getloadavg()},
        "versions": versions, "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "peak_memory_mb": peaks, "results": results, "durability": durability(smqp),
        # after the stop: the job has flushed its last micro-batches' metrics
        "smqp_job_time": _job_time(smqp.stack, results) if smqp else {},
    }
    if not args.keep:  # read above: the job's log and metrics table
        for server in (smqp.stack if smqp else None, rabbit_server):
            if server is not None:
                shutil.rmtree(server.workdir, ignore_errors=True)
    return report


def _kept(args) -> str:
    return "" if args.keep else " (removed at the end; --keep keeps them)"


def _job_time(stack, results: dict) -> dict:
    try:
        return job_time(stack.config.table_path("metrics"), f"{stack.workdir}/job.log", results)
    except Exception as error:  # noqa: BLE001 - the measurements stand without it
        progress(f"could not read where our job's time went: {error}")
        return {}


@contextlib.contextmanager
def collecting_like_the_gateway() -> Iterator[None]:
    """The clients' process collects garbage at the gateway's thresholds while the workloads run.

    Why: both systems' clients run in this one process, and at Python's default thresholds its
    collector took ~20 % of our client's CPU in a fan-out (a read of a window's NOTIFYs makes
    hundreds of objects at once, so young collections came every few reads and full ones walked
    the process's ~40,000 objects); pika's clients spent 6 % less CPU per delivery without it.
    What is measured is the brokers, not the load generator's collector."""
    previous = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)


def main(argv: list[str] | None = None, prog: str = "python -m deploy.compare") -> int:
    args = parse_args(argv, prog)
    try:
        with stopping_on_sigterm(), collecting_like_the_gateway():  # the servers are stopped on SIGTERM too
            report = measure_all(args)
    except KeyboardInterrupt:
        progress("interrupted; the servers are stopped")
        return 130
    write_json(args.json, report)  # the measurements are safe before anything is computed from them
    settings = {"publishers": args.publishers, "latency_rate": args.latency_rate, "burst_rate": args.burst_rate,
                "fanout_subscribers": args.fanout_subscribers, "backlog": f"{args.backlog:,}",
                "soak_rate": args.soak_rate}
    results = report["results"]
    soak = {name: runs[0].get("rss_growth", {}) for name, runs in results.get("soak", {}).items()}
    report["rows"] = rows = (comparison_rows(results, settings)
                             + memory_rows(report["peak_memory_mb"], soak, args.flat_tolerance))
    print("\n" + render_table(rows))
    print("\nDurability: " + "; ".join(f"{LABELS[name]}: {text}" for name, text in report["durability"].items()
                                         if name in args.systems))
    if "smqp" in args.systems:
        print(f"\nOur subscribers: {_window_text(args.notify_window)}"
              + (f"; RabbitMQ's consumers: prefetch {args.rabbit_prefetch}." if "rabbitmq" in args.systems else "."))
    if cpu := render_cpu(results):
        print(f"\nCPU per message (per {', '.join(f'{w}: {u}' for w, u in CPU_UNITS.items())}):\n" + cpu)
    if any(both["batches"] for both in report["smqp_job_time"].values()):
        print("\nWhere our streaming job's time went, per workload (its metrics table and log):\n"
              + render_job_time(report["smqp_job_time"]))
    write_json(args.json, report)
    print(f"\nwritten to {args.json}")
    return 0


def _window_text(window: int) -> str:
    if window == 1:
        return "SET NOTIFY WINDOW 1, the spec's two-phase commit: one NOTIFY at a time, each awaiting its 310 ACK"
    return (f"SET NOTIFY WINDOW {window} (our pipelining extension): up to {window} NOTIFYs awaiting "
            "their 310 ACK <smuid> at once")


def write_json(path: str, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(jsonable(report), indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
