"""A bounded adversarial run against one gateway on 127.0.0.1 (a script, not a test).

Starts a Kafka node and one gateway process of its own (no streaming job: the gateway NOTIFYs
DELIVERY ALL messages itself, routing early, and nothing here waits on the job), or attacks the
gateway at ``--address`` (127.0.0.1 only).  While a legitimate client in a process of its own
sends NOOPs, publishes guaranteed messages and receives and ACKs every one of them, it runs four
attacks, each bounded in count and in time:

- ``flood``: 10,000 TCP connections, opened as fast as the gateway accepts them and held idle;
- ``slow``: slow readers (log in, SUB with a notify window of 1,000, then never read while large
  messages are published to them), slow writers (every command one byte at a time), and
  unfinished frames (a partial line left alone; one dribbled a byte every few seconds);
- ``fuzz``: 1,000,000 frames over several logged-in guest connections: a pool drawn by hypothesis
  from the strategies of tests/gateway/test_fuzz.py (deploy/frame_strategies.py), multiplied by a
  seeded mutator (bit flips, cuts, duplications, splices); a closed connection is opened again;
- ``brute``: wrong passwords for one account, pipelined over many connections, at full speed,
  while the account's owner tries the right one every couple of seconds.

It reports per phase: connections accepted, refused and held; the legitimate client's NOOP
latency (p50/p99/max, and NOOPs unanswered within 5 s) before and during; the gateway's resident
memory (peak per phase, VmHWM overall) and CPU; and at the end whether the gateway is alive, every
message answered 200 reached the subscriber, and what the gateway logged as errors.  Figures go to
``bench-results/adversary-<date>.json``; the exit code is 0 only if nothing crashed, nothing was
lost and the legitimate client was served throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import multiprocessing
import os
import re
import resource
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from deploy.broker import KafkaBroker, create_topics, free_port, wait_for_port
from deploy.stack import cpu_seconds, peak_memory_mb, resident_memory_mb, stopping_on_sigterm
from schemas.config import load_config

ROOT = Path(__file__).resolve().parents[1]
LEGIT_TOPIC = "/adversary/legit"
SLOW_TOPIC = "/adversary/slow"
NOOP_TIMEOUT_S = 5.0  # a legitimate NOOP unanswered by then counts as not served
PASSWORDS = {"legit": "legit-pw-1", "legit_pub": "legit-pw-2", "legit_sub": "legit-pw-3", "victim": "victim-pw-4"}


# -- measuring the gateway process

class Sampler:
    """The gateway's resident memory every ``interval`` seconds, in a thread of its own (so a busy
    event loop here does not skip samples); ``peak(start, end)`` is a phase's highest."""

    def __init__(self, pid: int | None, interval: float = 0.25):
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        if self.pid:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError, ValueError):
                self.samples.append((time.time(), resident_memory_mb(self.pid)))

    def peak(self, start: float, end: float) -> float | None:
        inside = [mb for t, mb in self.samples if start <= t <= end]
        return max(inside) if inside else None


@dataclass
class PhaseWindow:
    name: str
    start: float
    end: float = 0.0
    cpu_start: float = 0.0
    figures: dict = field(default_factory=dict)


# -- raw connections

async def open_raw(address, timeout: float = 10.0, limit: int = 1 << 20):
    """A plain TCP connection that closes with a reset (SO_LINGER 0): thousands of closes leave no
    TIME_WAIT behind on either side."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*address, limit=limit), timeout)
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return reader, writer


def abort(writer) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()


class ReplyCounter:
    """Counts server frames (``<code> …`` or ``NOTIFY …`` lines up to an empty line) by their
    first word, from bytes as they come; frames are told apart by the empty line that ends each."""

    def __init__(self, by_line: bool = False):
        self.by_line = by_line  # count whole first lines ("401 Unauthorized (…)"), not codes
        self.codes: collections.Counter = collections.Counter()
        self.last_line = b""
        self.changed = asyncio.Event()  # set at every frame counted and at the end (see _read_into)
        self._tail = b""

    def feed(self, data: bytes) -> None:
        chunks = (self._tail + data).split(b"\r\n\r\n")
        self._tail = chunks.pop()[-65536:]
        for chunk in chunks:
            line = chunk.lstrip(b"\r\n").split(b"\r\n", 1)[0]
            if line:
                word = line[:3] if line[:3].isdigit() else line.split(b" ", 1)[0]
                if not (word.isdigit() or word in (b"+", b"NOTIFY")):
                    word = b"(inside a NOTIFY's data)"  # a data section's own empty lines
                self.codes[(line[:80] if self.by_line else word).decode("ascii", "replace")] += 1
                self.last_line = line[:120]
                self.changed.set()

    @property
    def frames(self) -> int:
        return sum(self.codes.values())


def _error_name(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno:
        return f"{type(error).__name__}[{os.strerror(error.errno)}]"
    return type(error).__name__


# -- the legitimate client, in a process of its own

def legit_main(address, topic: str, rate: float, interval: float, drain_s: float, conn) -> None:
    """Entry point of the legitimate client's process: runs until told to stop, then sends its figures."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it, in order
    conn.send(asyncio.run(_legit(address, topic, rate, interval, drain_s, conn)))


