"""The gateway's Kafka edges against the real dev broker: appends batched by the event loop come
back durable, in order, with their offsets; tails read them from the start; an append Kafka
cannot take fails once its delivery timeout has passed."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from deploy.broker import DevBroker, create_topics
from gateway.kafka_io import Appended, Cluster, DurableLog, Tail, read_acks_since
from schemas.config import KafkaConfig
from schemas.events import Ack, Sync


def _config(bootstrap: str, partitions: int = 1, **kafka) -> KafkaConfig:
    name = uuid.uuid4().hex[:8]
    config = KafkaConfig(bootstrap=bootstrap, commands_topic=f"cmd-{name}", deliveries_topic=f"dlv-{name}",
                         commands_partitions=partitions, **kafka)
    create_topics(config)
    return config


async def _read_all(config: KafkaConfig, cluster: Cluster) -> list[tuple[int, bytes, bytes]]:
    """Every record of the commands topic, read by a :class:`Tail` until it is ready."""
    records = []
    reader = Tail(config, cluster, config.commands_topic, records.extend,
                  lambda offset, key, value: (offset, key, value))
    reader.start()
    try:
        await asyncio.wait_for(reader.ready.wait(), 30)
    finally:
        await reader.stop()
    return records


def test_concurrent_appends_share_requests_and_come_back_in_order_with_their_offsets(broker):
    config = _config(broker.bootstrap)

    async def scenario():
        cluster = Cluster(config)
        log = await DurableLog.open(config, cluster)
        try:
            values = [f"record {i}".encode() for i in range(3000)]
            appended = []
            for chunk in range(0, len(values), 500):  # bursts, as pipelining clients send them
                appended += await asyncio.gather(*(log.append(b"key", v) for v in values[chunk:chunk + 500]))
            assert appended == [Appended(0, offset) for offset in range(3000)]
            records = await _read_all(config, cluster)
            assert [(offset, value) for offset, _, value in records] == list(enumerate(values))
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())


def test_keyed_appends_land_on_the_partition_kafkas_default_partitioner_picks(broker):
    """Same key, same partition (what orders a topic's publishes and an account's ACKs), as Kafka's
    Java client and kafka-python place them (murmur2)."""
    from kafka.partitioner.default import murmur2

    config = _config(broker.bootstrap, partitions=3)

    async def scenario():
        cluster = Cluster(config)
        log = await DurableLog.open(config, cluster)
        try:
            for key in (b"/a/b", b"bob", b"alice", b"/stocks/ibm"):
                place = await log.append(key, b"x")
                assert place.partition == (murmur2(key) & 0x7FFFFFFF) % 3
            assert (await log.append(b"bob", b"y", partition=0)).partition == 0
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())


def test_an_append_kafka_cannot_take_fails_after_the_delivery_timeout():
    with DevBroker() as own:
        config = _config(own.bootstrap, delivery_timeout_ms=1500)

        async def scenario():
            cluster = Cluster(config)
            log = await DurableLog.open(config, cluster)
            try:
                await log.append(None, b"before")
                own.stop()
                started = time.monotonic()
                with pytest.raises(Exception) as failed:
                    await asyncio.wait_for(log.append(None, b"lost"), 30)
                waited = time.monotonic() - started
                assert not isinstance(failed.value, asyncio.TimeoutError)
                assert 1.0 <= waited <= 8, waited
            finally:
                await log.close(timeout=1)
                cluster.close()

        asyncio.run(scenario())


def test_acks_since_the_jobs_progress_are_read_back_at_start(broker):
    config = _config(broker.bootstrap)

    async def scenario():
        cluster = Cluster(config)
        log = await DurableLog.open(config, cluster)
        try:
            early = await log.append(b"bob", Ack("bob", "g", 1, 0).to_bytes())
            await log.append(b"", Sync("s").to_bytes(), partition=0)
            await log.append(b"bob", Ack("bob", "g", 2, 0).to_bytes())
            acks = await read_acks_since(config, cluster, {"0": early.offset + 1})
            assert [ack.smuid for ack in acks] == [2]
            assert [ack.smuid for ack in await read_acks_since(config, cluster, {})] == [1, 2]
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())
