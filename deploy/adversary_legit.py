"""The adversarial run's legitimate client, in a process of its own: a NOOP prober, a publisher
and a subscriber that ACKs, whose figures say whether the attacks hurt a real user.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import statistics
import time

from deploy.adversary_wire import NOOP_TIMEOUT_S, PASSWORDS, error_name


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
            events.append({"t": time.time(), "who": who, "event": f"login failed: {error_name(error)} {error}"})
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
            events.append({"t": wall, "who": "prober", "event": f"NOOP failed: {error_name(error)} {error}"})
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
            events.append({"t": time.time(), "who": "publisher", "event": f"PUB failed: {error_name(error)} {error}"})
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
            events.append({"t": time.time(), "who": "subscriber", "event": f"{error_name(error)} {error}"})
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