async def _legit(address, topic: str, rate: float, interval: float, drain_s: float, conn) -> dict:
    from gateway.client import SMQPClient

    events: list[dict] = []
    samples: list[tuple[float, float | None]] = []
    published: list[int] = []
    received: collections.Counter = collections.Counter()
    stop_publishing, stop_all, ready = asyncio.Event(), asyncio.Event(), asyncio.Event()
    async with await SMQPClient.open(*address, "legit_pub", PASSWORDS["legit_pub"]) as admin:
        with contextlib.suppress(Exception):
            await admin.create_topic(topic)
    tasks = [asyncio.create_task(_subscriber(address, topic, received, events, stop_all, ready)),
             asyncio.create_task(_prober(address, interval, samples, events, stop_all))]
    await asyncio.wait_for(ready.wait(), 60)
    tasks.append(asyncio.create_task(_publisher(address, topic, rate, published, events, stop_publishing)))
    conn.send({"ready": True})
    while not conn.poll():
        await asyncio.sleep(0.1)
    conn.recv()
    stop_publishing.set()
    await tasks[2]
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline and any(smuid not in received for smuid in published):
        await asyncio.sleep(0.2)
    stop_all.set()
    await asyncio.gather(*tasks[:2], return_exceptions=True)
    lost = [smuid for smuid in published if smuid not in received]
    return {"samples": samples, "events": events, "published": len(published), "received": len(received),
            "lost": len(lost), "lost_smuids": lost[:20], "duplicates": sum(n - 1 for n in received.values()),
            "unexpected": len(set(received) - set(published))}


async def _connected(address, account: str, events: list, who: str):
    from gateway.client import SMQPClient

    while True:
        try:
            return await SMQPClient.open(*address, account, PASSWORDS[account], timeout=10)
        except Exception as error:  # noqa: BLE001 - recorded; the legitimate client keeps trying
            events.append({"t": time.time(), "who": who, "event": f"login failed: {_error_name(error)} {error}"})
            await asyncio.sleep(1)


async def _prober(address, interval: float, samples: list, events: list, stop: asyncio.Event) -> None:
    """NOOP every ``interval`` seconds: (time, latency) per NOOP, latency None when unanswered."""
    client = await _connected(address, "legit", events, "prober")
    next_at = time.monotonic()
    while not stop.is_set():
        wall, started = time.time(), time.perf_counter()
        try:
            await asyncio.wait_for(client.noop(), NOOP_TIMEOUT_S)
            samples.append((wall, time.perf_counter() - started))
        except Exception as error:  # noqa: BLE001 - an unserved NOOP is the figure
            samples.append((wall, None))
            events.append({"t": wall, "who": "prober", "event": f"NOOP failed: {_error_name(error)} {error}"})
            with contextlib.suppress(Exception):
                await client.close()
            client = await _connected(address, "legit", events, "prober")
        next_at = max(next_at + interval, time.monotonic())
        await asyncio.sleep(next_at - time.monotonic())
    with contextlib.suppress(Exception):
        await client.quit()


async def _publisher(address, topic: str, rate: float, published: list, events: list, stop: asyncio.Event) -> None:
    """Guaranteed PUBs at ``rate`` a second; the SMUID of each one answered 200."""
    from gateway.client import SMQPError

    client = await _connected(address, "legit_pub", events, "publisher")
    next_at, number = time.monotonic(), 0
    while not stop.is_set():
        number += 1
        try:
            published.append(await asyncio.wait_for(client.publish(topic, f"legit {number}".ljust(200, ".")), 30))
        except SMQPError as error:  # refused, not lost: the publisher knows
            events.append({"t": time.time(), "who": "publisher", "event": f"PUB refused: {error}"})
        except Exception as error:  # noqa: BLE001 - outcome unknown: not counted as published
            events.append({"t": time.time(), "who": "publisher", "event": f"PUB failed: {_error_name(error)} {error}"})
            with contextlib.suppress(Exception):
                await client.close()
            client = await _connected(address, "legit_pub", events, "publisher")
        next_at = max(next_at + 1 / rate, time.monotonic())
        await asyncio.sleep(next_at - time.monotonic())
    with contextlib.suppress(Exception):
        await client.quit()


async def _subscriber(address, topic: str, received: collections.Counter, events: list,
                      stop: asyncio.Event, ready: asyncio.Event) -> None:
    """Subscribed to ``topic``, ACKs every NOTIFY; counts each SMUID received."""
    while not stop.is_set():
        client = await _connected(address, "legit_sub", events, "subscriber")
        try:
            await client.subscribe(topic)
            ready.set()
            while not stop.is_set():
                try:
                    note = await client.next_notification(0.5)
                except asyncio.TimeoutError:
                    continue
                if note.resource == "MESSAGE":
                    received[note.smuid] += 1
                    await asyncio.wait_for(note.ack(), 30)
        except Exception as error:  # noqa: BLE001 - recorded, then logged in again
            events.append({"t": time.time(), "who": "subscriber", "event": f"{_error_name(error)} {error}"})
        finally:
            with contextlib.suppress(Exception):
                await client.close()


def latency_figures(samples: list, start: float, end: float) -> dict:
    """The NOOPs sent within [start, end): how many, how many unanswered, p50/p99/max in ms."""
    inside = [latency for t, latency in samples if start <= t < end]
    answered = sorted(latency * 1000 for latency in inside if latency is not None)
    figures = {"noops": len(inside), "unanswered": len(inside) - len(answered)}
    if answered:
        figures.update(p50_ms=round(statistics.median(answered), 2),
                       p99_ms=round(answered[min(len(answered) - 1, int(len(answered) * 0.99))], 2),
                       max_ms=round(answered[-1], 2))
    return figures


