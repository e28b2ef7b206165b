"""The gateway's Kafka edges: the durable append and the tails, in the event loop.

All of a gateway's Kafka I/O runs in its asyncio loop, on kafka-python's
sans-I/O protocol layer (its request and response classes and
``KafkaProtocol`` framing; record batches in :mod:`gateway.kafka_records`)
over asyncio transports: no client threads.  kafka-python's own ``KafkaProducer`` and
``KafkaConsumer`` run a sender or poll thread each; in a gateway with two
producers and two consumers those threads and the loop took turns holding
the GIL, and each append paid for the hand-over (measured on this machine:
~74 µs of CPU per record for ``KafkaProducer`` on its own, against ~11 µs for
the same records framed here; the gateway spent 410-440 µs per publish).

**Appends** (:class:`DurableLog`) are batched by the loop itself, per
partition, with one produce request in flight per partition: what is appended
while a request is out goes in the next one.  Appends no client waits on alone
(pipelined PUBs, ACKs within a NOTIFY window) may wait ``linger_ms`` (Kafka's
producer setting) for others to share their request, until ``batch_bytes``
(Kafka's ``batch.size``) are waiting; any other append sends it at once,
lingering ones included (see :meth:`DurableLog._linger` for why).
Order within a partition holds, retries included.  An append completes once Kafka
acknowledged it (acks=all), or fails once ``delivery_timeout_ms`` has passed
without that (the client then gets 503).

**Tails** (:class:`Tail`) fetch partitions from their start, handing each
fetched batch to the loop's callback; they take a partition's end from the
fetch response's high watermark, not ListOffsets, which under-reports on the
dev broker.  ``fetch_max_wait_ms`` bounds each fetch: the dev broker holds an
empty fetch for that long even when records arrive meanwhile (Apache Kafka
answers as soon as there is data), so it is what a record waits, at most,
to be read on the dev broker.  The dev broker also answers *empty* when
gathering the records takes longer than that (a tail far behind, a loaded
host), so a tail lengthens its wait while that happens (:func:`next_wait_ms`).
``fetch_min_bytes`` lets a fetch wait for that many bytes (within the wait):
under load each fetch then brings many records rather than a few.  A tail that
fetched records and reached the end pauses ``tail_pause_factor`` times that
fetch's duration before the next (:meth:`Tail._pause`): on the dev broker a
fetch that finds records costs CPU in proportion to every batch the partition
holds, so the pause keeps a tail's share of the broker bounded as the log
grows, where fetching again at once took most of a core.

When Kafka is unreachable, appends fail after ``delivery_timeout_ms`` and
the tails keep retrying; connections are retried every
:data:`RECONNECT_BACKOFF_MAX_S` at most, so the same gateway goes on by itself
once Kafka is back (``tests/e2e/test_broker_outage.py``).  Every broker
connection uses manual partition assignment, never a consumer group (the dev
broker never completes group joins).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import kafka.errors as Errors
from kafka.partitioner.default import murmur2
from kafka.protocol.broker_version_data import BrokerVersionData
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.producer import ProduceRequest

from gateway.kafka_records import encode_batch, read_batches
from schemas.config import KafkaConfig
from schemas.events import Ack, decode

log = logging.getLogger(__name__)

#: Longest pause between attempts to reach an unreachable broker: a gateway has a handful of
#: connections, and retrying each every second at most lets it recover within a second of Kafka.
RECONNECT_BACKOFF_MAX_S = 1.0
RECONNECT_BACKOFF_S = 0.05
#: Bytes of records per produce request (a single larger record still goes, alone): under the
#: brokers' default ``message.max.bytes`` of ~1 MB.
MAX_BATCH_BYTES = 512 * 1024

#: How many keys' partitions a :class:`DurableLog` remembers (forgotten all at once beyond that).
PARTITION_MEMORY = 65536

#: Bytes one fetch may bring back, per partition and in all: a tail catching up on a burst of the
#: job's records holds no more than this (and its records) at once.
FETCH_MAX_BYTES = 1 << 20
#: The longest a tail lets the broker take over a fetch it answers empty for lack of time.
SLOW_FETCH_MAX_WAIT_MS = 5000
#: The longest pause of a caught-up tail between fetches (:meth:`Tail._pause`): what it adds to
#: the time a record waits to be read, at worst.
TAIL_PAUSE_MAX_S = 0.5
# Highest request versions used: the last ones naming topics by name (later ones use topic ids).
PRODUCE_VERSION, FETCH_VERSION, METADATA_VERSION, LIST_OFFSETS_VERSION = 9, 11, 8, 5
EARLIEST = -2  # ListOffsets: the log start offset


class KafkaUnavailable(Errors.KafkaConnectionError):
    """No broker could be reached, or the connection broke before the answer came."""


class Appended(NamedTuple):
    """Where an appended record is: it is durable there (acks=all)."""

    partition: int
    offset: int


# -- one connection to one broker

class BrokerConnection(asyncio.Protocol):
    """One TCP connection to a broker: requests written, responses matched in order
    (``KafkaProtocol``).  A broken connection fails every request awaiting an answer."""

    def __init__(self, client_id: str):
        self._protocol = KafkaProtocol(client_id=client_id)
        self._waiting: dict[int, asyncio.Future] = {}
        # (deadline, correlation id) of the requests awaiting an answer, oldest first: the broker
        # answers in order, so only the oldest one's deadline can pass first (one timer, not one each)
        self._deadlines: deque[tuple[float, int]] = deque()
        self._watch: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._versions: BrokerVersionData | None = None
        self.closed = False

    @classmethod
    async def open(cls, host: str, port: int, client_id: str, timeout: float) -> BrokerConnection:
        """Connect and agree on request versions (ApiVersions v0, which every broker answers)."""
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: cls(client_id), host, port), timeout)
        except (OSError, asyncio.TimeoutError) as error:
            raise KafkaUnavailable(f"cannot connect to Kafka at {host}:{port}: {error or 'timed out'}") from None
        versions = await connection.call(ApiVersionsRequest(version=0), timeout)
        connection._versions = BrokerVersionData(api_versions={
            key.api_key: (key.min_version, key.max_version) for key in versions.api_keys})
        return connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            responses = self._protocol.receive_bytes(data)
        except Errors.KafkaError as error:
            self._fail(KafkaUnavailable(f"bad response from Kafka: {error}"))
            return
        for correlation_id, response in responses:
            waiter = self._waiting.pop(correlation_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(KafkaUnavailable(f"connection to Kafka lost{f': {exc}' if exc else ''}"))

    def _fail(self, error: Exception) -> None:
        self.closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._deadlines.clear()
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(error)
        if self._transport is not None:
            self._transport.close()

    def close(self) -> None:
        self._fail(KafkaUnavailable("connection closed"))

    def call(self, request, timeout: float) -> asyncio.Future:
        """Send ``request``; the future resolves to its response.  A response that does not come
        within ``timeout`` closes the connection (the next one would be out of step)."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        if self.closed:
            waiter.set_exception(KafkaUnavailable("connection closed"))
            return waiter
        if self._versions is not None and request.API_VERSION is None:
            request.API_VERSION = self._versions.api_version(request)
        correlation_id = self._protocol.send_request(request)
        if request.expect_response():
            self._waiting[correlation_id] = waiter
            self._deadlines.append((loop.time() + timeout, correlation_id))
            if self._watch is None:
                self._watch = loop.call_at(self._deadlines[0][0], self._check_deadlines)
        else:
            waiter.set_result(None)
        self._transport.write(self._protocol.send_bytes())
        return waiter

    def _check_deadlines(self) -> None:
        """The oldest request's deadline came: close if it is still unanswered, else look again
        at the next one's."""
        self._watch = None
        loop = asyncio.get_running_loop()
        while self._deadlines and self._deadlines[0][1] not in self._waiting:
            self._deadlines.popleft()
        if not self._deadlines:
            return
        deadline, _ = self._deadlines[0]
        if deadline <= loop.time():
            self._fail(KafkaUnavailable("no answer from Kafka in time"))
        else:
            self._watch = loop.call_at(deadline, self._check_deadlines)


