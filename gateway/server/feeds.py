"""What a gateway appends to and reads from Kafka, in SMQP's terms, on the generic Kafka edge.

- :func:`open_commands_log`: the appends to the commands topic (PUBLISH, ACK, control events).
- :func:`control_tail`: commands partition 0 folded from offset 0 into the registry, publishes
  handed on undecoded (:func:`control_item`).
- :func:`deliveries_tail`: the whole deliveries topic (the job's ``Deliver``, ``Acked``,
  ``Progress``), a ``Deliver`` decoded only when the book does not know it (:func:`delivery_item`).
- :func:`read_acks_since`: at start, the ACKs the job has not yet made durable in Delta.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Callable, NamedTuple

import kafka.errors as Errors

from kafka_edge import Cluster, DurableLog, Tail
from schemas.config import KafkaConfig
from schemas.events import Ack, decode

log = logging.getLogger(__name__)


async def open_commands_log(config: KafkaConfig, cluster: Cluster) -> DurableLog:
    """The appends to the commands topic; fails if Kafka cannot be reached, or the topic has another
    number of partitions than the configuration says."""
    partitions = await cluster.partitions(config.commands_topic)
    if len(partitions) != config.commands_partitions:
        raise Errors.UnknownTopicOrPartitionError(
            f"Kafka topic {config.commands_topic!r} has {len(partitions)} partition(s); this configuration "
            f"appends to {config.commands_partitions} ([kafka] commands_partitions): a key would pick another "
            "partition than the job and the other gateways expect; see deploy/kafka-topics.md")
    return DurableLog(config, cluster, config.commands_topic, partitions)


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
    for an undecodable one (the fold still knows it got past it).  ACKs and ticks, which the fold
    never needs (nothing waits for their offsets), are dropped here: with ACKs in the partition, a
    drain is half ACKs."""
    if value.startswith(_PUBLISH):
        return offset, RawPublish((key or b"").decode("utf-8", "replace"), value)
    if value.startswith(_NOT_CONTROL):
        return None
    return offset, _decoded(value, "commands")


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



def control_tail(config: KafkaConfig, cluster: Cluster, on_batch: Callable[[list], None]) -> Tail:
    """Folds commands partition 0 from its start into the gateway's registry (:func:`control_item`)."""
    return Tail(config, cluster, config.commands_topic, on_batch, control_item, partitions=[0], name="control-tail")


def deliveries_tail(config: KafkaConfig, cluster: Cluster, on_batch: Callable[[list], None]) -> Tail:
    """Reads the whole deliveries topic; batches are what :func:`delivery_item` makes of its records."""
    return Tail(config, cluster, config.deliveries_topic, on_batch, delivery_item, name="deliveries-tail")


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
