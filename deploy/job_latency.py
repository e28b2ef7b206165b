"""How fast the streaming job is, measured on the whole stack: its latency targets, per Kafka source.

``python -m deploy.job_latency`` starts a one-node Kafka, the streaming job and one gateway on
127.0.0.1 (:mod:`deploy.stack`), warms them up, and measures, through the reference client:

- **batch time**: each micro-batch's duration while one publisher sends a steady ``--rate``
  (1,000 msg/s) to a topic nobody subscribes to (with ``--subscribed``, one that a subscriber ACKs
  each message of), and the part of it spent planning the routing
  query.  From the job's log line per batch (``streaming/sink/command_sink.py``: the foreachBatch sink's total,
  its Spark / Delta split and the routing query's plan / run) and from the ``metrics`` Delta table
  (Spark's whole trigger and its phases).  Target: a batch of ≤ 1,000 commands takes ≤ 300 ms.
- **visibility**: from a PUBLISH's ``200`` until ``GET MESSAGE`` through the gateway returns it
  (polled every ``--poll-ms``), and until the job's commit of it to the ``messages`` Delta table
  (the commit file's time).  Target: p99 ≤ 2 s.
- **DELIVERY ONE**: from a PUBLISH's ``200`` until the NOTIFY reaches the one subscriber of a topic
  set to DELIVERY ONE (which the job routes; the gateway routes only DELIVERY ALL early).
  Target: p99 ≤ 1 s.
- **expiry**: a message published with ``Timeout: 00:00:00:02`` to a topic whose one subscriber is
  offline (so it is never ACKed): from its ``200`` until ``LIST MESSAGE <topic>/Trash`` lists it,
  and until the job's commit of it to the ``trash`` table.  Target: ≤ 3 s.

The last three are sampled, ``--samples`` messages each, once at low load (the three probes take
turns: one message every ``--gap`` seconds in all) and once while the ``--rate`` load runs (the
probes side by side, each one's samples spread over the load, never closer than ``--gap``).  A sample not seen
within ``--grace`` seconds counts as infinitely late.  Everything is bounded in count and time; the
stack (and the load generator, a process of its own) is stopped however the script ends, Ctrl-C
and SIGTERM included.  ``--source`` picks ``[streaming] source``: ``python`` (our Python Data
Source) or ``kafka`` (Spark's Kafka connector); ``--alternate`` runs both, one after the other,
``--runs`` times each: this host's speed drifts about 2x minute to minute, so compare the two only
across alternating runs.  Results go to ``bench-results/job-latency-<date>-<label>.json``.

This module runs the stack and the probes; :mod:`deploy.job_latency_report` turns what they
collected into the figures and the printed tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import date, datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Iterable, Mapping

from deploy.compare_report import jsonable, latency_summary
from deploy.job_latency_report import (cell, committed_batch, medians, parse_sink_line, render_medians, render_table,
                                       sink_figures, spark_figures, started_within)
from deploy.stack import host_cpu_ticks, steal_percent
from schemas.config import StreamingConfig

SOURCES = ("python", "kafka")
T_VIS, T_ONE, T_EXP, T_LOAD = "/lat/vis", "/lat/one", "/lat/exp", "/lat/load"
EXPIRY_TIMEOUT = "00:00:00:02"  # the expiry probe's Timeout header: 2 s
PUBLISHER, SUBSCRIBER, OFFLINE, LOADER, LOAD_SUBSCRIBER = "latpub", "latone", "latexp", "latload", "latsub"
ACCOUNTS = {name: f"{name}-pw" for name in (PUBLISHER, SUBSCRIBER, OFFLINE, LOADER, LOAD_SUBSCRIBER)}

def run_order(source: str, runs: int, alternate: bool) -> list[str]:
    """The sources of the runs, in order: ``python, kafka, python, kafka`` for 2 alternating runs."""
    return [s for _ in range(runs) for s in (SOURCES if alternate else (source,))]


def env_settings(settings: Iterable[str]) -> dict[str, str]:
    """``section.key=value`` → ``{"SMQP_SECTION_KEY": "value"}`` (the stack's processes read these)."""
    env = {}
    for setting in settings:
        name, equals, value = setting.partition("=")
        section, dot, key = name.partition(".")
        if not equals or not dot or not section or not key:
            raise ValueError(f"--set wants section.key=value, not {setting!r}")
        env[f"SMQP_{section.upper()}_{key.upper()}"] = value
    return env


def result_path(directory: str | os.PathLike, day: str, label: str) -> Path:
    """``<directory>/job-latency-<day>-<label>.json``, or with ``-2``, ``-3`` … when that exists."""
    path = Path(directory, f"job-latency-{day}-{label}.json")
    n = 2
    while path.exists():
        path = Path(directory, f"job-latency-{day}-{label}-{n}.json")
        n += 1
    return path


# -- the probes

@dataclass
class Sample:
    smuid: int
    sent: float  # wall clock (s) when the PUB left
    replied: float  # … when its 200 came back
    seen: float | None = None  # … when GET / NOTIFY / LIST showed it
    committed: float | None = None  # … when the job's Delta commit holding it appeared


def latencies(samples: Iterable[Sample], attribute: str) -> dict:
    """``latency_summary`` of ``attribute - replied`` in ms; a sample without it is never seen."""
    samples = list(samples)
    got = [(getattr(s, attribute) - s.replied) * 1000 for s in samples if getattr(s, attribute) is not None]
    return latency_summary(got, len(samples))


class _Receiver:
    """A subscriber that notes when each NOTIFY arrived, then ACKs it (two-phase): the DELIVERY ONE
    probe's, and with ``--subscribed`` the load's."""

    def __init__(self, client):
        self.client = client
        self.arrivals: dict[int, float] = {}
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                note = await self.client.next_notification()
                self.arrivals.setdefault(note.smuid, time.time())
                await note.ack()
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - reported with the samples it leaves unseen
            self.error = error

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class Probes:
    """The three sampled figures: a publisher connection per probe, one that polls GET MESSAGE, one
    that polls LIST MESSAGE …/Trash, and the DELIVERY ONE subscriber, logged in throughout."""

    def __init__(self, address, args):
        self.address, self.args = address, args

    async def open(self) -> Probes:
        from gateway.client import SMQPClient

        opened = lambda name: SMQPClient.open(*self.address, name, ACCOUNTS[name])  # noqa: E731
        async with await opened(PUBLISHER) as admin:
            for topic in (T_VIS, T_ONE, T_EXP, T_LOAD):
                await admin.create_topic(topic)
            await admin.command("SET", "TOPIC", "DELIVERY", T_ONE, "ONE")
        async with await opened(OFFLINE) as offline:  # subscribed, then gone: nobody ACKs what expires
            await offline.subscribe(T_EXP)
            await offline.quit()
        subscriber = await opened(SUBSCRIBER)
        await subscriber.subscribe(T_ONE)
        self.receiver = _Receiver(subscriber)
        self.publishers = {topic: await opened(PUBLISHER) for topic in (T_VIS, T_ONE, T_EXP)}
        # a connection of its own for each poller: a slow GET never holds a LIST's reply back
        self.readers = {topic: await opened(PUBLISHER) for topic in (T_VIS, T_EXP)}
        return self

    async def close(self) -> None:
        await self.receiver.close()
        for client in (self.receiver.client, *self.readers.values(), *self.publishers.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.quit(), 5)
            await client.close()

    async def _visible(self, smuids: list[int]) -> set[int]:
        from gateway.client import SMQPError

        try:
            return {m.smuid for m in await self.readers[T_VIS].get_messages(T_VIS, smuids)}
        except SMQPError as error:
            if error.code == 404:
                return set()
            raise

    async def _trashed(self, smuids: list[int]) -> set[int]:
        from gateway.client import SMQPError

        try:
            return set(await self.readers[T_EXP].list_messages(f"{T_EXP}/Trash"))
        except SMQPError as error:
            if error.code == 404:
                return set()
            raise

    async def _notified(self, smuids: list[int]) -> set[int]:
        if self.receiver.error is not None:
            raise RuntimeError(f"the DELIVERY ONE subscriber failed: {self.receiver.error!r}")
        return {s for s in smuids if s in self.receiver.arrivals}

    async def run(self, count: int, stop_at: float, *, interleaved: bool, stretch: float = 1.0
                  ) -> dict[str, list[Sample]]:
        """``count`` samples of each probe (fewer if ``stop_at``, a monotonic time, comes first),
        then up to ``--grace`` seconds for the last ones to be seen.  ``interleaved``: one message
        every ``--gap`` in all, the probes taking turns (low load: the probes are all the traffic);
        else each probe at that pace times ``stretch``, side by side (under load: spread over it)."""
        gap = (self.args.gap[0] * stretch, self.args.gap[1] * stretch)
        tracks = [_Track("visibility", T_VIS, (), self._visible, self.args.poll_ms / 1000),
                  _Track("delivery_one", T_ONE, (), self._notified, 0.005),
                  _Track("expiry", T_EXP, [("Timeout", EXPIRY_TIMEOUT)], self._trashed, self.args.poll_ms / 1000)]
        pollers = [asyncio.create_task(track.poll(self.args.grace)) for track in tracks]
        try:
            if interleaved:
                await self._publish([track for _ in range(count) for track in tracks], stop_at, gap)
            else:
                await asyncio.gather(*(self._publish([track] * count, stop_at, gap) for track in tracks))
            for track in tracks:
                track.done.set()
            await asyncio.gather(*pollers)
        finally:
            for poller in pollers:
                poller.cancel()
        for sample in tracks[1].samples.values():  # a NOTIFY may come before our 200 is handled
            sample.seen = self.receiver.arrivals.get(sample.smuid, sample.seen)
        return {track.name: list(track.samples.values()) for track in tracks}

    async def _publish(self, turns: list[_Track], stop_at: float, gap: tuple[float, float]) -> None:
        for i, track in enumerate(turns):
            if time.monotonic() >= stop_at:
                break
            sent = time.time()
            smuid = await self.publishers[track.topic].publish(track.topic, f"{track.name} {i} sent {sent:.6f}",
                                                               headers=track.headers)
            track.samples[smuid] = Sample(smuid, sent, time.time())
            track.outstanding.add(smuid)
            await asyncio.sleep(random.uniform(*gap))


class _Track:
    """One probe's samples and the poller that notes when each is seen (``seen``: which of the
    SMUIDs asked about are there now), until ``done`` is set and all are seen or ``grace`` passed."""

    def __init__(self, name: str, topic: str, headers, seen, poll_s: float):
        self.name, self.topic, self.headers, self.seen, self.poll_s = name, topic, headers, seen, poll_s
        self.samples: dict[int, Sample] = {}
        self.outstanding: set[int] = set()
        self.done = asyncio.Event()

    async def poll(self, grace: float) -> None:
        give_up = math.inf
        while not (self.done.is_set() and (not self.outstanding or time.monotonic() > give_up)):
            if self.done.is_set() and give_up == math.inf:
                give_up = time.monotonic() + grace
            if self.outstanding:
                found = await self.seen(sorted(self.outstanding)) & self.outstanding
                now = time.time()
                for smuid in found:
                    self.samples[smuid].seen = now
                self.outstanding.difference_update(found)
            await asyncio.sleep(self.poll_s)


async def wait_caught_up(probes: Probes, timeout: float) -> float:
    """Publish a marker and wait until GET MESSAGE sees it: the job has routed and committed all that
    came before (one commands partition: the job reads in order).  Returns the seconds it took."""
    started = time.monotonic()
    smuid = await probes.publishers[T_VIS].publish(T_VIS, "marker")
    while not await probes._visible([smuid]):
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"the job did not commit a message within {timeout:g} s (see its log)")
        await asyncio.sleep(0.2)
    return time.monotonic() - started