# -- the attacks

async def flood(address, args) -> dict:
    """``args.flood`` connections (``args.flood_concurrency`` being opened at once), each reading the
    greeting; held ``args.flood_hold`` seconds; then a NOOP on every one still open."""
    held: list = []
    refused: collections.Counter = collections.Counter()
    gate = asyncio.Semaphore(args.flood_concurrency)
    deadline = time.monotonic() + args.flood_seconds
    started = time.monotonic()

    async def one() -> None:
        async with gate:
            if time.monotonic() > deadline:
                refused["not tried (time bound)"] += 1
                return
            try:
                reader, writer = await open_raw(address, limit=4096)
            except Exception as error:  # noqa: BLE001 - counted by kind
                refused[f"connect: {_error_name(error)}"] += 1
                return
            try:
                greeting = await asyncio.wait_for(reader.readline(), 10)
            except Exception as error:  # noqa: BLE001
                refused[f"greeting: {_error_name(error)}"] += 1
                abort(writer)
                return
            if b"Ready" in greeting:
                held.append((reader, writer))
            else:
                refused[f"greeting: {greeting.strip().decode(errors='replace')[:60] or 'closed'}"] += 1
                abort(writer)

    await asyncio.gather(*(one() for _ in range(args.flood)))
    opened_s = time.monotonic() - started
    print(f"  flood: {len(held)} of {args.flood} accepted in {opened_s:.1f} s; refused {dict(refused)}; "
          f"holding {args.flood_hold:g} s ...", flush=True)
    await asyncio.sleep(args.flood_hold)
    still_open = [(r, w) for r, w in held if not r.at_eof() and not w.transport.is_closing()]
    served = await _noop_all(still_open)
    for _, writer in held:
        abort(writer)
    return {"attempted": args.flood, "accepted": len(held), "refused": dict(refused),
            "open_s": round(opened_s, 1), "accepted_per_s": round(len(held) / opened_s) if opened_s else None,
            "held_after_s": args.flood_hold, "held": len(still_open), "held_and_answering_noop": served}


async def _noop_all(connections: list) -> int:
    """How many of ``connections`` answer a NOOP with 200 within 20 s (in batches of 500)."""
    served = 0

    async def noop(reader, writer) -> bool:
        try:
            writer.write(b"NOOP\r\n")
            return (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)).startswith(b"200")
        except Exception:  # noqa: BLE001 - not served
            return False

    for start in range(0, len(connections), 500):
        served += sum(await asyncio.gather(*(noop(r, w) for r, w in connections[start:start + 500])))
    return served


async def slow(address, args) -> dict:
    """Slow readers, slow writers and unfinished frames at once, for ``args.slow_seconds``."""
    from gateway.client import SMQPClient

    until = time.monotonic() + args.slow_seconds
    async with await SMQPClient.open(*address) as admin:
        with contextlib.suppress(Exception):
            await admin.create_topic(SLOW_TOPIC)
    readers = [await _slow_reader(address) for _ in range(args.slow_readers)]
    results = await asyncio.gather(
        _publish_to_slow_readers(address, args, until),
        *(_slow_writer(address, args.slow_byte_interval, until) for _ in range(args.slow_writers)),
        *(_unfinished_frame(address, None, until) for _ in range(args.unfinished)),
        *(_unfinished_frame(address, args.dribble_interval, until) for _ in range(args.unfinished)))
    published, writers = results[0], results[1:1 + args.slow_writers]
    silent, dribbled = results[1 + args.slow_writers:1 + args.slow_writers + args.unfinished], \
        results[1 + args.slow_writers + args.unfinished:]
    closed_readers, read_back = 0, 0
    for reader, writer in readers:
        writer.transport.resume_reading()
        data, eof = await _read_what_is_there(reader)
        read_back += len(data)
        closed_readers += eof
        abort(writer)
    frame_timeout = load_config(env={}).gateway.frame_timeout_s if args.own_stack else None
    return {
        "slow_readers": args.slow_readers, "published_to_them": published,
        "slow_readers_closed_by_gateway": closed_readers, "bytes_they_read_afterwards": read_back,
        "slow_writers": args.slow_writers, "byte_interval_s": args.slow_byte_interval,
        "slow_writer_commands_sent": sum(w["sent"] for w in writers),
        "slow_writer_commands_answered": sum(w["answered"] for w in writers),
        "slow_writers_failed": [w["error"] for w in writers if w["error"]][:5],
        "unfinished_line_left_alone": _closes(silent), "unfinished_frame_dribbled": _closes(dribbled),
        "dribble_interval_s": args.dribble_interval, "frame_timeout_s": frame_timeout,
    }


def _closes(outcomes: list[dict]) -> dict:
    closed = [o for o in outcomes if o["closed_after_s"] is not None]
    return {"connections": len(outcomes), "closed_by_gateway": len(closed),
            "closed_after_s": sorted({round(o["closed_after_s"]) for o in closed}),
            "replies": sorted({o["reply"] for o in closed if o["reply"]}),
            "open_at_end_after_s": round(max((o["open_s"] for o in outcomes), default=0), 1)}


