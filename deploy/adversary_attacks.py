"""The adversarial run's four attacks on a gateway, each bounded in count and time: a flood of
connections, slow readers/writers and unfinished frames, fuzzed frames, and a password brute force.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

from deploy.adversary_wire import PASSWORDS, ReplyCounter, SLOW_TOPIC, abort, error_name, open_raw
from schemas.config import load_config


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
                refused[f"connect: {error_name(error)}"] += 1
                return
            try:
                greeting = await asyncio.wait_for(reader.readline(), 10)
            except Exception as error:  # noqa: BLE001
                refused[f"greeting: {error_name(error)}"] += 1
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
        return {**outcome, "error": error_name(error)}

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
        outcome["error"] = error_name(error)
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
            totals["connect_errors"][error_name(error)] += 1
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
            counts[f"connect: {error_name(error)}"] += 1
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
            counts[f"connection ended: {error_name(error)}"] += 1
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