# -- the load: a process of its own, so its event loop does not delay the probes' clocks

def _load_main(address, rate: float, seconds: float, body_bytes: int, subscribed: bool, conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent ends us
    try:
        result = asyncio.run(_load(address, rate, seconds, body_bytes, subscribed, conn))
    except Exception as error:  # noqa: BLE001 - reported to the parent
        result = {"error": repr(error)}
    conn.send(("done", result))


async def _load(address, rate: float, seconds: float, body_bytes: int, subscribed: bool, conn) -> dict:
    from gateway.client import SMQPClient, SMQPError

    client = await SMQPClient.open(*address, LOADER, ACCOUNTS[LOADER])
    receiver = None
    if subscribed:  # every load message routed to a subscriber that ACKs it: the job's deliveries path
        subscriber = await SMQPClient.open(*address, LOAD_SUBSCRIBER, ACCOUNTS[LOAD_SUBSCRIBER])
        await subscriber.subscribe(T_LOAD)
        receiver = _Receiver(subscriber)
    body = b"x" * body_bytes
    replies: list[float] = []
    errors: list[str] = []
    window = asyncio.Semaphore(1000)  # PUBs awaiting their 200 (pipelined on one connection)
    pending: set[asyncio.Task] = set()

    async def publish() -> None:
        sent = time.perf_counter()
        try:
            await client.publish(T_LOAD, body)
            replies.append((time.perf_counter() - sent) * 1000)
        except (SMQPError, ConnectionError, OSError, asyncio.TimeoutError) as error:
            errors.append(repr(error))
        finally:
            window.release()

    conn.send(("started", time.time()))
    start, offered = time.monotonic(), 0
    while (due := start + offered / rate) < start + seconds:
        if due > time.monotonic():
            await asyncio.sleep(due - time.monotonic())
        await window.acquire()
        task = asyncio.create_task(publish())
        pending.add(task)
        task.add_done_callback(pending.discard)
        offered += 1
    ended = time.time()
    if pending:
        await asyncio.wait(list(pending), timeout=30)
    elapsed = time.monotonic() - start
    if receiver is not None:
        await receiver.close()
    for connection in (client, *([receiver.client] if receiver else [])):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.quit(), 5)
        await connection.close()
    return {"rate": rate, "offered": offered, "published": len(replies), "errors": len(errors),
            "subscribed": subscribed, "acked": len(receiver.arrivals) if receiver else None,
            "subscriber_error": repr(receiver.error) if receiver and receiver.error else None,
            "first_error": errors[0] if errors else None, "ended": ended,
            "achieved_per_s": round(len(replies) / elapsed), "publish": latency_summary(replies, offered)}


