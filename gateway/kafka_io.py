"""The gateway's Kafka edges: the durable append and the deliveries tail.

kafka-python is thread-based; these classes bridge it into asyncio.  Both
use manual partition assignment (the dev broker never completes consumer
group joins) and take a partition's end from the fetch high watermark, not
ListOffsets, which under-reports on the dev broker.

When Kafka is unreachable for a while, appends fail after
``delivery_timeout_ms`` (the client gets 503) and the tails keep polling;
kafka-python reconnects by itself once Kafka is back (within
:data:`RECONNECT_BACKOFF_MAX_MS`), so the same gateway goes on without a restart
(``tests/e2e/test_broker_outage.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable, Iterable, NamedTuple

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError

from schemas.config import KafkaConfig
from schemas.events import Ack, decode

log = logging.getLogger(__name__)

#: kafka-python backs off reconnecting to an unreachable broker exponentially up to 30 s by default,
#: so after an outage of a minute PUBs kept getting 503 for up to half a minute more.  A gateway
#: has a handful of connections; retrying each every second at most costs nothing.
RECONNECT_BACKOFF_MAX_MS = 1000


class DurableLog:
    """Appends events to the commands topic; an append completes once Kafka acked it (acks=all).

    Two producers: publishes linger ``linger_ms`` to batch (ingest throughput),
    while ACKs go out at once, because each one gates the subscriber's next
    NOTIFY (measured: 413 → 650 NOTIFY/ACK cycles per second per login) —
    except a login's in a SET NOTIFY WINDOW > 1, whose pipelined ACKs the
    gateway appends to the lingering producer (``immediate=False``).
    """

    def __init__(self, config: KafkaConfig):
        self._topic = config.commands_topic
        self._batching = self._producer(config, config.linger_ms, "smqp-gateway")
        self._immediate = self._producer(config, 0, "smqp-gateway-ack")

    def _producer(self, config: KafkaConfig, linger_ms: int, client_id: str) -> KafkaProducer:
        producer = KafkaProducer(
            bootstrap_servers=config.bootstrap, acks="all", linger_ms=linger_ms, max_block_ms=5000,
            # one request may take at most what is left of the delivery timeout after lingering
            request_timeout_ms=min(5000, config.delivery_timeout_ms - linger_ms),
            delivery_timeout_ms=config.delivery_timeout_ms,
            retries=5, reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
            max_in_flight_requests_per_connection=1, client_id=client_id,
        )
        producer.partitions_for(self._topic)  # fetch metadata now, not on the first append
        return producer

    def append(self, key: bytes, value: bytes, *, immediate: bool = False,
               partition: int | None = None) -> asyncio.Future:
        """Send one record; the returned future resolves to its RecordMetadata once it is
        durable, or fails.  ``partition`` pins it (control events go to partition 0)."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future = loop.create_future()

        def settle(outcome, failed: bool) -> None:
            if result.done():
                return
            if failed:
                result.set_exception(outcome if isinstance(outcome, BaseException) else RuntimeError(outcome))
            else:
                result.set_result(outcome)

        producer = self._immediate if immediate else self._batching
        try:
            sent = producer.send(self._topic, key=key, value=value, partition=partition)
        except Exception as error:  # metadata timeout, buffer full: not durable
            result.set_exception(error)
            return result
        sent.add_callback(lambda metadata: loop.call_soon_threadsafe(settle, metadata, False))
        sent.add_errback(lambda error: loop.call_soon_threadsafe(settle, error, True))
        return result

    def close(self) -> None:
        """Close both producers, waiting a few seconds for what they still hold.  With Kafka
        unreachable that is dropped (its callers were told it is not durable, or it was best
        effort: a presence announcement), rather than failing the gateway's stop."""
        for producer in (self._batching, self._immediate):
            try:
                producer.close(timeout=5)
            except KafkaTimeoutError:
                log.warning("Kafka unreachable at close: records not yet appended are dropped")


def _assign_all(consumer: KafkaConsumer, topic: str, timeout: float = 10.0) -> list[TopicPartition]:
    deadline = time.monotonic() + timeout
    while (partitions := consumer.partitions_for_topic(topic)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Kafka topic {topic!r} not found")
        consumer.topics()  # refresh metadata
        time.sleep(0.1)
    assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
    consumer.assign(assigned)
    return assigned


def _new_consumer(config: KafkaConfig) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=config.bootstrap, group_id=None, enable_auto_commit=False,
        client_id="smqp-gateway-tail", fetch_max_wait_ms=20, max_poll_records=5000,
        reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
    )


