"""The comparison's workloads, written once against a small broker interface.

Each workload drives a :class:`System`: our engine through the reference
client (``deploy.smqp_adapter.SMQPSystem``) or RabbitMQ through pika
(``deploy.rabbit.RabbitSystem``).  A *destination* is an SMQP topic or a
RabbitMQ fanout exchange; a *subscriber* is an SMQP account subscribed to the
topic or a durable queue bound to the exchange, and keeps collecting while it
is offline.  Every message is 200 bytes, guaranteed/persistent, and starts
with its send time (``time.monotonic_ns``), so latency is measured in this
one process.  Every wait is bounded: a workload that cannot finish reports
what it achieved.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from deploy.compare_report import latency_summary, rss_growth
from deploy.stack import resident_memory_mb

BODY_SIZE = 200


class Delivery(Protocol):
    data: bytes

    async def ack(self) -> None:
        """SMQP: the two-phase ``310 ACK`` (at window 1 it returns once durable; in a notify window
        it returns once sent, like basic.ack); RabbitMQ: basic.ack (which has no reply)."""


class Publisher(Protocol):
    async def publish(self, body: bytes) -> None:
        """Returns once the broker has the message durably (SMQP ``200``, RabbitMQ's confirm);
        several may be in flight on one publisher."""

    async def close(self) -> None: ...


class Subscriber(Protocol):
    async def receive(self, timeout: float) -> Delivery:
        """The next message; ``TimeoutError`` after ``timeout`` seconds."""

    async def flush(self) -> None:
        """Wait until every acknowledgement sent is settled (SMQP in a notify window: each server
        ``310 ACK``, i.e. durable); a workload's end time is taken after it."""

    async def close(self) -> None:
        """Go offline; the subscription (queue) keeps collecting."""


class System(Protocol):
    name: str

    async def create(self, dest: str, subscribers: int) -> list[str]:
        """A new destination with ``subscribers`` durable subscriptions (offline); their names."""

    async def publisher(self, dest: str) -> Publisher: ...

    async def subscriber(self, dest: str, name: str) -> Subscriber:
        """Bring subscriber ``name`` online: it receives what was queued for it, then what follows."""

    async def settle(self, dest: str, published: int, timeout: float) -> float:
        """Seconds until ``published`` messages to ``dest`` are stored past the broker (our job has
        committed them); 0 where publishing already did that."""

    async def cleanup(self, dest: str) -> None: ...

    async def observe(self) -> dict:
        """Cumulative server-side counters worth a per-run difference (ours: the NOTIFY -> ACK cycle)."""

    def processes(self) -> dict[str, int]:
        """Every server process (a broker included), watched for memory and CPU: name -> pid
        (descendants included)."""


def stamped_body() -> bytes:
    head = f"{time.monotonic_ns()} ".encode()
    return head + b"x" * (BODY_SIZE - len(head))


def age_ms(data: bytes) -> float:
    return (time.monotonic_ns() - int(data.split(b" ", 1)[0])) / 1e6


Progress = Callable[[str], None]


@contextlib.asynccontextmanager
async def reporting(progress: Progress, status: Callable[[], str], every: float = 10.0):
    """Print ``status()`` every ``every`` seconds while the block runs."""

    async def loop() -> None:
        while True:
            await asyncio.sleep(every)
            progress(status())

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _pump(publisher: Publisher, count: int, window: int) -> None:
    """Publish ``count`` messages keeping ``window`` unacknowledged at most.  A semaphore, not
    ``asyncio.wait`` over the window at each completion: the harness's own CPU, which shares the
    machine with the servers, stays O(1) per message."""
    free = asyncio.Semaphore(window)
    failed: list[BaseException] = []

    async def one() -> None:
        try:
            await publisher.publish(stamped_body())
        except Exception as error:  # noqa: BLE001 - raised below, after the others settle
            failed.append(error)
        finally:
            free.release()

    tasks = []
    for _ in range(count):
        await free.acquire()
        if failed:
            break
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.gather(*tasks)
    if failed:
        raise failed[0]


async def publish_many(system: System, dest: str, messages: int, publishers: int, window: int,
                       timeout: float) -> float:
    """``publishers`` connections (opened before the clock starts) share ``messages``, each keeping
    ``window`` in flight; seconds until the last one was acknowledged."""
    clients = [await system.publisher(dest) for _ in range(publishers)]
    shares = [messages // publishers + (i < messages % publishers) for i in range(publishers)]
    try:
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(_pump(c, n, window) for c, n in zip(clients, shares))), timeout)
        return time.monotonic() - started
    finally:
        for client in clients:
            await client.close()