# -- the cluster: brokers, leaders, connections

@dataclass
class _Leaders:
    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)
    partitions: dict[str, dict[int, int]] = field(default_factory=dict)  # topic -> partition -> leader node


class Cluster:
    """What the gateway knows of the Kafka cluster: each partition's leader, and one connection per
    (broker, purpose) — appends and each tail on their own, so a fetch held by the broker never
    delays an append's answer behind it."""

    def __init__(self, config: KafkaConfig, client_id: str = "smqp-gateway"):
        self._config = config
        self._client_id = client_id
        self._bootstrap = [_host_port(address) for address in config.bootstrap.split(",") if address.strip()]
        self._leaders = _Leaders()
        # (broker, purpose) -> its connection, or the future of the attempt to open it
        self._connections: dict[tuple[int | str, str], BrokerConnection | asyncio.Future] = {}
        self._refreshing: asyncio.Future | None = None
        self.request_timeout = min(5.0, config.delivery_timeout_ms / 1000)

    async def partitions(self, topic: str) -> list[int]:
        """The partitions of ``topic``, sorted (asks the cluster the first time)."""
        if topic not in self._leaders.partitions:
            await self.refresh()
        found = self._leaders.partitions.get(topic)
        if not found:
            raise Errors.UnknownTopicOrPartitionError(f"Kafka topic {topic!r} not found")
        return sorted(found)

    async def leader(self, topic: str, partition: int, purpose: str) -> BrokerConnection:
        """A connection to the leader of ``topic``/``partition`` for ``purpose``."""
        node = self._leaders.partitions.get(topic, {}).get(partition)
        if node is None or node not in self._leaders.brokers:
            await self.refresh()
            node = self._leaders.partitions.get(topic, {}).get(partition)
            if node is None or node not in self._leaders.brokers:
                raise Errors.LeaderNotAvailableError(f"no leader for {topic}/{partition}")
        return await self._connection(node, self._leaders.brokers[node], purpose)

    async def leader_node(self, topic: str, partition: int) -> int | None:
        if topic not in self._leaders.partitions:
            await self.refresh()
        return self._leaders.partitions.get(topic, {}).get(partition)

    async def _connection(self, key: int | str, address: tuple[str, int], purpose: str) -> BrokerConnection:
        """The open connection for ``purpose`` to broker ``key``; one attempt to open it at a time,
        shared by every caller that asks meanwhile."""
        connection = self._connections.get((key, purpose))
        if isinstance(connection, BrokerConnection) and not connection.closed:
            return connection
        if not isinstance(connection, asyncio.Future):
            connection = self._connections[(key, purpose)] = asyncio.ensure_future(
                BrokerConnection.open(*address, self._client_id, self.request_timeout))
        opening = connection
        try:
            opened = await asyncio.shield(opening)
        except BaseException:
            if self._connections.get((key, purpose)) is opening:
                del self._connections[(key, purpose)]
            raise
        if self._connections.get((key, purpose)) is opening:
            self._connections[(key, purpose)] = opened
        return opened

    async def refresh(self) -> None:
        """Ask a broker (a known one, else a bootstrap address) for the leaders of our topics; one
        refresh at a time, which every caller that asks meanwhile shares."""
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._refresh())
        refreshing = self._refreshing
        try:
            await asyncio.shield(refreshing)
        finally:
            if refreshing.done() and self._refreshing is refreshing:
                self._refreshing = None

    async def _refresh(self) -> None:
        topics = [self._config.commands_topic, self._config.deliveries_topic]
        request = lambda: MetadataRequest(  # noqa: E731 - a fresh request per attempt
            topics=[MetadataRequest.MetadataRequestTopic(name=t) for t in topics], max_version=METADATA_VERSION)
        errors = []
        for key, address in [*self._leaders.brokers.items(), *((f"bootstrap:{a[0]}:{a[1]}", a)
                                                              for a in self._bootstrap)]:
            try:
                connection = await self._connection(key, address, "metadata")
                response = await connection.call(request(), self.request_timeout)
            except Errors.KafkaError as error:
                errors.append(str(error))
                continue
            self._leaders = _Leaders(
                brokers={b.node_id: (b.host, b.port) for b in response.brokers},
                partitions={t.name: {p.partition_index: p.leader_id for p in t.partitions if p.error_code == 0}
                            for t in response.topics if t.error_code == 0})
            return
        raise KafkaUnavailable(f"no Kafka broker answered ({'; '.join(errors) or 'none configured'})")

    def close(self) -> None:
        for connection in self._connections.values():
            if isinstance(connection, BrokerConnection):
                connection.close()
            else:
                connection.cancel()
        self._connections.clear()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    return host or "127.0.0.1", int(port or 9092)