class LoadProcess:
    """``rate`` msg/s of guaranteed PUBs to ``/lat/load`` for ``seconds``, from a child process that
    is ended however the block ends; with ``subscribed``, a subscriber of its own ACKs each one."""

    def __init__(self, address, rate: float, seconds: float, body_bytes: int, subscribed: bool = False):
        context = multiprocessing.get_context("spawn")
        self.receiving, sending = context.Pipe(duplex=False)
        self.process = context.Process(target=_load_main, name="job-latency-load", daemon=True,
                                       args=(address, rate, seconds, body_bytes, subscribed, sending))
        self.seconds = seconds

    def __enter__(self) -> LoadProcess:
        self.process.start()
        return self

    async def receive(self, kind: str, timeout: float):
        if not await asyncio.to_thread(self.receiving.poll, timeout):
            raise TimeoutError(f"the load generator sent no {kind!r} within {timeout:g} s")
        got, value = self.receiving.recv()
        if got != kind:
            raise RuntimeError(f"the load generator sent {got!r}, not {kind!r}: {value!r}")
        return value

    def __exit__(self, *exc) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


# -- one run: a stack of its own

def say(text: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {text}", flush=True)


async def measure(stack, args) -> dict:
    """Warm-up (load and probes, discarded), then the quiet phase, then the load phase; before and
    after each, the job is let catch up (how long it took is the phase's ``caught_up_after_s``)."""
    probes = await Probes(stack.address, args).open()
    phases: dict[str, dict] = {}
    try:
        say(f"waiting for the job's first commit (up to {args.start_timeout:g} s) ...")
        say(f"  committed after {await wait_caught_up(probes, args.start_timeout):.1f} s")
        if args.warmup > 0:
            say(f"warming up: {args.warmup:g} s of {args.rate:g} msg/s with 5 samples of each probe ...")
            await loaded_phase(stack, probes, args, args.warmup, 5, settle=0)
            await catch_up(probes, "the warm-up")
            await asyncio.sleep(2)
        say(f"quiet: {args.samples} samples of each probe, taking turns, one every "
            f"{args.gap[0]:g}-{args.gap[1]:g} s ...")
        before, start, host_before = os.getloadavg()[0], time.time(), host_cpu_ticks()
        samples = await probes.run(args.samples, math.inf, interleaved=True)
        phases["quiet"] = {"window": [start, time.time()], "load_avg_1m": [before, os.getloadavg()[0]],
                           "steal_pct": steal_percent(host_before, host_cpu_ticks()), "samples": samples}
        say("  " + headline(samples))
        phases["quiet"]["caught_up_after_s"] = await catch_up(probes, "the quiet phase")
        say(f"load: {args.rate:g} msg/s for {args.load_seconds:g} s, {args.samples} samples of each probe "
            f"after {args.settle:g} s ...")
        phases["load"] = await loaded_phase(stack, probes, args, args.load_seconds, args.samples, args.settle)
        say("  " + headline(phases["load"]["samples"]))
        load = phases["load"]["load"]
        say(f"  load: {load.get('published')} of {load.get('offered')} PUBs answered, "
            f"{load.get('achieved_per_s')} msg/s, {load.get('errors')} errors"
            + (f", {load.get('acked')} ACKed by its subscriber" if load.get("subscribed") else "")
            + (f" (which failed: {load['subscriber_error']})" if load.get("subscriber_error") else ""))
        phases["load"]["caught_up_after_s"] = await catch_up(probes, "the load (and the probes' grace)")
    finally:
        await probes.close()
    return phases


async def catch_up(probes: Probes, after: str, timeout: float = 300) -> float | None:
    try:
        seconds = await wait_caught_up(probes, timeout)
    except TimeoutError:
        say(f"  the job had not caught up {timeout:g} s after {after}; going on")
        return None
    say(f"  the job caught up {seconds:.1f} s after {after}")
    return round(seconds, 1)


async def loaded_phase(stack, probes: Probes, args, seconds: float, count: int, settle: float) -> dict:
    """The load for ``seconds``; after ``settle`` s the probes run until it ends (and their grace)."""
    with LoadProcess(stack.address, args.rate, seconds, args.body_bytes, args.subscribed) as load:
        started = await load.receive("started", 120)
        before = os.getloadavg()[0]
        await asyncio.sleep(settle)
        window_start, host_before = time.time(), host_cpu_ticks()
        left = max(0.0, started + seconds - window_start)
        stop_at = time.monotonic() + left
        # each probe's samples spread over what is left of the load (never closer than --gap)
        stretch = max(1.0, left / count / statistics.fmean(args.gap))
        samples, result = await asyncio.gather(probes.run(count, stop_at, interleaved=False, stretch=stretch),
                                               load.receive("done", seconds + 120))
    if "error" in result:
        raise RuntimeError(f"the load generator failed: {result['error']}")
    return {"window": [window_start, result["ended"]], "load_avg_1m": [before, os.getloadavg()[0]],
            "steal_pct": steal_percent(host_before, host_cpu_ticks()), "samples": samples, "load": result}


def headline(samples: Mapping[str, list[Sample]]) -> str:
    parts = []
    for name, samples_of in samples.items():
        summary = latencies(samples_of, "seen")
        parts.append(f"{name} p50/p99 {cell(summary, ('p50_ms', 'p99_ms'))} ms")
    return "; ".join(parts)


BATCH_COLUMNS = ("batch", "start", "end", "records", "ms", "spark_ms", "delta_ms", "plan_ms", "run_ms")


def read_batches(workdir: str) -> list[dict]:
    batches = []
    with contextlib.suppress(OSError), open(Path(workdir, "job.log"), errors="replace") as log:
        for line in log:
            if (batch := parse_sink_line(line)) is not None:
                batches.append(batch)
    return batches


def read_metrics(table: str) -> list[dict]:
    """The ``metrics`` rows, each with ``start`` / ``end`` in epoch seconds."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(table):
        return []
    rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    for row in rows:
        stamp = row["timestamp"]
        row["start"] = (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).timestamp()
        row["end"] = row["start"] + (row.get("batch_duration_ms") or 0) / 1000
    return rows


def commit_times(table: str, topic: str) -> dict[int, float]:
    """SMUID of each row of ``topic`` in Delta ``table`` → when the commit of the batch that wrote it
    appeared (its ``_delta_log`` file's modification time, epoch seconds)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(table):
        return {}
    appeared: dict[int, float] = {}
    for path in sorted(Path(table, "_delta_log").glob("*.json")):
        batch = committed_batch(path.read_text().splitlines())
        if batch is not None:
            appeared.setdefault(batch, path.stat().st_mtime)
    rows = DeltaTable(table).to_pyarrow_table(columns=["smuid", "batch_id"], filters=[("topic", "=", topic)])
    out: dict[int, float] = {}
    for smuid, batch in zip(rows.column("smuid").to_pylist(), rows.column("batch_id").to_pylist()):
        if batch in appeared:
            out[smuid] = min(out.get(smuid, math.inf), appeared[batch])
    return out


def analyse(stack, phases: dict, batches: list[dict]) -> dict:
    """Each phase's figures from its samples, the job's routed ``batches`` (its log) and its Delta
    tables (read after the stop)."""
    metrics = read_metrics(stack.config.table_path("metrics"))
    messages = commit_times(stack.config.table_path("messages"), T_VIS)
    trash = commit_times(stack.config.table_path("trash"), T_EXP)
    out = {}
    for name, phase in phases.items():
        samples = phase["samples"]
        for sample in samples["visibility"]:
            sample.committed = messages.get(sample.smuid)
        for sample in samples["expiry"]:
            sample.committed = trash.get(sample.smuid)
        routed = started_within(batches, *phase["window"])  # batches with a sink line: they routed something
        out[name] = {
            "window": phase["window"], "load_avg_1m": phase["load_avg_1m"], "steal_pct": phase.get("steal_pct"),
            "visibility_get": latencies(samples["visibility"], "seen"),
            "visibility_delta": latencies(samples["visibility"], "committed"),
            "delivery_one": latencies(samples["delivery_one"], "seen"),
            "expiry_list": latencies(samples["expiry"], "seen"),
            "expiry_delta": latencies(samples["expiry"], "committed"),
            "publish": latency_summary([(s.replied - s.sent) * 1000 for ss in samples.values() for s in ss],
                                       sum(len(ss) for ss in samples.values())),
            "sink": sink_figures(routed),
            "spark": spark_figures([row for row in metrics if row["batch_id"] in {b["batch"] for b in routed}]),
            "load": phase.get("load"), "caught_up_after_s": phase.get("caught_up_after_s"),
            "samples": {key: [asdict(s) for s in ss] for key, ss in samples.items()},
        }
    return out


def one_run(source: str, index: int, args) -> dict:
    """Start the stack with ``[streaming] source = source``, measure, stop it, read what it wrote."""
    from deploy.stack import running_stack

    env = {"SMQP_STREAMING_SOURCE": source, **env_settings(args.set)}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # running_stack hands its environment to the job and the gateway
    started, load_before, stack = time.time(), os.getloadavg(), None
    say(f"run {index} ({source} source): starting Kafka, the streaming job and a gateway ...")
    try:
        with running_stack(ACCOUNTS) as stack:
            say(f"  up; logs in {stack.workdir}")
            phases = asyncio.run(measure(stack, args))
            say("stopping the stack ...")
        batches = read_batches(stack.workdir)
        figures = analyse(stack, phases, batches)  # after the stop: the job has flushed its last metrics rows
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if stack is not None and not args.keep:
            shutil.rmtree(stack.workdir, ignore_errors=True)
    return {"source": source, "index": index, "env": env, "started": started, "wall_s": round(time.time() - started),
            "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "uptime": _uptime(),
            "workdir": stack.workdir if args.keep else None, "phases": figures,
            # every routed batch of the run, from the job's log: the timeline behind each phase's figures
            "batches": {"columns": BATCH_COLUMNS, "rows": [[b.get(k) for k in BATCH_COLUMNS] for b in batches]}}


def _uptime() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    return ""


def _versions() -> dict:
    from deploy.broker import kafka_version

    versions = {"python": platform.python_version()}
    for package in ("pyspark", "deltalake", "kafka-python"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    with contextlib.suppress(Exception):
        versions["kafka"] = kafka_version()
    return versions


def _code() -> dict:
    def git(*words: str) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run(["git", *words], capture_output=True, text=True, timeout=10).stdout.strip()
        return ""
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "modified": git("status", "--porcelain", "--untracked-files=no").splitlines()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.job_latency", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1] + (
            "\nExamples:\n"
            "  python -m deploy.job_latency --source kafka --load-seconds 20 --samples 20\n"
            "  python -m deploy.job_latency --alternate --runs 2     # python, kafka, python, kafka\n"
            "  python -m deploy.job_latency --set streaming.defer_while_busy_s=0 --label nodefer\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--source", choices=SOURCES, default=StreamingConfig.source,
        help=f"[streaming] source of the job (default {StreamingConfig.source}, the job's)")
    add("--alternate", action="store_true", help="run both sources, python first, alternately")
    add("--runs", type=int, default=1, help="runs of each source (default 1); each run starts its own stack")
    add("--rate", type=float, default=1000, help="msg/s of the load (default 1000)")
    add("--load-seconds", type=float, default=60, help="seconds the measured load runs (default 60)")
    add("--settle", type=float, default=5, help="seconds of load before batches and probes count (default 5)")
    add("--warmup", type=float, default=15, help="seconds of load to warm the stack up, not counted (default 15)")
    add("--samples", type=int, default=50, help="messages per probe and phase (default 50)")
    add("--gap", type=float, nargs=2, default=(0.2, 0.5), metavar=("MIN", "MAX"),
        help="seconds between one probe's messages, uniformly drawn (default 0.2 0.5)")
    add("--poll-ms", type=float, default=100, help="how often GET / LIST …/Trash are asked (default 100 ms)")
    add("--grace", type=float, default=30, help="seconds a sample may take before it counts as never seen")
    add("--body-bytes", type=int, default=100, help="bytes per load message (default 100)")
    add("--subscribed", action="store_true",
        help="a subscriber ACKs every load message, so the job routes, stores and settles a delivery "
             "of each (default: nobody subscribes to the load's topic)")
    add("--start-timeout", type=float, default=300, help="seconds allowed for the job's first commit")
    add("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="a configuration value for the stack (SMQP_SECTION_KEY), e.g. streaming.defer_while_busy_s=0")
    add("--label", help="file name label (default: the source, or 'alternating')")
    add("--json", help="where to write the results (default bench-results/job-latency-<date>-<label>.json)")
    add("--keep", action="store_true", help="keep each run's work directory (logs, Kafka log, Delta tables)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.samples < 1 or args.rate <= 0 or args.gap[0] > args.gap[1] or args.gap[0] < 0:
        parser.error("--runs and --samples must be at least 1, --rate positive, --gap MIN ≤ MAX")
    try:
        env_settings(args.set)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> int:
    from deploy.stack import stopping_on_sigterm

    args = parse_args(argv)
    label = args.label or ("alternating" if args.alternate else args.source)
    path = Path(args.json) if args.json else result_path("bench-results", date.today().isoformat(), label)
    report = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {"cores": os.cpu_count(), "load_avg_before": os.getloadavg(), "uptime_before": _uptime()},
              "versions": _versions(), "code": _code(),
              "settings": {k: v for k, v in vars(args).items() if k != "json"}, "runs": []}
    order = run_order(args.source, args.runs, args.alternate)
    say(f"job latency: {len(order)} run(s): {', '.join(order)}; load average {_load_text()}")
    status = 0
    with stopping_on_sigterm():
        try:
            for index, source in enumerate(order):
                report["runs"].append(one_run(source, index // (2 if args.alternate else 1) + 1, args))
                print("\n" + render_table(report["runs"][-1:]) + "\n", flush=True)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (deploy.stack.stopping_on_sigterm)
            say("interrupted; the stack is stopped")
            status = 130
        except Exception as error:  # noqa: BLE001 - what was measured is still written
            say(f"failed: {error!r}; the stack is stopped")
            status = 1
    report.update(finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    report["machine"].update(load_avg_after=os.getloadavg(), uptime_after=_uptime())
    report["medians"] = medians(report["runs"]) if report["runs"] else {}
    if report["runs"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(jsonable(report), indent=1, default=str))
        print(render_table(report["runs"]))
        if any(figures["runs"] > 1 for figures in report["medians"].values()):
            print("\n" + render_medians(report["medians"]))
        print(f"\nload average now {_load_text()}; 2 cores shared with whatever else runs: figures are noisy, "
              f"compare sources only across alternating runs.\nwritten to {path}", flush=True)
    return status


def _load_text() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg()) + " (1 / 5 / 15 min)"


if __name__ == "__main__":
    sys.exit(main())