async def ingest(system: System, dest: str, messages: int, publishers: int, window: int, timeout: float) -> dict:
    """Acknowledged publishes to one destination nobody consumes from, msgs/s."""
    await system.create(dest, 0)
    seconds = await publish_many(system, dest, messages, publishers, window, timeout)
    await system.cleanup(dest)
    return {"published": messages, "seconds": round(seconds, 2), "msgs_per_s": round(messages / seconds)}


@dataclass
class _Paced:
    sent: int = 0
    confirmed: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    last_receipt: float = 0.0


async def warm_up(system: System, label: str, timeout: float) -> None:
    """100 messages at 20 msg/s to one subscriber, until all are delivered: connections, the job's
    first batches and the JIT warm before anything is measured."""
    warm = await paced(system, "warmup", 20, 5, timeout, 100, lambda _: None)
    if warm["not_delivered"]:
        raise RuntimeError(f"{label} delivered {warm['delivered']} of {warm['sent']} warm-up messages "
                           f"within {timeout:g} s")


async def paced(system: System, dest: str, rate: float, seconds: float, grace: float, max_in_flight: int,
                progress: Progress) -> dict:
    """Publish at a steady ``rate`` for ``seconds`` to one subscriber that acknowledges each message.

    A message is offered when due unless ``max_in_flight`` are unacknowledged (then the offered rate
    drops, and says so); offering stops at ``seconds`` whatever was sent.  The subscriber then has
    ``grace`` seconds to receive the rest; what it has not received counts as not delivered.
    """
    [name] = await system.create(dest, 1)
    subscriber = await system.subscriber(dest, name)
    publisher = await system.publisher(dest)
    state = _Paced()
    publishing_done = asyncio.Event()

    async def consume() -> None:
        while not (publishing_done.is_set() and len(state.latencies) >= state.sent - state.failed):
            try:
                delivery = await subscriber.receive(0.5)
            except (asyncio.TimeoutError, TimeoutError):
                continue
            state.latencies.append(age_ms(delivery.data))
            state.last_receipt = time.monotonic()
            await delivery.ack()
        await subscriber.flush()

    def settled(task: asyncio.Future) -> None:
        in_flight.discard(task)
        if task.cancelled() or task.exception() is not None:
            state.failed += 1
        else:
            state.confirmed += 1

    consumer = asyncio.create_task(consume())
    in_flight: set[asyncio.Future] = set()
    total = int(rate * seconds)
    status = lambda: (f"sent {state.sent:,}, acknowledged {state.confirmed:,}, "  # noqa: E731
                      f"delivered {len(state.latencies):,}")
    try:
        async with reporting(progress, status):
            started = time.monotonic()
            while state.sent < total and (now := time.monotonic()) < started + seconds:
                due = min(total, int((now - started) * rate) + 1)
                while state.sent < due and len(in_flight) < max_in_flight:
                    task = asyncio.ensure_future(publisher.publish(stamped_body()))
                    task.add_done_callback(settled)
                    in_flight.add(task)
                    state.sent += 1
                await asyncio.sleep(0.001)
            sending = time.monotonic() - started
            publishing_done.set()
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(consumer), grace)
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        for task in list(in_flight):
            task.cancel()
        await publisher.close()
        await subscriber.close()
    delivered_over = (state.last_receipt - started) if state.latencies else 0
    return {"rate": rate, "seconds": seconds, "sent": state.sent, "published": state.confirmed,
            "publishes_failed": state.failed, "offered_per_s": round(state.sent / sending),
            "delivered_per_s": round(len(state.latencies) / delivered_over) if delivered_over else 0,
            **latency_summary(state.latencies, state.sent)}


