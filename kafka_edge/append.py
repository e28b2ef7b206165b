"""Durable appends: records batched per partition by the event loop, acks=all.

Each partition has one produce request in flight at a time: what is appended while a request is
out goes in the next one.  Appends no caller waits on alone (``linger=True``: pipelined
commands, acknowledgements within a window) may wait ``linger_ms`` (Kafka's producer setting)
for others to share their request, until ``batch_bytes`` (Kafka's ``batch.size``) are waiting;
any other append sends it at once, lingering ones included (see :meth:`DurableLog._linger`).
Order within a partition holds, retries included.  An append completes once Kafka acknowledged
it (acks=all), or fails once ``delivery_timeout_ms`` has passed without that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import kafka.errors as Errors
from kafka.partitioner.default import murmur2

from kafka_edge.cluster import Cluster
from kafka_edge.connection import KafkaUnavailable, backoff
from kafka_edge.records import encode_batch
from kafka_edge.settings import ClientSettings
from kafka_edge.wire import produce

log = logging.getLogger(__name__)

#: Bytes of records per produce request (a single larger record still goes, alone): under the
#: brokers' default ``message.max.bytes`` of ~1 MB.
MAX_BATCH_BYTES = 512 * 1024
#: How many keys' partitions a :class:`DurableLog` remembers (forgotten all at once beyond that).
PARTITION_MEMORY = 65536


class Appended(NamedTuple):
    """Where an appended record is: it is durable there (acks=all)."""

    partition: int
    offset: int


@dataclass(slots=True)
class _Record:
    key: bytes | None
    value: bytes
    future: asyncio.Future
    deadline: float  # monotonic: not durable by then, it fails
    headers: list[tuple[str, bytes]]


class _Lane:
    """One partition's records waiting to be appended, whether a request of it is out, and when
    the next request is due (the earliest any waiting record may leave)."""

    __slots__ = ("partition", "waiting", "waiting_bytes", "busy", "due", "wake")

    def __init__(self, partition: int):
        self.partition = partition
        self.waiting: deque[_Record] = deque()
        self.waiting_bytes = 0  # of the records in ``waiting`` (:func:`_size`)
        self.busy = False
        self.due = float("inf")
        self.wake: asyncio.Future | None = None  # set while the lane lingers: resolving it sends now


class DurableLog:
    """Appends to the partitions of one topic; an append completes once Kafka acked it (acks=all).

    Records are batched per partition by the event loop (see the module docstring).  A record
    given no partition goes by its key, as Kafka's default partitioner places it.
    """

    def __init__(self, settings: ClientSettings, cluster: Cluster, topic: str, partitions: list[int]):
        self._settings = settings
        self._cluster = cluster
        self._topic = topic
        self._topic_bytes = topic.encode()
        self._lanes = {p: _Lane(p) for p in partitions}
        self._keyed = sorted(partitions)
        self._partition_of: dict[bytes, int] = {}
        self._tasks: set[asyncio.Task] = set()

    @property
    def partitions(self) -> list[int]:
        return sorted(self._lanes)

    @classmethod
    async def open(cls, settings: ClientSettings, cluster: Cluster, topic: str) -> DurableLog:
        """Reach Kafka and learn ``topic``'s partitions (fails if Kafka cannot be reached)."""
        return cls(settings, cluster, topic, await cluster.partitions(topic))

    def append(self, key: bytes | None, value: bytes, *, partition: int | None = None,
               linger: bool = False, headers: list[tuple[str, bytes]] | None = None) -> asyncio.Future:
        """Send one record; the returned future resolves to its :class:`Appended` place once it is
        durable, or fails.  ``partition`` pins it (control events go to partition 0); otherwise
        its key chooses, as Kafka's default partitioner does (murmur2).  ``linger``: it may wait up
        to ``linger_ms`` for others to share its request — for appends nobody waits on alone (a
        pipelined PUB, an ACK of a NOTIFY window); without it the request leaves at once, taking
        along whatever lingers.  ``headers``: the record's Kafka headers."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        lane = self._lanes.get(self.partition_for(key) if partition is None else partition)
        if lane is None:
            future.set_exception(Errors.UnknownTopicOrPartitionError(f"{self._topic} has no partition {partition}"))
            return future
        now = time.monotonic()
        record = _Record(key, value, future, now + self._settings.delivery_timeout_ms / 1000, headers or [])
        lane.waiting.append(record)
        lane.waiting_bytes += _size(record)
        due = now + self._settings.linger_ms / 1000 if linger and lane.waiting_bytes < self._settings.batch_bytes else now
        if due < lane.due:
            lane.due = due
            if lane.wake is not None and not lane.wake.done():
                lane.wake.set_result(None)
        if not lane.busy:
            lane.busy = True  # the task's first step runs after this tick: what is appended meanwhile joins
            task = loop.create_task(self._send(lane))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return future

    def partition_for(self, key: bytes | None) -> int:
        """Kafka's default partitioner, remembered per key: murmur2 in Python costs ~3-5 µs a call, as
        much as encoding the record (keys are accounts and topics, few and recurring)."""
        if len(self._keyed) == 1 or not key:
            return self._keyed[0]
        partition = self._partition_of.get(key)
        if partition is None:
            if len(self._partition_of) >= PARTITION_MEMORY:
                self._partition_of.clear()
            partition = self._partition_of[key] = self._keyed[(murmur2(key) & 0x7FFFFFFF) % len(self._keyed)]
        return partition

    async def _send(self, lane: _Lane) -> None:
        """Send ``lane``'s records, a request at a time, until none wait; retry what Kafka could not
        take (at the front, in order) until each record's deadline."""
        attempt = 0
        try:
            while lane.waiting:
                await self._linger(lane)
                batch = self._take(lane)
                if not batch:
                    continue
                try:
                    error = await self._produce(lane.partition, batch)
                except Errors.KafkaError as failure:  # unreachable, connection lost, no leader
                    error = failure
                if error is None:
                    attempt = 0
                    continue
                if not getattr(error, "retriable", False):
                    for record in batch:
                        _settle(record.future, error)
                    continue
                lane.waiting.extendleft(reversed(batch))  # again, first, in order, after the backoff
                lane.waiting_bytes += sum(map(_size, batch))
                lane.due = 0.0
                if isinstance(error, Errors.InvalidMetadataError):
                    with contextlib.suppress(Errors.KafkaError):
                        await self._cluster.refresh()
                await asyncio.sleep(backoff(attempt))
                attempt += 1
        finally:
            lane.busy = False

    async def _linger(self, lane: _Lane) -> None:
        """Wait until ``lane``'s next request is due, so that what arrives meanwhile shares it.

        Kafka's ``linger.ms``: fewer, fuller record batches, at the cost of a wait.  Only
        ``linger`` appends wait: a lone PUB or a window-1 ACK, whose client waits on its reply,
        is sent at once, and so is a lane once ``batch_bytes`` wait: a publisher that keeps a
        window of PUBs in flight gets its replies a request sooner, not a linger later.  With
        ``linger_ms`` 0 (the project's default, measured in ``schemas/config.py``) nothing waits,
        and appends made while a request is out still share the next one."""
        wait = lane.due - time.monotonic()
        if wait <= 0:
            return
        loop = asyncio.get_running_loop()
        lane.wake = loop.create_future()
        timer = loop.call_later(wait, lambda wake: wake.done() or wake.set_result(None), lane.wake)
        try:
            await lane.wake
        finally:
            timer.cancel()
            lane.wake = None

    def _take(self, lane: _Lane) -> list[_Record]:
        """The next request's records: up to :data:`MAX_BATCH_BYTES`, failing those out of time."""
        now, size, batch = time.monotonic(), 0, []
        while lane.waiting and (not batch or size + len(lane.waiting[0].value) <= MAX_BATCH_BYTES):
            record = lane.waiting.popleft()
            lane.waiting_bytes -= _size(record)
            if record.future.done():
                continue
            if record.deadline <= now:
                _settle(record.future, Errors.KafkaTimeoutError(
                    f"not acknowledged by Kafka within {self._settings.delivery_timeout_ms} ms"))
                continue
            batch.append(record)
            size += _size(record)
        lane.due = now if lane.waiting else float("inf")  # what a full request left behind goes next, at once
        return batch

    async def _produce(self, partition: int, batch: list[_Record]) -> Exception | None:
        """One produce request; settles ``batch`` and returns None, or returns Kafka's error."""
        records = encode_batch([(record.key, record.value, record.headers) for record in batch],
                               int(time.time() * 1000))
        request = produce(self._topic_bytes, partition, records, int(self._cluster.request_timeout * 1000))
        connection = await self._cluster.leader(self._topic, partition, "append")
        answer = await connection.call(request, self._cluster.request_timeout + 1)
        if answer.error_code:
            return Errors.for_code(answer.error_code)(answer.error_message or "")
        for delta, record in enumerate(batch):
            if not record.future.done():
                record.future.set_result(Appended(partition, answer.base_offset + delta))
        return None

    async def close(self, timeout: float = 5.0) -> None:
        """Wait a few seconds for what is still being appended; with Kafka unreachable that is
        dropped (its callers were told it is not durable, or it was best effort: a presence
        announcement), rather than failing the gateway's stop."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            if pending:
                log.warning("Kafka unreachable at close: records not yet appended are dropped")
                for task in pending:
                    task.cancel()
        for lane in self._lanes.values():
            for record in lane.waiting:
                _settle(record.future, KafkaUnavailable("the log was closed before Kafka took it"))
            lane.waiting.clear()
            lane.waiting_bytes = 0




def _size(record: _Record) -> int:
    """What a record weighs against a request's limits: its value and key."""
    return len(record.value) + len(record.key or b"")


def _settle(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