async def _slow_reader(address):
    """Logged in as guest, subscribed to the slow topic with a notify window of 1,000, then never read."""
    reader, writer = await open_raw(address)
    writer.write(b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\nSET NOTIFY WINDOW 1000\r\nSUB MESSAGE "
                 + SLOW_TOPIC.encode() + b"\r\n")
    await asyncio.wait_for(reader.readline(), 10)  # greeting
    for _ in range(4):
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.transport.pause_reading()
    return reader, writer


async def _read_what_is_there(reader) -> tuple[bytes, bool]:
    """What the connection holds now, and whether the gateway had closed it (EOF or reset)."""
    data = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(1 << 20), 1.0)
            if not chunk:
                return data, True
            data += chunk
    except asyncio.TimeoutError:
        return data, False
    except OSError:
        return data, True


async def _publish_to_slow_readers(address, args, until: float) -> int:
    """``args.slow_messages`` guaranteed messages of ``args.slow_message_bytes`` to the slow
    readers' topic, 50 in flight, until done or the phase ends; how many were answered 200."""
    from gateway.client import SMQPClient

    body = b"s" * args.slow_message_bytes
    done = 0
    async with await SMQPClient.open(*address) as publisher:
        for start in range(0, args.slow_messages, 50):
            if time.monotonic() > until:
                break
            outcomes = await asyncio.gather(*(publisher.publish(SLOW_TOPIC, body)
                                              for _ in range(start, min(args.slow_messages, start + 50))),
                                            return_exceptions=True)
            done += sum(not isinstance(o, BaseException) for o in outcomes)
        await asyncio.sleep(max(0.0, until - time.monotonic()))
    return done


async def _slow_writer(address, byte_interval: float, until: float) -> dict:
    """LOGIN, PASS and then NOOPs, every byte on its own ``byte_interval`` after the last; how many
    commands were completed and how many answered before the phase ended."""
    outcome = {"sent": 0, "answered": 0, "error": None}
    counter = ReplyCounter()
    try:
        reader, writer = await open_raw(address)
    except Exception as error:  # noqa: BLE001
        return {**outcome, "error": _error_name(error)}

    async def read() -> None:
        with contextlib.suppress(Exception):
            await reader.readline()
            while chunk := await reader.read(65536):
                counter.feed(chunk)

    reading = asyncio.create_task(read())
    commands = [b"LOGIN guest CLEAR/1.0\r\n", b"PASS guest\r\n"]
    try:
        while time.monotonic() < until:
            command = commands.pop(0) if commands else b"NOOP\r\n"
            for byte in command:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(byte_interval)
            outcome["sent"] += 1
    except Exception as error:  # noqa: BLE001
        outcome["error"] = _error_name(error)
    await asyncio.sleep(1)
    outcome["answered"] = min(counter.frames, outcome["sent"])
    reading.cancel()
    abort(writer)
    return outcome


async def _unfinished_frame(address, dribble: float | None, until: float) -> dict:
    """A PUB left unfinished: its command line half sent and left alone (``dribble`` None), or its
    header dribbled one byte every ``dribble`` seconds, never ending.  Whether (and after how long)
    the gateway closed it, with the reply it gave."""
    reader, writer = await open_raw(address)
    await asyncio.wait_for(reader.readline(), 10)
    started = time.monotonic()
    writer.write(b"PUB MESSAGE " + SLOW_TOPIC.encode() + (b" U1\r\nX-Drip: " if dribble else b" U1"))
    closed_at, reply = None, b""
    while time.monotonic() < until and closed_at is None:
        try:
            chunk = await asyncio.wait_for(reader.read(4096), dribble or max(0.01, until - time.monotonic()))
            reply += chunk
            if not chunk:
                closed_at = time.monotonic()
        except asyncio.TimeoutError:
            if dribble:
                with contextlib.suppress(Exception):
                    writer.write(b"a")
        except OSError:
            closed_at = time.monotonic()
    abort(writer)
    return {"closed_after_s": None if closed_at is None else closed_at - started,
            "reply": reply.split(b"\r\n", 1)[0].decode(errors="replace")[:40],
            "open_s": time.monotonic() - started}


