"""Our engine as one side of the benchmark: the whole stack, driven through the reference client.

``running_smqp(subscribers)`` starts a one-node Kafka, the streaming job and one
gateway (``deploy.stack``) with a publisher account and a pool of subscriber
accounts, and yields an :class:`SMQPSystem`, the adapter the workloads of
``deploy.compare_workloads`` drive: a destination is a topic under
``/bench``, a subscriber an account subscribed to it (subscriptions survive
QUIT, so an offline subscriber's messages wait in the gateway's book).
Subscribers ask for a notify window (SET NOTIFY WINDOW, our pipelining
extension; ``notify_window``, which ``deploy.compare`` sets to RabbitMQ's
prefetch): up to that many NOTIFYs await their ACK, and each ``ack()`` is
sent without waiting for the previous reply; ``flush()`` waits for them all.

``python -m deploy.bench`` runs the same workloads against this side alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import urllib.request
from typing import Iterator

from deploy.stack import Stack, running_stack
from gateway.client import SMQPClient, SMQPError

# Separate accounts: every login of an account is sent its messages (spec section 3),
# so publishers logged in as a subscriber would be sent copies too.
PUBLISHER = ("benchpub", "bench-pub-pw")
ACK_LATENCY = "smqp_gateway_ack_latency_seconds"


def _password(account: str) -> str:
    return f"{account}-pw"


class _Publisher:
    def __init__(self, client: SMQPClient, topic: str):
        self.client, self.topic = client, topic

    async def publish(self, body: bytes) -> None:
        await self.client.publish(self.topic, body)

    async def close(self) -> None:
        await _quit(self.client)


class _Subscriber:
    def __init__(self, client: SMQPClient):
        self.client = client
        # in a notify window: ACKs sent whose 310 ACK is not back, oldest first, and the failed ones
        self.acks: collections.deque[asyncio.Future] = collections.deque()
        self.failed: list[asyncio.Future] = []

    async def receive(self, timeout: float):
        note = await self.client.next_notification(timeout)  # a Notification: .data, .ack() (two-phase)
        return note if self.client.notify_window == 1 else _Windowed(note, self)

    def track(self, ack: asyncio.Future) -> None:
        """Keep ``ack`` until its ``310 ACK`` came back; a failed one stays for :meth:`flush` to raise.
        Replies come in order, so the answered ones are dropped from the front as new ones come:
        no callback, and no step of the event loop, per acknowledgement."""
        acks = self.acks
        acks.append(ack)
        while acks and acks[0].done():
            answered = acks.popleft()
            if answered.cancelled() or answered.exception() is not None:
                self.failed.append(answered)

    async def flush(self) -> None:
        """Wait until every ACK sent has its server ``310 ACK`` (durable); raise if one failed."""
        acks = [*self.failed, *self.acks]
        self.acks.clear()
        self.failed.clear()
        await asyncio.gather(*acks)

    async def close(self) -> None:
        with contextlib.suppress(ConnectionError, OSError, SMQPError, asyncio.TimeoutError):
            await asyncio.wait_for(self.flush(), 10)
        await _quit(self.client)


class _Windowed:
    """A notification in a notify window: ``ack()`` sends ``310 ACK <smuid>`` and returns at once,
    like pika's ``basic_ack``; the subscriber's ``flush()`` waits for the replies."""

    def __init__(self, note, subscriber: _Subscriber):
        self.note, self.subscriber = note, subscriber
        self.data = note.data

    async def ack(self) -> None:
        self.subscriber.track(self.note.acknowledge())


async def _quit(client: SMQPClient) -> None:
    """QUIT (subscriptions are kept), or just close a connection that is already gone."""
    with contextlib.suppress(ConnectionError, OSError, SMQPError, asyncio.TimeoutError):
        await asyncio.wait_for(client.quit(), 10)
    await client.close()


class SMQPSystem:
    """The workloads' view of our stack (see ``deploy.compare_workloads.System``)."""

    name = "smqp"

    def __init__(self, stack: Stack, accounts: list[str], notify_window: int = 1):
        self.stack = stack
        self.notify_window = notify_window  # SET NOTIFY WINDOW of every subscriber (1: the spec's way)
        self.host, self.port = stack.address
        self._unused = iter(accounts)

    @staticmethod
    def topic(dest: str) -> str:
        return f"/bench/{dest}"

    async def _open(self, account: str, password: str) -> SMQPClient:
        return await SMQPClient.open(self.host, self.port, account, password)

    async def create(self, dest: str, subscribers: int) -> list[str]:
        topic = self.topic(dest)
        admin = await self._open(*PUBLISHER)
        try:
            await admin.create_topic(topic)
        finally:
            await _quit(admin)
        names = [next(self._unused) for _ in range(subscribers)]
        for name in names:
            client = await self._open(name, _password(name))
            try:
                await client.subscribe(topic)
            finally:
                await _quit(client)
        return names

    async def publisher(self, dest: str) -> _Publisher:
        return _Publisher(await self._open(*PUBLISHER), self.topic(dest))

    async def subscriber(self, dest: str, name: str) -> _Subscriber:
        client = await self._open(name, _password(name))
        if self.notify_window > 1:
            await client.set_notify_window(self.notify_window)
        return _Subscriber(client)

    async def settle(self, dest: str, published: int, timeout: float) -> float:
        """Seconds until the job has committed ``published`` messages of the topic to Delta (COUNT MESSAGE)."""
        started = time.monotonic()
        client = await self._open(*PUBLISHER)
        try:
            while await client.count_messages(self.topic(dest)) < published:
                if time.monotonic() - started > timeout:
                    raise TimeoutError(f"the job committed fewer than {published} messages within {timeout:g} s")
                await asyncio.sleep(0.5)
        finally:
            await _quit(client)
        return time.monotonic() - started

    async def cleanup(self, dest: str) -> None:
        """Nothing: the topic and its history stay, as they would for a user."""

    async def observe(self) -> dict:
        """The gateway's cumulative NOTIFY → two-phase ACK cycle time (sum, count) from its /metrics."""
        url = f"http://{self.host}:{self.stack.config.gateway.status_port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        values = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in (f"{ACK_LATENCY}_sum", f"{ACK_LATENCY}_count"):
                values[name.rsplit("_", 1)[1]] = float(value)
        return {"ack_cycle": values}

    def processes(self) -> dict[str, int]:
        return {"gateway": self.stack.children["gateway"].pid,
                "Spark driver + JVM": self.stack.children["job"].pid,
                "Kafka broker JVM": self.stack.broker.process.pid}


@contextlib.contextmanager
def running_smqp(subscribers: int, notify_window: int = 1) -> Iterator[SMQPSystem]:
    """Our whole stack with a publisher account and ``subscribers`` subscriber accounts, whose
    logins ask for ``notify_window``."""
    accounts = [f"bsub{i}" for i in range(subscribers)]
    with running_stack({PUBLISHER[0]: PUBLISHER[1], **{a: _password(a) for a in accounts}}) as stack:
        yield SMQPSystem(stack, accounts, notify_window)
