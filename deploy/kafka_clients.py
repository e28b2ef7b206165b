"""Our asyncio Kafka client (``kafka_edge``) against aiokafka and confluent-kafka (a script, not a test).

The project keeps a hand-written client only if it beats the well-kept libraries on the paths the
gateway depends on; this measures those paths on a one-node Apache Kafka on 127.0.0.1
(``deploy.broker.scratch_broker``), all three clients in this one event loop, each run on a fresh
topic of one partition, 250-byte records with a key, acks=all, no compression:

  burst   --records appends to one partition, 800 of them outstanding at once (like 8 publishers
          pipelining 100 PUBs each), each awaiting its own acknowledgement: records/s, and this
          process's CPU per record (time.process_time: every thread of it, librdkafka's included).
          Linger 20 ms and 16 KiB batches (the gateway's pipelined PUBs: linger=True); the same
          names mean different things, though: kafka_edge sends once 16 KiB wait and a request may
          take more (up to 512 KiB: one request per partition in flight), the libraries' batches
          are at most 16 KiB (librdkafka keeps several requests in flight).
  serial  --serial appends, each awaited before the next (one durable append's latency, linger 0):
          p50/p99 ms.
  fold    reading a partition of --records records from offset 0 to its end (a gateway's start-up
          fold), handing on (offset, key, value) per record, from assigning the partition to the
          last record: records/s and CPU per record.  The partition is filled by kafka_edge first
          (not measured), so every client reads the same kind of record batches.
  tail    a caught-up tail's latency: --serial records appended one at a time (by kafka_edge for
          every client, so the tail is what differs), each time from the append's acknowledgement
          to the tail handing the record on: p50/p99 ms (below 0 when the fetch's answer is
          handled before the produce's).

How each library is driven: aiokafka's AIOKafkaProducer (``send`` -> a future per record) and
AIOKafkaConsumer (``getmany``); confluent-kafka's plain Producer with a poll thread resolving an
asyncio future per record through ``loop.call_soon_threadsafe`` (its asyncio blog post's
pattern), and its AIOConsumer (``poll`` for the first record, then ``consume(n, timeout=0)``:
``consume(n, timeout)`` waits out its timeout until n records are there).  Its AIOProducer (2.16)
is not used: its futures resolve only when the producer is next polled, which happens when the
next batch is handed over or its 1 s buffer timeout fires (a lone append took ~2 s).
Consumers are assigned their partition (no consumer group), fetch.wait.max.ms and fetch.min.bytes
as kafka_edge's settings say, CRCs checked (kafka_edge always checks them).  The process collects
garbage at the gateway's thresholds, as the gateway does.

This host's speed drifts, so runs alternate: run 1 of every client and path, then run 2, ...
(the clients' order rotating), after an untimed fold that warms the node's JVM up.  The table
shows median (min-max) over the runs and each library's median over kafka_edge's.  Everything
stops by itself: each measurement is bounded, the node is stopped at the end, on an error,
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

from kafka.admin import KafkaAdminClient, NewTopic

from deploy.broker import kafka_version, scratch_broker
from deploy.stack import stopping_on_sigterm
from gateway.server.main import GC_THRESHOLDS
from kafka_edge import Cluster, DurableLog, Tail
from kafka_edge.tail import FETCH_MAX_BYTES
from schemas.config import KafkaConfig

CLIENTS = ("kafka_edge", "aiokafka", "confluent")
PATHS = ("burst", "serial", "fold", "tail")
WINDOW = 800  # appends outstanding in a burst
KEYS = [f"publisher-{i}".encode() for i in range(8)]
VALUE = bytes(range(250))
#: figure -> (label, unit format, whether higher is better)
FIGURES = {
    "burst_per_s": ("burst appends/s", "{:,.0f}", True),
    "burst_cpu_us": ("burst CPU µs/record", "{:.1f}", False),
    "serial_p50_ms": ("serial append p50 ms", "{:.2f}", False),
    "serial_p99_ms": ("serial append p99 ms", "{:.2f}", False),
    "fold_per_s": ("fold records/s", "{:,.0f}", True),
    "fold_cpu_us": ("fold CPU µs/record", "{:.2f}", False),
    "tail_p50_ms": ("caught-up tail p50 ms", "{:.2f}", False),
    "tail_p99_ms": ("caught-up tail p99 ms", "{:.2f}", False),
}

Append = Callable[[bytes, bytes], Awaitable[asyncio.Future]]
Deliver = Callable[[list], None]


def progress(text: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {text}", file=sys.stderr, flush=True)


# -- the clients: a producer (append -> a future per record) and a tail of partition 0 per client --

@contextlib.asynccontextmanager
async def edge_producer(settings: KafkaConfig, topic: str, linger: bool) -> AsyncIterator[Append]:
    cluster, log = Cluster(settings, client_id="bench"), None

    async def append(key: bytes, value: bytes) -> asyncio.Future:
        return log.append(key, value, partition=0, linger=linger)
    try:
        log = await DurableLog.open(settings, cluster, topic)
        yield append
    finally:
        if log is not None:
            await log.close()
        cluster.close()


@contextlib.asynccontextmanager
async def aiokafka_producer(settings: KafkaConfig, topic: str, linger: bool) -> AsyncIterator[Append]:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, client_id="bench", acks="all",
                                linger_ms=settings.linger_ms if linger else 0, max_batch_size=settings.batch_bytes,
                                compression_type=None, enable_idempotence=False)

    async def append(key: bytes, value: bytes) -> asyncio.Future:
        return await producer.send(topic, value, key=key, partition=0)
    try:
        await producer.start()
        yield append
    finally:
        await producer.stop()


@contextlib.asynccontextmanager
async def confluent_producer(settings: KafkaConfig, topic: str, linger: bool) -> AsyncIterator[Append]:
    import confluent_kafka

    loop = asyncio.get_running_loop()
    producer = confluent_kafka.Producer({
        "bootstrap.servers": settings.bootstrap, "client.id": "bench", "acks": "all",
        "linger.ms": settings.linger_ms if linger else 0, "batch.size": settings.batch_bytes,
        "compression.type": "none", "enable.idempotence": False})
    stopping = threading.Event()

    def poll() -> None:  # serves the delivery reports
        while not stopping.is_set():
            producer.poll(0.1)

    def settle(future: asyncio.Future, error, message) -> None:
        if not future.done():
            if error is None:
                future.set_result(message.offset())
            else:
                future.set_exception(confluent_kafka.KafkaException(error))

    async def append(key: bytes, value: bytes) -> asyncio.Future:
        future = loop.create_future()
        producer.produce(topic, value, key, partition=0, on_delivery=lambda error, message:
                         loop.call_soon_threadsafe(settle, future, error, message))
        return future

    poller = threading.Thread(target=poll, name="confluent-poll", daemon=True)
    poller.start()
    try:
        yield append
    finally:
        await loop.run_in_executor(None, producer.flush, 5.0)
        stopping.set()
        await loop.run_in_executor(None, poller.join)


@contextlib.asynccontextmanager
async def edge_tail(settings: KafkaConfig, topic: str, deliver: Deliver) -> AsyncIterator[Callable[[], None]]:
    cluster = Cluster(settings, client_id="bench")
    tail = Tail(settings, cluster, topic, deliver, lambda offset, key, value: (offset, key, value), partitions=[0])
    try:
        await cluster.partitions(topic)  # connected, leaders known
        yield tail.start
    finally:
        await tail.stop()
        cluster.close()


@contextlib.asynccontextmanager
async def aiokafka_tail(settings: KafkaConfig, topic: str, deliver: Deliver) -> AsyncIterator[Callable[[], None]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, client_id="bench", group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest", check_crcs=True,
                                fetch_max_wait_ms=settings.fetch_max_wait_ms, fetch_min_bytes=settings.fetch_min_bytes,
                                max_partition_fetch_bytes=FETCH_MAX_BYTES)
    partition = TopicPartition(topic, 0)

    async def read() -> None:
        while True:
            for records in (await consumer.getmany(partition, timeout_ms=settings.fetch_max_wait_ms)).values():
                deliver([(record.offset, record.key, record.value) for record in records])
    reading: list[asyncio.Task] = []

    def start() -> None:
        consumer.assign([partition])
        consumer.seek(partition, 0)
        reading.append(asyncio.create_task(read()))
    try:
        await consumer.start()
        yield start
    finally:
        for task in reading:
            task.cancel()
        await asyncio.gather(*reading, return_exceptions=True)
        await consumer.stop()


@contextlib.asynccontextmanager
async def confluent_tail(settings: KafkaConfig, topic: str, deliver: Deliver) -> AsyncIterator[Callable[[], None]]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.aio import AIOConsumer

    consumer = AIOConsumer({  # a group.id is required, though an assigned consumer never joins the group
        "bootstrap.servers": settings.bootstrap, "client.id": "bench", "group.id": "bench-unused",
        "enable.auto.commit": False, "enable.auto.offset.store": False, "check.crcs": True,
        "fetch.wait.max.ms": settings.fetch_max_wait_ms, "fetch.min.bytes": settings.fetch_min_bytes,
        "max.partition.fetch.bytes": FETCH_MAX_BYTES})

    async def read() -> None:
        await consumer.assign([TopicPartition(topic, 0, 0)])
        while True:  # consume(n, timeout) would wait out its timeout until n records are there
            messages = await consumer.consume(num_messages=10_000, timeout=0)
            if not messages:
                message = await consumer.poll(settings.fetch_max_wait_ms / 1000)
                messages = [] if message is None else [message]
            items = [(m.offset(), m.key(), m.value()) for m in messages if m.error() is None]
            if items:
                deliver(items)
    reading: list[asyncio.Task] = []
    try:
        yield lambda: reading.append(asyncio.create_task(read()))
    finally:
        for task in reading:
            task.cancel()
        await asyncio.gather(*reading, return_exceptions=True)
        await consumer.close()


PRODUCERS = {"kafka_edge": edge_producer, "aiokafka": aiokafka_producer, "confluent": confluent_producer}
TAILS = {"kafka_edge": edge_tail, "aiokafka": aiokafka_tail, "confluent": confluent_tail}


# -- the paths --

async def append_burst(append: Append, records: int) -> None:
    """``records`` appends, :data:`WINDOW` outstanding, each acknowledgement awaited."""
    outstanding: deque[asyncio.Future] = deque()
    for number in range(records):
        if len(outstanding) >= WINDOW:
            await outstanding.popleft()
        outstanding.append(await append(KEYS[number % len(KEYS)], VALUE))
    for future in outstanding:
        await future


async def burst(client: str, settings: KafkaConfig, topic: str, records: int, appends: int) -> dict:
    async with PRODUCERS[client](settings, topic, True) as append:
        await (await append(b"warm-up", VALUE))  # connected, metadata known
        cpu, started = time.process_time(), time.perf_counter()
        await append_burst(append, records)
        cpu, seconds = time.process_time() - cpu, time.perf_counter() - started
    return {"burst_per_s": records / seconds, "burst_cpu_us": 1e6 * cpu / records}


async def serial(client: str, settings: KafkaConfig, topic: str, records: int, appends: int) -> dict:
    async with PRODUCERS[client](settings, topic, False) as append:
        await (await append(b"warm-up", VALUE))
        took = []
        for number in range(appends):
            started = time.perf_counter()
            await (await append(KEYS[number % len(KEYS)], VALUE))
            took.append(time.perf_counter() - started)
    return {"serial_p50_ms": 1e3 * percentile(took, 50), "serial_p99_ms": 1e3 * percentile(took, 99)}


async def fold(client: str, settings: KafkaConfig, topic: str, records: int, appends: int) -> dict:
    async with edge_producer(settings, topic, True) as append:  # the partition to read, not measured
        await append_burst(append, records)
    gc.collect()
    handed_on, done = 0, asyncio.get_running_loop().create_future()

    def deliver(items: list) -> None:
        nonlocal handed_on
        handed_on += len(items)
        if handed_on >= records and not done.done():
            done.set_result(None)
    async with TAILS[client](settings, topic, deliver) as start:
        cpu, started = time.process_time(), time.perf_counter()
        start()
        await done
        cpu, seconds = time.process_time() - cpu, time.perf_counter() - started
    return {"fold_per_s": records / seconds, "fold_cpu_us": 1e6 * cpu / records}


async def tail(client: str, settings: KafkaConfig, topic: str, records: int, appends: int) -> dict:
    received: dict[int, float] = {}
    arrived = asyncio.Event()

    def deliver(items: list) -> None:
        now = time.perf_counter()
        for offset, _key, _value in items:
            received[offset] = now
        arrived.set()
    async with edge_producer(settings, topic, False) as append, TAILS[client](settings, topic, deliver) as start:
        start()
        took = []
        for number in range(appends + 1):  # the first one: until the tail is there, not counted
            offset = (await (await append(KEYS[number % len(KEYS)], VALUE))).offset
            acknowledged = time.perf_counter()
            while offset not in received:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 30)
            if number:
                took.append(received[offset] - acknowledged)
    return {"tail_p50_ms": 1e3 * percentile(took, 50), "tail_p99_ms": 1e3 * percentile(took, 99)}


MEASURES = {"burst": burst, "serial": serial, "fold": fold, "tail": tail}


def percentile(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1] if len(values) > 1 else values[0]


# -- running, reporting --

@contextlib.contextmanager
def fresh_topic(bootstrap: str, name: str):
    """A topic of one partition (replication 1) for one measurement, deleted after it."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-admin")
    try:
        admin.create_topics([NewTopic(name, 1, 1)])
        admin.wait_for_topics([name], timeout_ms=30000)
    finally:
        admin.close()
    try:
        yield name
    finally:
        with contextlib.suppress(Exception), contextlib.closing(
                KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-admin")) as admin:
            admin.delete_topics([name])


def measure(path: str, client: str, run: int, settings: KafkaConfig, args: argparse.Namespace) -> dict:
    bound = 60 + args.records / 200 + args.serial / 5  # seconds: slower than 200 records/s or 5 appends/s fails
    gc.collect()
    try:
        with fresh_topic(settings.bootstrap, f"bench-{run}-{path}-{client}") as topic:
            return asyncio.run(asyncio.wait_for(
                MEASURES[path](client, settings, topic, args.records, args.serial), bound))
    except Exception as error:  # noqa: BLE001 - one failure must not end the others
        progress(f"run {run} {path} {client} FAILED: {type(error).__name__}: {error}")
        return {"error": f"{type(error).__name__}: {error}"}


def summarize(runs: list[dict], clients: list[str]) -> dict:
    """figure -> client -> {median, min, max, runs}; and each library's median over kafka_edge's."""
    summary: dict = {}
    for figure in FIGURES:
        for client in clients:
            values = [r[figure] for r in runs if r["client"] == client and figure in r]
            if values:
                summary.setdefault(figure, {})[client] = {
                    "median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}
        ours = summary.get(figure, {}).get("kafka_edge")
        for client in clients:
            theirs = summary.get(figure, {}).get(client)
            if client != "kafka_edge" and ours and theirs and ours["median"]:
                theirs["ratio_to_kafka_edge"] = theirs["median"] / ours["median"]
    return summary


def render(summary: dict, clients: list[str]) -> str:
    libraries = [c for c in clients if c != "kafka_edge"] if "kafka_edge" in clients else []
    header = ["figure", *clients, *(f"{c}/kafka_edge" for c in libraries)]
    rows = [header]
    for figure, (label, fmt, higher) in FIGURES.items():
        cells = summary.get(figure, {})
        row = [f"{label} ({'higher' if higher else 'lower'} is better)"]
        for client in clients:
            c = cells.get(client)
            row.append(f"{fmt.format(c['median'])} ({fmt.format(c['min'])}–{fmt.format(c['max'])})" if c else "-")
        for client in libraries:
            ratio = cells.get(client, {}).get("ratio_to_kafka_edge")
            row.append(f"{ratio:.2f}x" if ratio is not None else "-")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def versions() -> dict:
    found = {"python": platform.python_version()}
    found["kafka"] = kafka_version()
    for package in ("kafka-python", "aiokafka", "confluent-kafka"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    with contextlib.suppress(ImportError):
        import confluent_kafka
        found["librdkafka"] = confluent_kafka.libversion()[0]
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        found["checkout"] = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                                           check=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.kafka_clients", description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000,
                        help="records of a burst and of a fold (default 100,000)")
    parser.add_argument("--serial", type=int, default=300,
                        help="appends of the serial and the caught-up tail figures (default 300)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each client and path, alternating (default 5)")
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated subset of {','.join(CLIENTS)}")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    parser.add_argument("--json", default="bench-results/kafka-clients.json", help="where to write the results")
    args = parser.parse_args(argv)
    args.clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    for given, allowed, flag in ((args.clients, CLIENTS, "--clients"), (args.paths, PATHS, "--paths")):
        if not given or set(given) - set(allowed):
            parser.error(f"{flag}: choose among {', '.join(allowed)}")
    if args.records < 1 or args.serial < 2 or args.runs < 1:
        parser.error("--records, --runs must be at least 1 and --serial at least 2")
    return args


def run_all(args: argparse.Namespace, runs: list[dict]) -> None:
    """A Kafka node, an untimed warm-up, then the runs, appended to ``runs`` as they are measured."""
    progress("starting a Kafka node on 127.0.0.1 ...")
    with scratch_broker() as broker:
        settings = KafkaConfig(bootstrap=broker.bootstrap)
        progress("warming the node up: a fold by kafka_edge (not counted) ...")
        measure("fold", "kafka_edge", 0, settings, args)
        for run in range(1, args.runs + 1):
            first = (run - 1) % len(args.clients)  # who goes first rotates
            order = args.clients[first:] + args.clients[:first]
            for path in args.paths:
                for client in order:
                    figures = measure(path, client, run, settings, args)
                    runs.append({"run": run, "path": path, "client": client, **figures})
                    shown = ", ".join(f"{FIGURES[k][1].format(v)} {FIGURES[k][0]}"
                                      for k, v in figures.items() if k in FIGURES)
                    progress(f"run {run}/{args.runs} {path} {client}: {shown or figures['error']}")
        progress("stopping the Kafka node ...")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(timezone.utc)
    runs: list[dict] = []
    interrupted = False
    previous_gc = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        with stopping_on_sigterm():  # SIGTERM, like Ctrl-C, stops the node before the script ends
            run_all(args, runs)
    except KeyboardInterrupt:
        interrupted = True
        progress("interrupted: the Kafka node is stopped; what was measured so far follows")
    finally:
        gc.set_threshold(*previous_gc)
    defaults = KafkaConfig()
    summary = summarize(runs, args.clients)
    report = {
        "date": started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "interrupted": interrupted,
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_after": os.getloadavg()},
        "versions": versions(),
        "settings": {"records": args.records, "serial": args.serial, "runs": args.runs, "window": WINDOW,
                     "record_bytes": len(VALUE), "linger_ms": defaults.linger_ms, "batch_bytes": defaults.batch_bytes,
                     "fetch_max_wait_ms": defaults.fetch_max_wait_ms, "fetch_min_bytes": defaults.fetch_min_bytes,
                     "gc_thresholds": GC_THRESHOLDS, "clients": args.clients, "paths": args.paths},
        "summary": summary,
        "runs": runs,
    }
    if runs:  # an interrupted start does not overwrite earlier results
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\n{args.runs} run(s), {args.records:,} records per burst and fold, {args.serial} serial appends; "
          f"median (min–max)\n")
    print(render(summary, args.clients))
    print(f"\nwritten to {args.json}" if runs else "\nnothing measured, nothing written")
    return 130 if interrupted else 1 if any("error" in r for r in runs) else 0

if __name__ == "__main__":
    sys.exit(main())
