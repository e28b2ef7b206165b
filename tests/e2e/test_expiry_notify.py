"""Issue 32 item 7: a gateway never NOTIFYs a message whose expiry time has passed, nor resends one.

The job is stopped throughout: the gateway routes DELIVERY ALL messages itself (early routing), so
it alone must decide from the message's ``expires_at`` that it is dead, without the job's ``Acked``
(reason expired) that would otherwise withdraw it.  Real broker, real gateway, real sockets.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka import KafkaProducer

from gateway.client import SMQPClient
from schemas.events import Deliver
from tests.e2e.stack import GatewayThread, create_smqp_topics, hashed, stack_config

pytestmark = pytest.mark.e2e

TOPIC = "/q/quotes"


def test_a_message_that_expired_while_its_subscriber_was_offline_is_not_notified_when_it_returns(
        broker, tmp_path):
    config = stack_config(broker, tmp_path, hashed(bob="b", alice="a"))
    with GatewayThread(config) as gateway:
        address = gateway.address

        async def scenario() -> None:
            await create_smqp_topics(address, TOPIC)
            async with await SMQPClient.open(*address, "bob", "b") as bob:
                await bob.subscribe(TOPIC)
            # bob is offline now (QUIT keeps the subscription)
            async with await SMQPClient.open(*address, "alice", "a") as alice:
                doomed = await alice.publish(TOPIC, "24.567", headers=[("Timeout", "00:00:00:02")])
                kept = await alice.publish(TOPIC, "24.600", headers=[("Timeout", "INFINITE")])
            await asyncio.sleep(3)  # the doomed one has expired; no job runs to say so
            async with await SMQPClient.open(*address, "bob", "b") as bob:
                note = await bob.next_notification(10)
                assert note.smuid == kept, f"notified the expired message {doomed}"
                await note.ack()
                with pytest.raises(asyncio.TimeoutError):
                    extra = await bob.next_notification(1.5)
                    pytest.fail(f"notified {extra.smuid} (the expired one is {doomed})")

        asyncio.run(scenario())


def test_a_notify_left_unacknowledged_is_not_sent_again_once_its_message_expired(broker, tmp_path):
    """Retry timeout 1.5 s, message timeout 1 s: the retry falls after the expiry, so there is none."""
    config = stack_config(broker, tmp_path, hashed(bob="b", alice="a"),
                          topics={TOPIC: {"retry_timeout_s": 1.5, "max_retries": 3}})
    with GatewayThread(config) as gateway:
        address = gateway.address
        metrics = gateway.gateway.metrics

        async def scenario() -> None:
            await create_smqp_topics(address, TOPIC)
            async with await SMQPClient.open(*address, "bob", "b") as bob, \
                    await SMQPClient.open(*address, "alice", "a") as alice:
                await bob.subscribe(TOPIC)
                doomed = await alice.publish(TOPIC, "24.567", headers=[("Timeout", "00:00:00:01")])
                assert (await bob.next_notification(10)).smuid == doomed  # sent while alive, never ACKed
                await asyncio.sleep(4)  # two retry timeouts, both after the expiry
                assert metrics.frames_out.get("NOTIFY MESSAGE") == 1, "the expired message was sent again"
                kept = await alice.publish(TOPIC, "24.600", headers=[("Timeout", "INFINITE")])
                note = await bob.next_notification(10)  # the dead one no longer holds the window
                assert note.smuid == kept
                await note.ack()

        asyncio.run(scenario())


def test_a_delivery_the_job_routed_is_not_notified_once_its_message_expired(broker, tmp_path):
    """The job's ``Deliver`` says when its message expires: one that expired while its subscriber
    was offline is dropped at login, with no ``Acked`` (expired) from the job; one of a state
    message is notified.  The job's records are written here, as the job writes them."""
    config = stack_config(broker, tmp_path, hashed(bob="b"))
    now = time.time_ns() // 1000
    doomed = Deliver("bob", 101, TOPIC, "c101", "ann", "g", now, expires_at=now + 1_000_000)
    kept = Deliver("bob", 102, TOPIC, "c102", "ann", "g", now)
    producer = KafkaProducer(bootstrap_servers=config.kafka.bootstrap, acks="all")
    try:
        with GatewayThread(config) as gateway:
            address = gateway.address

            async def scenario() -> None:
                await create_smqp_topics(address, TOPIC)
                for deliver in (doomed, kept):
                    producer.send(config.kafka.deliveries_topic, key=b"bob", value=deliver.to_bytes()).get(30)
                await asyncio.sleep(2)  # doomed expires while bob is offline
                async with await SMQPClient.open(*address, "bob", "b") as bob:
                    note = await bob.next_notification(10)
                    assert note.smuid == kept.smuid, "notified the expired delivery"
                    await note.ack()
                    with pytest.raises(asyncio.TimeoutError):
                        extra = await bob.next_notification(1.5)
                        pytest.fail(f"notified {extra.smuid}")

            asyncio.run(scenario())
    finally:
        producer.close()
