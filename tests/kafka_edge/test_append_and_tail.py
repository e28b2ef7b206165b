"""The Kafka edge against a real Kafka node: appends batched by the event loop come back durable,
in order, with their offsets; tails read them from the start, and a new record as soon as it
is appended; an append Kafka cannot take fails once its delivery timeout has passed."""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.record.memory_records import MemoryRecords

from deploy.broker import KafkaBroker
from kafka_edge import Appended, Cluster, DurableLog, Tail
from kafka_edge.wire import FETCH_VERSION
from schemas.config import KafkaConfig
from tests.conftest import kafka_config


def _config(bootstrap: str, partitions: int = 1, **kafka) -> KafkaConfig:
    return kafka_config(bootstrap, commands_partitions=partitions, **kafka)


async def _read_all(config: KafkaConfig, cluster: Cluster, convert=lambda offset, key, value: (offset, key, value),
                    timeout: float = 30) -> list:
    """What ``convert`` makes of every record of the commands topic, read by a :class:`Tail` until it is ready."""
    records = []
    reader = Tail(config, cluster, config.commands_topic, records.extend, convert)
    reader.start()
    try:
        await asyncio.wait_for(reader.ready.wait(), timeout)
    finally:
        await reader.stop()
    return records


def test_concurrent_appends_share_requests_and_come_back_in_order_with_their_offsets(broker):
    config = _config(broker.bootstrap)

    async def scenario():
        cluster = Cluster(config, client_id="test")
        log = await DurableLog.open(config, cluster, config.commands_topic)
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


