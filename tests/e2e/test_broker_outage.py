"""Property 1 when Kafka is gone: a PUBLISH the gateway cannot make durable gets 503, never 200;
and when Kafka comes back, the same gateway works again by itself."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from kafka import KafkaConsumer, TopicPartition

from deploy.broker import KafkaBroker, free_port
from gateway.client import SMQPClient, SMQPError
from gateway.replies import SERVICE_UNAVAILABLE
from schemas.events import Publish, decode
from tests.e2e.proxy import KafkaProxy
from tests.e2e.stack import GatewayThread, Router, stack_config

pytestmark = pytest.mark.e2e


def test_publish_while_kafka_is_down_gets_503(tmp_path):
    with KafkaBroker(tmp_path / "kafka") as broker:
        config = stack_config(broker, tmp_path)
        with GatewayThread(config) as gateway:
            host, port = gateway.address

            async def scenario():
                async with await SMQPClient.connect(host, port) as client:
                    await client.login("guest")
                    await client.create_topic("/a/b")
                    assert await client.publish("/a/b", b"before")
                    broker.stop()
                    started = time.monotonic()
                    with pytest.raises(SMQPError) as refused:
                        await asyncio.wait_for(client.publish("/a/b", b"lost"), 180)
                    assert refused.value.code == SERVICE_UNAVAILABLE
                    return time.monotonic() - started

            print(f"503 after {asyncio.run(scenario()):.1f} s")


def published(config, data: bytes) -> int:
    """Publish events in the commands topic (read to its end) whose message data is ``data``."""
    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap, group_id=None, enable_auto_commit=False,
                             client_id="test-reader")
    try:
        partition = TopicPartition(config.kafka.commands_topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        found, deadline = 0, time.monotonic() + 30
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                events = [decode(record.value) for record in records]
                found += sum(isinstance(e, Publish) and b"".join(s.data for s in e.sections) == data for e in events)
            high = consumer.highwater(partition)  # known after the first fetch
            if high is not None and consumer.position(partition) >= high:
                break
        return found
    finally:
        consumer.close()


def test_kafka_unreachable_for_a_while_then_back_the_same_gateway_recovers(spark, tmp_path):
    """The gateway's way to Kafka is cut (a proxy severs its connections and refuses new ones) while
    the job keeps its own: PUB and control commands get 503 after delivery_timeout_ms, never 200,
    and what got 503 is never delivered; once the way is back, the same gateway takes PUBs with
    200 again and they are delivered, without a restart."""
    proxy_port = free_port()
    with KafkaBroker(tmp_path / "kafka", advertised_port=proxy_port) as broker, KafkaProxy(broker.port, proxy_port) as proxy:
        config = stack_config(broker, tmp_path)
        config = replace(config, kafka=replace(config.kafka, delivery_timeout_ms=3000))
        with Router(spark, config), GatewayThread(config) as gateway:
            async def scenario():
                async with await SMQPClient.open(*gateway.address) as sub, \
                        await SMQPClient.open(*gateway.address) as pub:
                    await pub.create_topic("/a/b")
                    await sub.subscribe("/a/b")
                    await pub.publish("/a/b", "before")
                    note = await sub.next_notification(120)
                    assert note.data == b"before"
                    await note.ack()

                    await asyncio.to_thread(proxy.cut, "smqp-gateway")
                    started = time.monotonic()
                    for command in (pub.publish("/a/b", "lost"), pub.create_topic("/a/c")):
                        with pytest.raises(SMQPError) as refused:
                            await asyncio.wait_for(command, 60)
                        assert refused.value.code == SERVICE_UNAVAILABLE
                    refused_after = time.monotonic() - started
                    await asyncio.sleep(2)  # the outage goes on a little

                    await asyncio.to_thread(proxy.restore)
                    restored, attempts = time.monotonic(), 0
                    while True:  # the same gateway, no restart: 200 again once its clients reconnect
                        attempts += 1
                        try:
                            smuid = await asyncio.wait_for(pub.publish("/a/b", "after"), 60)
                            break
                        except SMQPError as error:
                            assert error.code == SERVICE_UNAVAILABLE and time.monotonic() - restored < 60
                    recovered_after = time.monotonic() - restored
                    note = await sub.next_notification(120)
                    assert (note.data, note.smuid) == (b"after", smuid)  # "lost" never came before it
                    await note.ack()
                    await pub.create_topic("/a/c")  # control commands too
                    with pytest.raises(TimeoutError):
                        await sub.next_notification(5)  # nor after it
                    return refused_after, recovered_after, attempts

            refused_after, recovered_after, attempts = asyncio.run(scenario())
            print(f"503 {refused_after:.1f} s into the cut; 200 again {recovered_after:.1f} s after the restore "
                  f"({attempts} PUB(s)); {proxy.refused} gateway connections refused while cut")
            assert published(config, b"after") == attempts and published(config, b"lost") == 0


def test_after_kafka_refused_connections_for_a_while_the_gateway_reconnects_soon(tmp_path):
    """Kafka down for everyone (connections refused) for 20 s: kafka-python backs off its reconnects
    exponentially; the gateway takes PUBs again soon after Kafka is back (printed)."""
    proxy_port = free_port()
    with KafkaBroker(tmp_path / "kafka", advertised_port=proxy_port) as broker, KafkaProxy(broker.port, proxy_port) as proxy:
        config = stack_config(broker, tmp_path)
        config = replace(config, kafka=replace(config.kafka, delivery_timeout_ms=3000))
        with GatewayThread(config) as gateway:
            async def scenario():
                async with await SMQPClient.open(*gateway.address) as pub:
                    await pub.create_topic("/a/b")
                    await asyncio.to_thread(proxy.stop_listening)
                    deadline = time.monotonic() + 20
                    while time.monotonic() < deadline:  # PUBs keep failing while it is down
                        with pytest.raises(SMQPError) as refused:
                            await asyncio.wait_for(pub.publish("/a/b", "lost"), 60)
                        assert refused.value.code == SERVICE_UNAVAILABLE
                    await asyncio.to_thread(proxy.restore)
                    restored, attempts = time.monotonic(), 0
                    while True:
                        attempts += 1
                        try:
                            await asyncio.wait_for(pub.publish("/a/b", "after"), 60)
                            return time.monotonic() - restored, attempts
                        except SMQPError as error:
                            assert error.code == SERVICE_UNAVAILABLE and time.monotonic() - restored < 90

            recovered_after, attempts = asyncio.run(scenario())
            print(f"200 again {recovered_after:.1f} s after Kafka came back ({attempts} PUB(s))")
            assert published(config, b"after") == 1 and published(config, b"lost") == 0
