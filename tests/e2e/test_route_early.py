"""Routing early, end to end: the real broker, Spark job, Delta tables and sockets.  A gateway
NOTIFYs a DELIVERY ALL message from its fold of the commands log; the job, whenever it runs, records
the same delivery once, and its own ``Deliver`` of it brings no second NOTIFY."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, stack_config
from tests.e2e.test_walking_skeleton import ACCOUNTS, TOPIC, publish, subscriber, take, wait_for_acked

pytestmark = pytest.mark.e2e


async def subscribed(host: str, port: int) -> SMQPClient:
    """Bob, logged in and subscribed to ``/stocks/*`` once the test's topic exists."""
    await create_smqp_topics((host, port), TOPIC)
    bob = await subscriber(host, port)
    await bob.subscribe("/stocks/*")
    return bob


@pytest.mark.parametrize("batch_limit", [20000, 7], ids=["one-batch", "small-batches"])
def test_messages_reach_a_subscriber_while_the_job_is_down_and_are_recorded_once_when_it_returns(
        broker, spark, tmp_path, batch_limit):
    """Small batches: the job reads the commands partition a few records at a time while every
    ACK already waits in the ACKs' partition; each must still reach it after its publish, or it
    would settle nothing and the delivery stay pending."""
    config = stack_config(broker, tmp_path, ACCOUNTS)
    config = replace(config, streaming=replace(config.streaming, max_records_per_batch=batch_limit))
    router = Router(spark, config)
    try:
        with GatewayThread(config) as gateway:
            host, port = gateway.address

            async def scenario() -> None:
                bob = await subscribed(host, port)
                published = await publish(host, port, 30, 0)
                assert await take(bob, 30) == published  # every one, in order, with no job running
                await asyncio.to_thread(router.start)
                # one row each, all acknowledged
                assert await asyncio.to_thread(wait_for_acked, config, 30) == (30, 30, 30)
                with pytest.raises(asyncio.TimeoutError):  # the job's Deliver of each came and went
                    extra = await bob.next_notification(2)
                    pytest.fail(f"notified again: {extra.smuid}")
                await bob.quit()

            asyncio.run(scenario())
            assert gateway.gateway.metrics.routed_early.get() == 30
    finally:
        router.stop()


def test_a_client_waiting_on_one_append_is_not_held_by_the_producer_linger(broker, tmp_path):
    """``[kafka] linger_ms`` lets pipelined PUBs and windowed ACKs share a produce request; a
    one-at-a-time publisher and a window-1 subscriber (the spec's two-phase commit) wait on each
    append alone, so theirs go at once: with a 10 s linger, three of each take seconds, not 30+.
    So does a windowed subscriber's on its notification port, which settles ACKs one by one."""
    config = stack_config(broker, tmp_path, ACCOUNTS)
    config = replace(config, kafka=replace(config.kafka, linger_ms=10_000))
    with GatewayThread(config) as gateway:
        host, port = gateway.address

        async def scenario() -> None:
            bob = await subscribed(host, port)
            async with await SMQPClient.connect(host, port) as alice:
                await alice.login("alice", "alice-pw")
                published = [await alice.publish(TOPIC, f"quote {i}".encode()) for i in range(3)]
                await alice.quit()
            assert await take(bob, 3) == published
            await bob.set_notify_window(5)
            await bob.notify_port()
            async with await SMQPClient.connect(host, port) as alice:
                await alice.login("alice", "alice-pw")
                published = [await alice.publish(TOPIC, f"quote {i}".encode()) for i in range(3, 6)]
                await alice.quit()
            assert await take(bob, 3) == published
            await bob.quit()

        asyncio.run(asyncio.wait_for(scenario(), 10))