def _caught_up(consumer: KafkaConsumer, partitions: Iterable[TopicPartition]) -> bool:
    for tp in partitions:
        high = consumer.highwater(tp)
        if high is None or consumer.position(tp) < high:
            return False
    return True


def read_acks_since(config: KafkaConfig, offsets: dict[str, int], timeout: float = 30.0) -> list[Ack]:
    """ACKs in the commands topic after the job's last ``Progress``: durable but not yet in Delta.

    Read once at gateway start so that a restarted gateway does not NOTIFY a
    message again whose two-phase ACK the job has not processed yet.
    """
    consumer = _new_consumer(config)
    try:
        partitions = _assign_all(consumer, config.commands_topic)
        for tp in partitions:
            consumer.seek(tp, int(offsets.get(str(tp.partition), 0)))
        acks: list[Ack] = []
        deadline = time.monotonic() + timeout
        while not _caught_up(consumer, partitions):
            if time.monotonic() > deadline:
                raise TimeoutError("could not read the commands topic to its end at start-up")
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    if b'"type":"ack"' in record.value[:20]:
                        acks.append(decode(record.value))
        return acks
    finally:
        consumer.close()


#: Record prefixes of the commands the registry does not fold (skipped undecoded).
_NOT_CONTROL = (b'{"type":"ack"', b'{"type":"tick"')

#: The prefix of a publish: handed on undecoded, for the gateway to route early (or not) itself.
_PUBLISH = b'{"type":"publish"'


class RawPublish(NamedTuple):
    """A publish record as the control tail read it: its key (the canonical topic) and its value."""

    topic: str
    value: bytes


class _Tail:
    """A thread reading some partitions from their start, handing each polled batch to the loop.

    ``on_batch`` runs in the event loop with what :meth:`_convert` made of each
    record (None drops it), in offset order; ``ready`` is set once the backlog
    present at start has been read.
    """

    name = "tail"

    def __init__(self, config: KafkaConfig, loop: asyncio.AbstractEventLoop, on_batch: Callable[[list], None]):
        self._config = config
        self._loop = loop
        self._on_batch = on_batch
        self._stop = threading.Event()
        self.ready = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _partitions(self, consumer: KafkaConsumer) -> list[TopicPartition]:
        raise NotImplementedError

    def _convert(self, record):
        raise NotImplementedError

    def _run(self) -> None:
        consumer = _new_consumer(self._config)
        try:
            partitions = self._partitions(consumer)
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            started = time.monotonic()
            signalled = False
            while not self._stop.is_set():
                polled = consumer.poll(timeout_ms=100)
                items = [item for rs in polled.values() for r in rs if (item := self._convert(r)) is not None]
                if items:
                    self._loop.call_soon_threadsafe(self._on_batch, items)
                if not signalled and (_caught_up(consumer, partitions)
                                      or (not polled and time.monotonic() - started > 5)):
                    signalled = True
                    self._loop.call_soon_threadsafe(self.ready.set)
        except Exception:  # the gateway cannot work without its tails: make it loud
            log.exception("%s stopped", self.name)
            self._loop.call_soon_threadsafe(self._loop.stop)
        finally:
            consumer.close()


def _decoded(raw: bytes, what: str):
    try:
        return decode(raw)
    except (ValueError, TypeError, KeyError):
        log.warning("skipping undecodable %s record %r", what, raw[:80])
        return None


class ControlTail(_Tail):
    """Folds commands partition 0 from its start into the gateway's registry.

    Batches are ``[(offset, event | RawPublish | None), …]``: a publish as its raw
    record (decoded only when the gateway routes it early), None for records
    the registry skips (acks, ticks, undecodable ones), so the loop always knows
    how far the fold got, skipped records included.
    """

    name = "control-tail"

    def _partitions(self, consumer: KafkaConsumer) -> list[TopicPartition]:
        _assign_all(consumer, self._config.commands_topic)
        return [TopicPartition(self._config.commands_topic, 0)]

    def _convert(self, record):
        if record.value.startswith(_PUBLISH):
            return record.offset, RawPublish((record.key or b"").decode("utf-8", "replace"), record.value)
        skipped = record.value.startswith(_NOT_CONTROL)
        return record.offset, None if skipped else _decoded(record.value, "commands")


class DeliveriesTail(_Tail):
    """Reads the whole deliveries topic; batches are the decoded events."""

    name = "deliveries-tail"

    def _partitions(self, consumer: KafkaConsumer) -> list[TopicPartition]:
        return _assign_all(consumer, self._config.deliveries_topic)

    def _convert(self, record):
        return _decoded(record.value, "deliveries")