def _backoff(attempt: int) -> float:
    return min(RECONNECT_BACKOFF_MAX_S, RECONNECT_BACKOFF_S * (2 ** min(attempt, 10)))


# -- durable appends

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
    """Appends events to the commands topic (or ``topic``: the job's sink appends to the deliveries
    topic with it); an append completes once Kafka acked it (acks=all).

    Records are batched per partition by the event loop (see the module docstring).
    """

    def __init__(self, config: KafkaConfig, cluster: Cluster, partitions: list[int], topic: str | None = None):
        self._config = config
        self._cluster = cluster
        self._topic = topic or config.commands_topic
        self._lanes = {p: _Lane(p) for p in partitions}
        # a key picks among all partitions but, in the commands topic, the ACKs' own
        self._keyed = partitions[:config.commands_partitions] if self._topic == config.commands_topic else partitions
        self._partition_of: dict[bytes, int] = {}
        self._tasks: set[asyncio.Task] = set()

    @property
    def partitions(self) -> list[int]:
        return sorted(self._lanes)

    @classmethod
    async def open(cls, config: KafkaConfig, cluster: Cluster | None = None) -> DurableLog:
        """Reach Kafka and learn the commands topic's partitions (fails if Kafka cannot be reached, or
        the topic has fewer partitions than the configuration appends to)."""
        cluster = cluster or Cluster(config)
        partitions = await cluster.partitions(config.commands_topic)
        if len(partitions) < config.commands_topic_partitions:
            raise Errors.UnknownTopicOrPartitionError(
                f"Kafka topic {config.commands_topic!r} has {len(partitions)} partition(s); this configuration "
                f"needs {config.commands_topic_partitions} ([kafka] commands_partitions = {config.commands_partitions}"
                f"{', and one for ACKs: ack_partition = true' if config.ack_partition else ''}); "
                "see deploy/kafka-topics.md")
        return cls(config, cluster, partitions)

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
        record = _Record(key, value, future, now + self._config.delivery_timeout_ms / 1000, headers or [])
        lane.waiting.append(record)
        lane.waiting_bytes += _size(record)
        due = now + self._config.linger_ms / 1000 if linger and lane.waiting_bytes < self._config.batch_bytes else now
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
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
        finally:
            lane.busy = False

    async def _linger(self, lane: _Lane) -> None:
        """Wait until ``lane``'s next request is due, so that what arrives meanwhile shares it.

        Why: at 1,000 publishes/s with their ACKs, requests of one or a few records each put
        thousands of batches into the partition, and the dev broker lists every batch it holds to
        answer each fetch, so its CPU per fetch grew through a run (measured in the README's
        "Benchmark"); fewer, fuller batches also cost Apache Kafka less per record.  Only
        ``linger`` appends wait: a lone PUB or a window-1 ACK, whose client waits on its reply,
        is sent at once, and so is a lane once ``batch_bytes`` wait: a publisher that keeps a
        window of PUBs in flight gets its replies a request sooner, not a linger later."""
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
                    f"not acknowledged by Kafka within {self._config.delivery_timeout_ms} ms"))
                continue
            batch.append(record)
            size += _size(record)
        lane.due = now if lane.waiting else float("inf")  # what a full request left behind goes next, at once
        return batch

    async def _produce(self, partition: int, batch: list[_Record]) -> Exception | None:
        """One produce request; settles ``batch`` and returns None, or returns Kafka's error."""
        records = encode_batch([(record.key, record.value, record.headers) for record in batch],
                               int(time.time() * 1000))
        topic_data = ProduceRequest.TopicProduceData
        request = ProduceRequest(
            acks=-1, timeout_ms=int(self._cluster.request_timeout * 1000), max_version=PRODUCE_VERSION,
            topic_data=[topic_data(name=self._topic, partition_data=[topic_data.PartitionProduceData(
                index=partition, records=records)])])
        connection = await self._cluster.leader(self._topic, partition, "append")
        response = await connection.call(request, self._cluster.request_timeout + 1)
        answer = response.responses[0].partition_responses[0]
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
                _settle(record.future, KafkaUnavailable("the gateway stopped before Kafka took it"))
            lane.waiting.clear()
            lane.waiting_bytes = 0