async def _stored_batches(config: KafkaConfig, cluster: Cluster) -> list[list[bytes]]:
    """Commands partition 0 as the broker stores it: the values of each record batch (one per
    produce request)."""
    connection = await cluster.leader(config.commands_topic, 0, "test")
    fetch = FetchRequest.FetchTopic
    request = FetchRequest(replica_id=-1, max_wait_ms=1000, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                           max_version=FETCH_VERSION, topics=[fetch(topic=config.commands_topic, partitions=[
                               fetch.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
    response = await connection.call(request, 30)
    records = MemoryRecords(response.responses[0].partitions[0].records or b"")
    batches = []
    while (batch := records.next_batch()) is not None:
        batches.append([record.value for record in batch])
    return batches


def _appending_apart(broker, linger_flags: list[bool], **kafka) -> tuple[list[list[bytes]], float]:
    """Appends ``record i`` for each flag (its ``linger``), 20 ms apart, to a new topic; returns
    the batches stored and the seconds until the last append was durable."""
    config = _config(broker.bootstrap, **kafka)

    async def scenario():
        cluster = Cluster(config, client_id="test")
        log = await DurableLog.open(config, cluster, config.commands_topic)
        try:
            await log.append(b"", b"warm-up")  # the connection is open before the clock starts
            started, futures = time.monotonic(), []
            for i, linger in enumerate(linger_flags):
                futures.append(log.append(b"", f"record {i}".encode(), linger=linger))
                await asyncio.sleep(0.02)
            await asyncio.gather(*futures)
            return (await _stored_batches(config, cluster))[1:], time.monotonic() - started
        finally:
            await log.close()
            cluster.close()

    return asyncio.run(scenario())


def test_appends_that_may_linger_share_one_request_within_linger_ms(broker):
    batches, _ = _appending_apart(broker, [True] * 4, linger_ms=2000)
    assert batches == [[b"record 0", b"record 1", b"record 2", b"record 3"]]


def test_an_append_that_may_not_linger_goes_at_once_and_takes_the_lingering_ones_along(broker):
    # a lone PUB or a window-1 ACK: its client waits on this append alone
    batches, seconds = _appending_apart(broker, [True, True, False], linger_ms=10000)
    assert batches == [[b"record 0", b"record 1", b"record 2"]]
    assert seconds < 5  # not held for the 10 s linger
    batches, _ = _appending_apart(broker, [False, False, False], linger_ms=10000)
    assert batches == [[b"record 0"], [b"record 1"], [b"record 2"]]


def test_lingering_appends_leave_once_batch_bytes_wait_not_a_linger_later(broker):
    """Kafka's ``batch.size``: a publisher keeping a window of PUBs in flight fills a request
    before the linger ends; waiting it out would add the linger to every round trip."""
    record = len(b"record 0")
    batches, seconds = _appending_apart(broker, [True] * 4, linger_ms=10000, batch_bytes=2 * record)
    assert batches == [[b"record 0", b"record 1"], [b"record 2", b"record 3"]]
    assert seconds < 5  # not held for the 10 s linger


def test_keyed_appends_land_on_the_partition_kafkas_default_partitioner_picks(broker):
    """Same key, same partition (what orders a topic's publishes and an account's ACKs), as Kafka's
    Java client and kafka-python place them (murmur2)."""
    from kafka.partitioner.default import murmur2

    config = _config(broker.bootstrap, partitions=3)

    async def scenario():
        cluster = Cluster(config, client_id="test")
        log = await DurableLog.open(config, cluster, config.commands_topic)
        try:
            for key in (b"/a/b", b"bob", b"alice", b"/stocks/ibm") * 2:  # the second time from its memory
                place = await log.append(key, b"x")
                assert place.partition == (murmur2(key) & 0x7FFFFFFF) % 3
            assert (await log.append(b"bob", b"y", partition=0)).partition == 0
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())


def test_an_append_kafka_cannot_take_fails_after_the_delivery_timeout(tmp_path):
    with KafkaBroker(tmp_path / "kafka") as own:
        config = _config(own.bootstrap, delivery_timeout_ms=1500)

        async def scenario():
            cluster = Cluster(config, client_id="test")
            log = await DurableLog.open(config, cluster, config.commands_topic)
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




def test_a_tail_far_behind_reads_every_record_of_many_small_batches(broker):
    """A gateway's start-up fold: 30,000 records in 10,000 record batches, read from offset 0."""
    config = _config(broker.bootstrap)
    values = [f"record {i:06d}".encode() for i in range(30_000)]

    async def scenario():
        cluster = Cluster(config, client_id="test")
        log = await DurableLog.open(config, cluster, config.commands_topic)
        try:
            for chunk in range(0, len(values), 3):  # a batch per request, as a lightly loaded gateway appends
                await asyncio.gather(*(log.append(None, v) for v in values[chunk:chunk + 3]))
            assert await _read_all(config, cluster, lambda offset, key, value: value, timeout=60) == values
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())


def test_a_caught_up_tail_reads_a_new_record_when_it_is_appended_not_when_its_fetch_wait_ends(broker):
    """Kafka answers a waiting fetch the moment a record arrives, so a long ``fetch_max_wait_ms``
    (here 20 s) costs an idle tail no latency: each record is read long before the wait is over."""
    config = _config(broker.bootstrap, fetch_max_wait_ms=20_000)

    async def scenario():
        cluster = Cluster(config, client_id="test")
        log = await DurableLog.open(config, cluster, config.commands_topic)
        arrived: dict[bytes, float] = {}
        reader = Tail(config, cluster, config.commands_topic,
                      lambda values: arrived.update((v, time.monotonic()) for v in values),
                      lambda offset, key, value: value)
        reader.start()
        try:
            await asyncio.wait_for(reader.ready.wait(), 30)
            waits = []
            for value in (b"first", b"second", b"third"):
                await asyncio.sleep(0.5)  # the tail's fetch is waiting at the broker
                appended = time.monotonic()
                await log.append(None, value)
                await asyncio.wait_for(_until(lambda: value in arrived), 15)
                waits.append(arrived[value] - appended)
            return waits
        finally:
            await reader.stop()
            await log.close()
            cluster.close()

    waits = asyncio.run(scenario())
    print(f"appended → read: {', '.join(f'{w * 1000:.1f} ms' for w in waits)}")
    assert max(waits) < 10  # half the fetch's wait: answered by the record, not by the timeout


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def test_a_cluster_learns_each_topic_it_is_asked_about(broker):
    """Asked about one topic, then another, a client knows both (metadata is asked for the topics
    in use, not a fixed list), and appends to each."""
    first, second = _config(broker.bootstrap), _config(broker.bootstrap, partitions=2)

    async def scenario():
        cluster = Cluster(first, client_id="test")
        try:
            assert await cluster.partitions(first.commands_topic) == [0]
            assert await cluster.partitions(second.commands_topic) == [0, 1]
            assert await cluster.partitions(first.deliveries_topic) == [0]
            log = await DurableLog.open(first, cluster, second.commands_topic)
            assert (await log.append(None, b"x", partition=1)).partition == 1
            await log.close()
        finally:
            cluster.close()

    asyncio.run(scenario())


def test_records_of_one_leader_are_not_lost_when_another_leaders_fetch_fails(broker, monkeypatch):
    """Partitions led by different brokers are fetched in one request per leader.  When one leader's
    fetch fails (it went away, a leader moved), what another leader's answer brought is still handed
    on, and the failed partitions are fetched again: a tail whose positions moved past records it
    never handed on would never NOTIFY them.  One node here, so the two leaders are played: the
    test says partition 1 has another leader and fails that leader's first fetch."""
    import kafka.errors as Errors

    config = _config(broker.bootstrap, partitions=2)
    failed = []

    async def scenario():
        cluster = Cluster(config, client_id="test")
        log = await DurableLog.open(config, cluster, config.commands_topic)
        try:
            for partition in (0, 1):
                await asyncio.gather(*(log.append(None, f"p{partition}-{i}".encode(), partition=partition)
                                       for i in range(5)))
            real_leader_node, real_fetch = cluster.leader_node, Tail._fetch

            async def leader_node(topic, partition):
                return 100 + partition if topic == config.commands_topic else await real_leader_node(topic, partition)

            async def fetch(tail, partitions):
                if partitions == [1] and not failed:
                    failed.append(1)
                    raise Errors.KafkaConnectionError("the leader of partition 1 went away")
                return await real_fetch(tail, partitions)

            monkeypatch.setattr(cluster, "leader_node", leader_node)
            monkeypatch.setattr(Tail, "_fetch", fetch)
            return await _read_all(config, cluster, lambda offset, key, value: value)
        finally:
            await log.close()
            cluster.close()

    read = asyncio.run(scenario())
    assert failed == [1]
    assert sorted(read) == sorted(f"p{p}-{i}".encode() for p in (0, 1) for i in range(5))