async def fuzz(address, args) -> dict:
    """``args.fuzz_frames`` frames over ``args.fuzz_connections`` logged-in guest connections, each
    opened again when the gateway closes it, until all are sent or ``args.fuzz_seconds`` pass."""
    from deploy.frame_strategies import Mutator, frame_pool

    started = time.monotonic()
    pool = await asyncio.to_thread(frame_pool, args.fuzz_pool, args.seed)
    pool_s = time.monotonic() - started
    print(f"  fuzz: {len(pool)} frames drawn by hypothesis in {pool_s:.1f} s (seed {args.seed}); sending "
          f"{args.fuzz_frames:,} over {args.fuzz_connections} connections ...", flush=True)
    deadline = time.monotonic() + args.fuzz_seconds
    attack_start = time.time()
    share = -(-args.fuzz_frames // args.fuzz_connections)
    totals = {"sent": 0, "bytes": 0, "connections": 0, "closed_by_gateway": 0, "given_up_unanswered": 0,
              "connect_errors": collections.Counter()}
    codes: collections.Counter = collections.Counter()
    last_lines: collections.Counter = collections.Counter()
    sending_started = time.monotonic()
    await asyncio.gather(*(_fuzz_worker(address, Mutator(pool, args.seed * 1000 + i), min(share, args.fuzz_frames - i * share),
                                        deadline, totals, codes, last_lines)
                           for i in range(args.fuzz_connections)))
    seconds = time.monotonic() - sending_started
    return {"pool": len(pool), "pool_seconds": round(pool_s, 1), "seed": args.seed, "frames_target": args.fuzz_frames,
            "frames_sent": totals["sent"], "bytes_sent": totals["bytes"], "seconds": round(seconds, 1),
            "frames_per_s": round(totals["sent"] / seconds) if seconds else None,
            "connections_opened": totals["connections"], "closed_by_gateway": totals["closed_by_gateway"],
            "given_up_in_an_unfinished_frame": totals["given_up_unanswered"],
            "connect_errors": dict(totals["connect_errors"]), "reply_frames": dict(codes.most_common()),
            "last_line_before_close": dict(last_lines.most_common(8)), "attack_window": [attack_start, time.time()]}


async def _fuzz_worker(address, mutator, frames: int, deadline: float, totals: dict,
                       codes: collections.Counter, last_lines: collections.Counter, batch: int = 20) -> None:
    """Frames ``batch`` at a time, each batch once the gateway has answered something of the last
    (or closed): what is written after the gateway closed is at most one batch.  A connection whose
    batches go unanswered 3 times running (a frame swallowing them as its body) is given up."""
    sent = 0
    while sent < frames and time.monotonic() < deadline:
        try:
            reader, writer = await open_raw(address)
            await asyncio.wait_for(reader.readline(), 10)
        except Exception as error:  # noqa: BLE001 - counted; try again
            totals["connect_errors"][_error_name(error)] += 1
            await asyncio.sleep(0.5)
            continue
        totals["connections"] += 1
        counter = ReplyCounter()
        reading = asyncio.create_task(_read_into(reader, counter))
        writer.write(b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n")
        unanswered = 0
        try:
            while sent < frames and time.monotonic() < deadline and not reading.done() and unanswered < 3:
                chunk = [mutator.frame() for _ in range(min(batch, frames - sent))]
                data = b"".join(chunk)
                before = counter.frames
                writer.write(data)
                await writer.drain()
                sent += len(chunk)
                totals["sent"] += len(chunk)
                totals["bytes"] += len(data)
                unanswered = 0 if await _answered(counter, before, reading, 0.3) else unanswered + 1
        except (ConnectionError, OSError):
            pass
        totals["given_up_unanswered"] += unanswered >= 3
        if not reading.done():  # we stop: let the gateway answer what it has, then reset
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(reading), 2)
        if reading.done():
            totals["closed_by_gateway"] += 1
            last_lines[counter.last_line.decode(errors="replace")[:60]] += 1
        reading.cancel()
        abort(writer)
        codes.update(counter.codes)


async def _read_into(reader, counter: ReplyCounter) -> None:
    try:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(1 << 16):
                counter.feed(chunk)
    finally:
        counter.changed.set()


async def _answered(counter: ReplyCounter, before: int, reading: asyncio.Task, timeout: float) -> bool:
    """Whether the gateway answered anything past ``before`` frames (or closed) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while counter.frames <= before and not reading.done():
        counter.changed.clear()
        try:
            await asyncio.wait_for(counter.changed.wait(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            return False
    return True


async def brute(address, args) -> dict:
    """Wrong passwords for ``victim`` (LOGIN + PASS pipelined, 50 pairs a write) over
    ``args.brute_connections`` connections until ``args.brute_attempts`` or ``args.brute_seconds``;
    meanwhile the owner logs in with the right password every 2 s.  Afterwards: how long until
    the owner gets in again."""
    from gateway.client import SMQPClient

    deadline = time.monotonic() + args.brute_seconds
    share = -(-args.brute_attempts // args.brute_connections)
    counts: collections.Counter = collections.Counter()
    sent = [0]
    owner: list[dict] = []
    started = time.monotonic()

    over = asyncio.Event()

    async def owner_tries() -> None:
        while not over.is_set():
            at = time.monotonic()
            try:
                async with await SMQPClient.open(*address, "victim", PASSWORDS["victim"], timeout=10):
                    owner.append({"after_s": round(at - started, 1), "outcome": "200"})
            except Exception as error:  # noqa: BLE001 - the figure
                owner.append({"after_s": round(at - started, 1), "outcome": str(error)[:60]})
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(over.wait(), 2)

    owning = asyncio.create_task(owner_tries())
    await asyncio.gather(*(_brute_worker(address, min(share, args.brute_attempts - i * share), deadline, counts, sent)
                           for i in range(args.brute_connections)))
    seconds, ended = time.monotonic() - started, time.time()
    attack_window = [ended - seconds, ended]
    over.set()
    await owning
    regained = await _owner_regains(address, ended, args.owner_wait)
    refused = [o for o in owner if o["outcome"] != "200"]
    return {"attempts_sent": sent[0], "seconds": round(seconds, 1), "attempts_per_s": round(sent[0] / seconds),
            "replies": dict(counts.most_common()), "owner_logins_during": len(owner),
            "owner_refused_during": len(refused), "owner_outcomes": sorted({o["outcome"] for o in owner}),
            "owner_in_again_after_attack_s": regained, "attack_window": attack_window}


async def _brute_worker(address, attempts: int, deadline: float, counts: collections.Counter, sent: list) -> None:
    done = 0
    while done < attempts and time.monotonic() < deadline:
        try:
            reader, writer = await open_raw(address)
            await asyncio.wait_for(reader.readline(), 10)
        except Exception as error:  # noqa: BLE001
            counts[f"connect: {_error_name(error)}"] += 1
            await asyncio.sleep(0.2)
            continue
        counter = ReplyCounter(by_line=True)
        try:
            while done < attempts and time.monotonic() < deadline:
                pairs = min(50, attempts - done)
                writer.write(b"".join(b"LOGIN victim CLEAR/1.0\r\nPASS victim wrong-%d\r\n" % (done + n)
                                      for n in range(pairs)))
                expected = counter.frames + 2 * pairs
                while counter.frames < expected:
                    chunk = await asyncio.wait_for(reader.read(65536), 30)
                    if not chunk:
                        raise ConnectionError("closed by the gateway")
                    counter.feed(chunk)
                done += pairs
                sent[0] += pairs
        except Exception as error:  # noqa: BLE001 - counted; connect again
            counts[f"connection ended: {_error_name(error)}"] += 1
        abort(writer)
        counts.update(counter.codes)  # "200 OK" is LOGIN's go-ahead for PASS; a PASS accepted would say more


async def _owner_regains(address, attack_end: float, wait_s: float) -> float | None:
    """Seconds after the attack's end until the owner's right password is accepted (None: not within ``wait_s``)."""
    from gateway.client import SMQPClient

    while time.time() - attack_end < wait_s:
        with contextlib.suppress(Exception):
            async with await SMQPClient.open(*address, "victim", PASSWORDS["victim"], timeout=10):
                return round(time.time() - attack_end, 1)
        await asyncio.sleep(1)
    return None


# -- the stack and the run

@contextlib.contextmanager
def own_stack(workdir: str) -> Iterator[tuple[tuple[str, int], subprocess.Popen]]:
    """A Kafka node and one gateway process (no streaming job) with the run's accounts, hashed as
    ``python -m gateway.accounts`` would (200,000 PBKDF2 iterations: what a guess costs the gateway)."""
    from gateway.accounts import hash_password

    with KafkaBroker(f"{workdir}/kafka", settings=load_config(env={}).local_kafka) as broker:
        config = load_config(env={}, data_dir=f"{workdir}/data", kafka={"bootstrap": broker.bootstrap},
                             gateway={"port": free_port()})
        create_topics(config.kafka)
        config_file = Path(workdir, "smqp.toml")
        config_file.write_text("[accounts]\n" + "".join(f'{name} = "{hash_password(password)}"\n'
                                                        for name, password in PASSWORDS.items()))
        env = dict(os.environ, SMQP_CONFIG=str(config_file), SMQP_DATA_DIR=config.data_dir,
                   SMQP_KAFKA_BOOTSTRAP=broker.bootstrap, SMQP_GATEWAY_PORT=str(config.gateway.port))
        gateway = subprocess.Popen([sys.executable, "-m", "gateway.server"], env=env, start_new_session=True,
                                   stdout=open(f"{workdir}/gateway.log", "wb"), stderr=subprocess.STDOUT)
        try:
            wait_for_port(config.gateway.host, config.gateway.port, 120)
            yield (config.gateway.host, config.gateway.port), gateway
        finally:
            if gateway.poll() is None:
                gateway.send_signal(signal.SIGTERM)
                try:
                    gateway.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(gateway.pid, signal.SIGKILL)
                    gateway.wait(10)


def raise_file_limit(needed: int) -> dict:
    """Raise this process's soft RLIMIT_NOFILE towards ``needed`` (up to the hard limit); a gateway
    started afterwards inherits it.  Says what it found, what it set and whether that suffices."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = soft if soft >= needed else (needed if hard == resource.RLIM_INFINITY else min(hard, needed))
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return {"soft_before": soft, "hard": hard, "soft_now": target, "needed": needed, "enough": target >= needed}


def gateway_log_errors(path: Path | None) -> dict:
    """Tracebacks and ERROR lines the gateway logged (the first few, by kind)."""
    if path is None or not path.exists():
        return {"log": None}
    text = path.read_text(errors="replace")
    kinds: collections.Counter = collections.Counter()
    for entry in re.split(r"\n(?=\d{4}-\d\d-\d\d )", text):
        if " ERROR " not in entry and "Traceback" not in entry:
            continue
        lines = entry.splitlines()
        raised = [line for line in lines if re.match(r"^[A-Za-z_.]+(Error|Exception|Misuse)\b", line)]
        ours = [line.strip() for line in lines if re.search(r'File "[^"]*/(gateway|kafka_edge|schemas)/', line)]
        logged = re.sub(r"\(.*|\d+", "", lines[0].split(" ERROR ", 1)[-1])[:60].strip()
        kinds[" | ".join(filter(None, (logged, raised[-1][:120] if raised else "", ours[-1] if ours else "")))] += 1
    return {"log": str(path), "tracebacks": text.count("Traceback (most recent call last)"),
            "errors_by_kind": dict(kinds.most_common(10))}


async def run_phases(address, args, gateway_pid: int | None, sampler: Sampler) -> list[PhaseWindow]:
    attacks = {"flood": flood, "slow": slow, "fuzz": fuzz, "brute": brute}
    windows = []

    async def phase(name: str, work) -> None:
        window = PhaseWindow(name, time.time(), cpu_start=cpu_seconds(gateway_pid) if gateway_pid else 0.0)
        print(f"[{datetime.now().strftime('%H:%M:%S')}] phase {name} ...", flush=True)
        try:
            window.figures = await work
        except Exception as error:  # noqa: BLE001 - one phase failing is a result, the others still run
            window.figures = {"phase_failed": f"{_error_name(error)}: {error}"}
        window.end = time.time()
        if gateway_pid:
            window.figures["gateway_cpu_s"] = round(cpu_seconds(gateway_pid) - window.cpu_start, 1)
            window.figures["gateway_rss_peak_mb"] = sampler.peak(window.start, window.end)
        windows.append(window)
        print(f"  {name}: {json.dumps(window.figures)}", flush=True)

    await phase("before", asyncio.sleep(args.quiet_seconds, result={}))
    for name in args.phases:
        await phase(name, attacks[name](address, args))
        await phase(f"after {name}", asyncio.sleep(args.settle_seconds, result={}))
    return windows


def report(args, windows: list[PhaseWindow], legit: dict, gateway, limits: dict, log: Path | None,
           started: datetime) -> dict:
    alive = gateway.poll() is None if gateway else None
    phases = {}
    for window in windows:
        phases[window.name] = {"phase_seconds": round(window.end - window.start, 1),
                               "legit_noop": latency_figures(legit["samples"], window.start, window.end),
                               **window.figures}
        attack = phases[window.name].pop("attack_window", None)
        if attack:  # the attack proper, without its preparation or aftermath
            phases[window.name]["legit_noop_during_attack"] = latency_figures(legit["samples"], *attack)
    unserved = sum(p["legit_noop"]["unanswered"] for p in phases.values())
    result = {
        "started": started.isoformat(timespec="seconds"), "ended": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "host": {"cores": os.cpu_count(), "load_average_end": [round(x, 2) for x in os.getloadavg()], "note": args.note},
        "target": "own stack: Kafka + one gateway process, no streaming job (DELIVERY ALL is routed early by the "
                  "gateway)" if args.own_stack else f"{args.address}",
        "settings": {k: v for k, v in vars(args).items() if k not in ("file_limit", "note")},
        "gateway_limits": limits, "file_limit": args.file_limit,
        "phases": phases,
        "legit": {"noop_interval_s": args.noop_interval, "published": legit["published"], "received": legit["received"],
                  "lost": legit["lost"], "lost_smuids": legit["lost_smuids"], "duplicates": legit["duplicates"],
                  "unexpected": legit["unexpected"], "noops_unanswered": unserved,
                  "events": legit["events"][:30], "events_total": len(legit["events"])},
        "gateway": {"alive_at_end": alive, "exit_code": None if alive or gateway is None else gateway.returncode,
                    "rss_peak_mb": peak_memory_mb(gateway.pid) if alive else None,
                    "rss_end_mb": resident_memory_mb(gateway.pid) if alive else None, **gateway_log_errors(log)},
    }
    result["verdict"] = {"gateway_alive": alive is not False, "no_message_lost": legit["lost"] == 0,
                         "legit_client_always_served": unserved == 0 and not legit["events"],
                         "no_error_logged_by_gateway": not result["gateway"].get("tracebacks")}
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.adversary", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--address", help="attack this running gateway (host:port, 127.0.0.1 only; it must accept guest and have "
                          "the accounts legit, legit_pub, legit_sub, victim with this script's passwords) "
                          "instead of starting a stack")
    add("--gateway-pid", type=int, help="with --address: the gateway's process id, to measure its memory and CPU")
    add("--phases", default="flood,slow,fuzz,brute", help="which attacks, in order (default: all four)")
    add("--quick", action="store_true", help="every phase scaled down to seconds (development)")
    add("--quiet-seconds", type=float, default=10, help="legitimate traffic alone before the attacks (default 10)")
    add("--settle-seconds", type=float, default=5, help="legitimate traffic alone after each attack (default 5)")
    add("--noop-interval", type=float, default=0.05, help="seconds between the legitimate client's NOOPs (default 0.05)")
    add("--publish-rate", type=float, default=20, help="legitimate guaranteed PUBs per second (default 20)")
    add("--drain-seconds", type=float, default=30, help="allowed for the last messages to arrive (default 30)")
    add("--flood", type=int, default=10_000, help="connections opened and held (default 10,000)")
    add("--flood-concurrency", type=int, default=500, help="connections being opened at once (default 500)")
    add("--flood-hold", type=float, default=10, help="seconds they are held before checking them (default 10)")
    add("--flood-seconds", type=float, default=120, help="time bound for opening them (default 120)")
    add("--slow-seconds", type=float, default=45, help="length of the slow phase (default 45: beyond the "
                                                        "default frame_timeout_s of 30)")
    add("--slow-readers", type=int, default=50, help="subscribers that never read (default 50)")
    add("--slow-messages", type=int, default=400, help="messages published to them (default 400)")
    add("--slow-message-bytes", type=int, default=16384, help="size of each (default 16 KiB)")
    add("--slow-writers", type=int, default=50, help="clients sending a byte at a time (default 50)")
    add("--slow-byte-interval", type=float, default=0.1, help="seconds between their bytes (default 0.1)")
    add("--unfinished", type=int, default=10, help="frames left unfinished, and as many dribbled (default 10 each)")
    add("--dribble-interval", type=float, default=5, help="seconds between dribbled bytes (default 5)")
    add("--fuzz-frames", type=int, default=1_000_000, help="random and mutated frames sent (default 1,000,000)")
    add("--fuzz-pool", type=int, default=15_000, help="frames drawn by hypothesis, then mutated (default 15,000)")
    add("--fuzz-connections", type=int, default=32, help="connections sending them at once (default 32)")
    add("--fuzz-seconds", type=float, default=300, help="time bound of the fuzz (default 300)")
    add("--seed", type=int, default=32, help="seed of the pool and of the mutations (default 32)")
    add("--brute-attempts", type=int, default=1_000_000, help="wrong passwords tried (default 1,000,000)")
    add("--brute-connections", type=int, default=50, help="connections trying them (default 50)")
    add("--brute-seconds", type=float, default=30, help="time bound of the brute force (default 30)")
    add("--owner-wait", type=float, default=45, help="seconds to wait for the owner to get in afterwards (default 45)")
    add("--note", default="", help="a remark stored with the figures (e.g. what else the host was running)")
    add("--json", help="where the figures go (default bench-results/adversary-<UTC date>.json)")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in dict(quiet_seconds=3, settle_seconds=2, flood=500, flood_hold=2, slow_seconds=8,
                                slow_readers=5, slow_messages=100, slow_writers=5, slow_byte_interval=0.02,
                                unfinished=2, dribble_interval=1, fuzz_frames=20_000, fuzz_pool=500, fuzz_connections=4,
                                fuzz_seconds=60, brute_attempts=2_000, brute_connections=10, brute_seconds=10,
                                owner_wait=40, drain_seconds=15).items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(args.phases) - {"flood", "slow", "fuzz", "brute"}
    if unknown:
        parser.error(f"unknown phase(s) {sorted(unknown)}")
    if args.address:
        host, _, port = args.address.rpartition(":")
        if host not in ("127.0.0.1", "localhost"):
            parser.error("--address: this script attacks 127.0.0.1 only")
        args.address = ("127.0.0.1", int(port))
    args.own_stack = not args.address
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(timezone.utc)
    needed = (args.flood if "flood" in args.phases else 0) + args.brute_connections + args.slow_readers \
        + args.slow_writers + 2 * args.unfinished + args.fuzz_connections + 200
    args.file_limit = raise_file_limit(needed)
    if not args.file_limit["enough"]:
        print(f"file limit: {args.file_limit['soft_now']} open files allowed (hard limit {args.file_limit['hard']}), "
              f"{needed} needed: the flood will hit EMFILE on this side before the gateway's limits", flush=True)
    limits = {k: getattr(load_config(env={}).gateway, k) for k in (
        "max_connections", "max_logins", "max_bad_commands", "frame_timeout_s", "max_buffered_bytes",
        "stalled_client_timeout_s", "max_login_failures", "login_lockout_s")} if args.own_stack else "unknown"
    workdir = tempfile.mkdtemp(prefix="smqp-adversary-")
    try:
        with stopping_on_sigterm():
            if args.own_stack:
                print(f"starting Kafka and one gateway (no streaming job: DELIVERY ALL is routed early by the "
                      f"gateway); logs in {workdir}", flush=True)
                with own_stack(workdir) as (address, gateway):
                    result = _attack(address, gateway, args, limits, Path(workdir, "gateway.log"), started)
            else:
                result = _attack(args.address, None, args, limits, None, started)
    except KeyboardInterrupt:
        print("adversary: interrupted; what it started is stopped", flush=True)
        return 130
    path = Path(args.json or ROOT / f"bench-results/adversary-{started.strftime('%Y-%m-%d')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("legit", "gateway", "verdict")}, indent=2))
    print(f"figures in {path}", flush=True)
    ok = all(result["verdict"].values())
    print("adversary:", "gateway alive, no message lost, legitimate client served throughout" if ok
          else f"FOUND PROBLEMS: {result['verdict']}", flush=True)
    return 0 if ok else 1


class _PidOnly:
    """What ``report`` needs of a gateway it did not start (--gateway-pid)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return None if Path(f"/proc/{self.pid}").exists() else -1


def _attack(address, gateway, args, limits, log: Path | None, started: datetime) -> dict:
    """The legitimate client's process, the attacks, then its figures and the report."""
    if gateway is None and args.gateway_pid:
        gateway = _PidOnly(args.gateway_pid)
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    legit = context.Process(target=legit_main, name="legit-client", daemon=True,
                            args=(address, LEGIT_TOPIC, args.publish_rate, args.noop_interval, args.drain_seconds, theirs))
    legit.start()
    try:
        if not ours.poll(120) or not ours.recv().get("ready"):
            raise RuntimeError("the legitimate client did not get going within 120 s")
        print(f"legitimate client: NOOP every {args.noop_interval:g} s, {args.publish_rate:g} guaranteed PUB/s "
              f"to {LEGIT_TOPIC}, subscriber ACKing; phases {', '.join(args.phases)}", flush=True)
        pid = gateway.pid if gateway else None
        with Sampler(pid) as sampler:
            windows = asyncio.run(run_phases(address, args, pid, sampler))
        print("stopping the legitimate publisher; waiting for its last messages ...", flush=True)
        ours.send("stop")
        if not ours.poll(args.drain_seconds + 60):
            raise RuntimeError("the legitimate client did not report")
        figures = ours.recv()
    finally:
        legit.join(10)
        if legit.is_alive():
            legit.kill()
    return report(args, windows, figures, gateway, limits, log, started)


if __name__ == "__main__":
    sys.exit(main())