def _size(record: _Record) -> int:
    """What a record weighs against a request's limits: its value and key."""
    return len(record.value) + len(record.key or b"")


def _settle(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


# -- tails

class RawPublish(NamedTuple):
    """A publish record as the control tail read it: its key (the canonical topic) and its value."""

    topic: str
    value: bytes


#: Record prefixes of the commands the registry does not fold (skipped undecoded).
_NOT_CONTROL = (b'{"type":"ack"', b'{"type":"tick"')
#: The prefix of a publish: handed on undecoded, for the gateway to route early (or not) itself.
_PUBLISH = b'{"type":"publish"'


def _decoded(raw: bytes, what: str):
    try:
        return decode(raw)
    except (ValueError, TypeError, KeyError):
        log.warning("skipping undecodable %s record %r", what, raw[:80])
        return None


def control_item(offset: int, key: bytes | None, value: bytes):
    """A commands partition-0 record as the registry fold takes it: ``(offset, event | RawPublish
    | None)`` — a publish as its raw record (decoded only when the gateway routes it early), None
    for records the registry skips (acks, ticks, undecodable ones), so the fold always knows how
    far it got, skipped records included."""
    if value.startswith(_PUBLISH):
        return offset, RawPublish((key or b"").decode("utf-8", "replace"), value)
    return offset, None if value.startswith(_NOT_CONTROL) else _decoded(value, "commands")


class RawDeliver(NamedTuple):
    """A ``Deliver`` record as the deliveries tail read it: whose (its key) and which message
    (read off the JSON's start), with the record to decode only if the book does not know it
    yet — most often the gateway routed it early and already has it."""

    account: str
    smuid: int
    value: bytes


_DELIVER = b'{"type":"deliver"'
_SMUID = re.compile(rb'"smuid":(\d+)')


def delivery_item(offset: int, key: bytes | None, value: bytes):
    """A deliveries record: a :class:`RawDeliver`, or the decoded event (None: undecodable, dropped)."""
    if value.startswith(_DELIVER) and key and (smuid := _SMUID.search(value, 0, 512)) is not None:
        return RawDeliver(key.decode("utf-8", "replace"), int(smuid.group(1)), value)
    return _decoded(value, "deliveries")


def next_wait_ms(current: int, configured: int, got_records: bool, behind: bool) -> int:
    """The ``max_wait_ms`` of a tail's next fetch.

    The dev broker answers a fetch with no records, and no error, when gathering them takes longer
    than the fetch's ``max_wait_ms`` (a large backlog, a loaded host): with a fixed short wait a
    tail that fell behind would never catch up, and would keep the broker busy asking.  So a fetch
    that came back empty while its partition's high watermark is past our position doubles the
    wait; records halve it back towards ``configured``; an empty answer with nothing more to read
    (idle) returns to ``configured``, the latency of the next record."""
    if got_records:
        return max(configured, current // 2)
    if behind:
        return min(max(current * 2, configured + 1), SLOW_FETCH_MAX_WAIT_MS)
    return configured


class Tail:
    """Reads partitions of a topic from their start (or from given offsets) in the event loop,
    handing each fetched batch to ``on_batch``: what ``convert(offset, key, value)`` made of each
    record (None drops it), in offset order per partition.  ``ready`` is set once the records
    present when it started have been read (every partition at its high watermark)."""

    def __init__(self, config: KafkaConfig, cluster: Cluster, topic: str, on_batch: Callable[[list], None],
                 convert: Callable, partitions: list[int] | None = None, name: str = "tail",
                 start: dict[int, int] | None = None, fetch_max_wait_ms: int | None = None):
        self._config = config
        self._wait_ms = config.fetch_max_wait_ms if fetch_max_wait_ms is None else fetch_max_wait_ms
        self._cluster = cluster
        self._topic = topic
        self._on_batch = on_batch
        self._convert = convert
        self._partitions = partitions
        self._start = start or {}
        self.name = name
        self.ready = asyncio.Event()
        self.positions: dict[int, int] = {}
        self.high_watermarks: dict[int, int] = {}
        self.max_wait_ms = self._wait_ms  # raised while the broker answers too late: next_wait_ms
        self._nudged = asyncio.Event()  # someone waits for what the tail reads: no pause
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # the gateway cannot work without it
            log.error("%s stopped", self.name, exc_info=task.exception())
            asyncio.get_running_loop().stop()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def caught_up(self) -> bool:
        return bool(self.positions) and all(
            self.positions[p] >= self.high_watermarks.get(p, float("inf")) for p in self.positions)

    async def _run(self) -> None:
        partitions = self._partitions
        if partitions is None:
            partitions = await _retrying(lambda: self._cluster.partitions(self._topic), self.name)
        self.positions = {p: self._start.get(p, 0) for p in partitions}
        attempt = 0
        while True:
            began = time.monotonic()
            self._nudged.clear()
            got_records = False
            try:
                got_records = await self._fetch_once()
                attempt = 0
            except Errors.KafkaError as error:
                if attempt == 0:
                    log.warning("%s: %s; retrying", self.name, error)
                if isinstance(error, Errors.InvalidMetadataError):
                    with contextlib.suppress(Errors.KafkaError):
                        await self._cluster.refresh()
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
            if self.caught_up:
                self.ready.set()
                if got_records:
                    await self._pause(self._config.tail_pause_factor * (time.monotonic() - began))

    def nudge(self) -> None:
        """Fetch now, without pausing: someone waits for records just appended."""
        self._nudged.set()

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (at most :data:`TAIL_PAUSE_MAX_S`) or until nudged.

        Only after a fetch that brought records and left the tail at the end: an empty fetch
        already waited at the broker.  Scaled by how long that fetch took, the pause bounds the
        tail's share of the broker whatever a fetch costs there: the dev broker lists every batch
        of the partition for each fetch that finds records (measured here, ~0.8 µs of its CPU per
        stored batch: 7 ms per fetch at 10,000 batches, 48 ms at 60,000), and a tail fetching
        again at once took most of a core of it late in a benchmark.  On Apache Kafka a fetch
        takes about a millisecond, and so does the pause."""
        if seconds > 0 and not self._nudged.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._nudged.wait(), min(seconds, TAIL_PAUSE_MAX_S))

    async def _fetch_once(self) -> bool:
        """One fetch from each leader of our partitions, handed on in partition order; whether
        it brought records."""
        by_leader: dict[int | None, list[int]] = {}
        for partition in self.positions:
            by_leader.setdefault(await self._cluster.leader_node(self._topic, partition), []).append(partition)
        answers = await asyncio.gather(*(self._fetch(partitions) for partitions in by_leader.values()))
        items = [item for answer in answers for item in answer]
        if not items:
            return False
        try:
            self._on_batch(items)
        except Exception:  # a bug handling some records must not stop the tail for all the others
            log.exception("%s: handling %d records failed", self.name, len(items))
        return True

    async def _fetch(self, partitions: list[int]) -> list:
        connection = await self._cluster.leader(self._topic, partitions[0], self.name)
        fetch = FetchRequest.FetchTopic
        request = FetchRequest(
            replica_id=-1, max_wait_ms=self.max_wait_ms, min_bytes=self._config.fetch_min_bytes,
            max_bytes=FETCH_MAX_BYTES, isolation_level=0, max_version=FETCH_VERSION,
            topics=[fetch(topic=self._topic, partitions=[fetch.FetchPartition(
                partition=p, fetch_offset=self.positions[p], partition_max_bytes=FETCH_MAX_BYTES)
                for p in partitions])])
        response = await connection.call(request, self._cluster.request_timeout + self.max_wait_ms / 1000)
        items, behind = [], False
        for answer in response.responses[0].partitions:
            partition = answer.partition_index
            error = Errors.for_code(answer.error_code)
            if error is Errors.OffsetOutOfRangeError:  # deleted by retention: go on from the earliest kept
                self.positions[partition] = await self._earliest(connection, partition)
                continue
            if error is not Errors.NoError:
                raise error(f"fetching {self._topic}/{partition}")
            self.high_watermarks[partition] = answer.high_watermark
            items += self._records(partition, answer.records)
            behind = behind or self.positions[partition] < answer.high_watermark
        self.max_wait_ms = next_wait_ms(self.max_wait_ms, self._wait_ms, bool(items), behind)
        return items

    def _records(self, partition: int, data: bytes | None) -> list:
        """The converted records of one partition's fetched bytes, past its position; the position
        moves past every complete batch (control batches and records before it included)."""
        items, position, convert = [], self.positions[partition], self._convert
        for batch in read_batches(data or b"", f"{self._topic}/{partition}"):
            for offset, key, value in batch.records:
                if offset >= position and (item := convert(offset, key, value)) is not None:
                    items.append(item)
            position = max(position, batch.next_offset)
        self.positions[partition] = position
        return items

    async def _earliest(self, connection: BrokerConnection, partition: int) -> int:
        topic = ListOffsetsRequest.ListOffsetsTopic
        request = ListOffsetsRequest(replica_id=-1, isolation_level=0, max_version=LIST_OFFSETS_VERSION, topics=[
            topic(name=self._topic, partitions=[topic.ListOffsetsPartition(partition_index=partition,
                                                                            timestamp=EARLIEST)])])
        response = await connection.call(request, self._cluster.request_timeout)
        answer = response.topics[0].partitions[0]
        if answer.error_code:
            raise Errors.for_code(answer.error_code)(f"earliest offset of {self._topic}/{partition}")
        log.warning("%s: %s/%d starts at %d (older records deleted)", self.name, self._topic, partition, answer.offset)
        return answer.offset


async def _retrying(attempt_once, name: str):
    attempt = 0
    while True:
        try:
            return await attempt_once()
        except Errors.KafkaError as error:
            if attempt == 0:
                log.warning("%s: %s; retrying", name, error)
            await asyncio.sleep(_backoff(attempt))
            attempt += 1


def control_tail(config: KafkaConfig, cluster: Cluster, on_batch: Callable[[list], None]) -> Tail:
    """Folds commands partition 0 from its start into the gateway's registry (:func:`control_item`)."""
    return Tail(config, cluster, config.commands_topic, on_batch, control_item, partitions=[0], name="control-tail")


def deliveries_tail(config: KafkaConfig, cluster: Cluster, on_batch: Callable[[list], None]) -> Tail:
    """Reads the whole deliveries topic; batches are the decoded events.  Its fetches wait
    ``deliveries_fetch_max_wait_ms``: what it reads is off the publish → NOTIFY path of messages
    the gateway routes itself, and each fetch costs the dev broker a walk over the partition."""
    return Tail(config, cluster, config.deliveries_topic, on_batch, delivery_item, name="deliveries-tail",
                fetch_max_wait_ms=config.deliveries_fetch_max_wait_ms)


async def read_acks_since(config: KafkaConfig, cluster: Cluster, offsets: dict[str, int],
                          timeout: float = 30.0) -> list[Ack]:
    """ACKs in the commands topic after the job's last ``Progress``: durable but not yet in Delta.

    Read once at gateway start so that a restarted gateway does not NOTIFY a
    message again whose two-phase ACK the job has not processed yet.
    """
    acks: list[Ack] = []

    def keep_acks(offset: int, key: bytes | None, value: bytes):
        return decode(value) if value.startswith(b'{"type":"ack"') else None

    reader = Tail(config, cluster, config.commands_topic, acks.extend, keep_acks, name="acks-reader",
                  start={int(p): int(o) for p, o in offsets.items()})
    reader.start()
    try:
        await asyncio.wait_for(reader.ready.wait(), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError("could not read the commands topic to its end at start-up") from None
    finally:
        await reader.stop()
    return acks