@dataclass
class _Tally:
    """What one subscriber received and acknowledged, and when the last one was."""

    received: int = 0
    last: float = 0.0

    async def take(self, client: Subscriber, wanted: int, deadline: float) -> None:
        """Receive and acknowledge until ``wanted`` or ``deadline`` (monotonic)."""
        while self.received < wanted and (left := deadline - time.monotonic()) > 0:
            try:
                delivery = await client.receive(min(left, 0.5))
            except (asyncio.TimeoutError, TimeoutError):
                continue
            await delivery.ack()
            self.received += 1
            self.last = time.monotonic()
        if self.received:
            await client.flush()  # the last acknowledgement is done only once settled
            self.last = time.monotonic()


async def fanout(system: System, dest: str, subscribers: int, messages: int, window: int, timeout: float,
                 progress: Progress) -> dict:
    """One publisher, ``subscribers`` online subscribers each acknowledging every message: deliveries
    per second from the first publish to the last acknowledged delivery."""
    names = await system.create(dest, subscribers)
    clients = [await system.subscriber(dest, name) for name in names]
    publisher = await system.publisher(dest)
    tallies = [_Tally() for _ in clients]
    published = None  # stays None unless every publish was acknowledged in time
    started = time.monotonic()
    try:
        status = lambda: f"{sum(t.received for t in tallies):,} of {subscribers * messages:,} deliveries"  # noqa: E731
        async with reporting(progress, status):
            consumers = [asyncio.create_task(t.take(c, messages, started + timeout)) for t, c in zip(tallies, clients)]
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(_pump(publisher, messages, window), timeout)
                published = messages
            await asyncio.gather(*consumers)
    finally:
        await publisher.close()
        for client in clients:
            await client.close()
    await system.cleanup(dest)
    delivered = sum(t.received for t in tallies)
    seconds = max(t.last for t in tallies) - started if delivered else timeout
    return {"subscribers": subscribers, "published": published, "deliveries_expected": subscribers * messages,
            "deliveries": delivered, "seconds": round(seconds, 2), "deliveries_per_s": round(delivered / seconds)}


async def drain(system: System, dest: str, backlog: int, publishers: int, window: int, timeout: float,
                progress: Progress) -> dict:
    """``backlog`` messages published while the one subscriber is offline and stored for it; then
    msgs/s from its reconnecting (login included) to its last acknowledgement."""
    [name] = await system.create(dest, 1)
    publish_s = await publish_many(system, dest, backlog, publishers, window, timeout)
    stored_s = await system.settle(dest, backlog, timeout)
    progress(f"backlog of {backlog:,} published in {publish_s:.1f} s, stored {stored_s:.1f} s later; draining ...")
    tally = _Tally()
    started = time.monotonic()
    client = await system.subscriber(dest, name)
    try:
        async with reporting(progress, lambda: f"{tally.received:,} of {backlog:,} delivered"):
            await tally.take(client, backlog, started + timeout)
    finally:
        await client.close()
    await system.cleanup(dest)
    seconds = tally.last - started if tally.received else timeout
    return {"backlog": backlog, "published": backlog, "publish_s": round(publish_s, 1),
            "stored_after_s": round(stored_s, 1), "delivered": tally.received, "seconds": round(seconds, 2),
            "msgs_per_s": round(tally.received / seconds)}


async def soak(system: System, dest: str, processes: dict[str, int], minutes: float, rate: float,
               sample_s: float, progress: Progress) -> dict:
    """A steady paced load for ``minutes`` while the resident memory of each of ``processes`` (name →
    pid, with descendants) is sampled every ``sample_s``; growth from the first to the last minute."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in processes}
    started = time.monotonic()

    async def sample() -> None:
        next_report = started + 60
        while True:
            now = time.monotonic()
            for name, pid in processes.items():
                samples[name].append((now - started, resident_memory_mb(pid)))
            if now >= next_report:
                next_report += 60
                progress("RSS " + ", ".join(f"{n} {s[-1][1]:,.0f} MiB" for n, s in samples.items()))
            await asyncio.sleep(sample_s)

    sampler = asyncio.create_task(sample())
    try:
        load = await paced(system, dest, rate, minutes * 60, 30, max(100, int(rate * 5)), progress)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    return {"minutes": minutes, "rate": rate, "messages_delivered": load["delivered"],
            "delivered_pct": round(100 * load["delivered"] / load["sent"], 1) if load["sent"] else 0.0, "load": load,
            "rss_growth": {name: rss_growth(points) for name, points in samples.items()},
            "rss_samples": {name: [(round(t, 1), mb) for t, mb in points] for name, points in samples.items()}}

