"""Issue 32 item 9 (spec 4.1.9.1): once a subscription's UNTIL passes, the subscription ends.

It leaves LIST SUBSCRIPTIONS and COUNT SUBSCRIBERS, the watchers of the topic's subscribers get a
NOTIFY SUBSCRIBERS with the lower count, and a message published after it does not reach the
subscriber.  The job is stopped: the gateway decides the end from its fold and its clock.
Real broker, real gateway, real sockets.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, create_smqp_topics, hashed, stack_config

pytestmark = pytest.mark.e2e

TOPIC = "/q/quotes"


async def next_subscribers(client: SMQPClient, timeout: float) -> tuple[str, int]:
    note = await client.next_notification(timeout)
    assert note.resource.upper().startswith("SUB"), (note.resource, note.topic, note.headers)
    return note.topic, note.count


def test_a_subscription_ends_when_its_until_passes(broker, tmp_path):
    config = stack_config(broker, tmp_path, hashed(bob="b", carol="c", alice="a"))
    with GatewayThread(config) as gateway:
        address = gateway.address

        async def scenario() -> None:
            await create_smqp_topics(address, TOPIC)
            async with await SMQPClient.open(*address, "carol", "c") as carol, \
                    await SMQPClient.open(*address, "bob", "b") as bob:
                await carol.subscribe_subscribers(TOPIC)
                until = datetime.now(timezone.utc) + timedelta(seconds=2)
                await bob.subscribe(TOPIC, until=until)
                await bob.subscribe("/accounts/bob")  # one without UNTIL, which stays
                assert await next_subscribers(carol, 10) == (TOPIC, 1)
                assert sorted(await bob.list_subscriptions()) == ["/accounts/bob", TOPIC]

                assert await next_subscribers(carol, 10) == (TOPIC, 0)  # at UNTIL, unasked
                assert datetime.now(timezone.utc) >= until - timedelta(milliseconds=50)
                assert await bob.list_subscriptions() == ["/accounts/bob"]
                assert await carol.count_subscribers(TOPIC) == 0

                async with await SMQPClient.open(*address, "alice", "a") as alice:
                    await alice.publish(TOPIC, "after UNTIL")
                with pytest.raises(asyncio.TimeoutError):
                    extra = await bob.next_notification(1.5)
                    pytest.fail(f"an ended subscription received {extra.smuid}")

        asyncio.run(scenario())


def test_every_gateway_of_a_farm_ends_the_subscription_at_its_until(broker, tmp_path):
    """Bob subscribes through one gateway; carol watches through the other, which ends the
    subscription by its own clock from the SUBSCRIBE it folded: no gateway has to tell it."""
    from tests.e2e.test_protocol_surface import second_gateway

    config = stack_config(broker, tmp_path, hashed(bob="b", carol="c"))
    with GatewayThread(config) as one, GatewayThread(second_gateway(config)) as two:

        async def scenario() -> None:
            await create_smqp_topics(one.address, TOPIC)
            async with await SMQPClient.open(*two.address, "carol", "c") as carol, \
                    await SMQPClient.open(*one.address, "bob", "b") as bob:
                await carol.subscribe_subscribers(TOPIC)
                await bob.subscribe(TOPIC, until=datetime.now(timezone.utc) + timedelta(seconds=2))
                assert await next_subscribers(carol, 10) == (TOPIC, 1)
                assert await next_subscribers(carol, 10) == (TOPIC, 0)
                assert await carol.count_subscribers(TOPIC) == 0
                assert await bob.list_subscriptions() == []

        asyncio.run(scenario())
