"""Spec codes of two limits over real sockets (issue 32, items 10 and 11): past the subscription
cap, 414 "cannot subscribe to any more" (4.1.9.1; 510 stays for ``SUB MESSAGE /*``); a Name
longer than the 2002 revision's 128 characters gets 400 and publishes nothing."""

from __future__ import annotations

import asyncio

import pytest

from gateway.client import SMQPClient, SMQPError
from gateway.replies import BAD_REQUEST, MAX_QUANTITIES_EXCEEDED, RESOURCE_TOO_LARGE
from tests.e2e.stack import GatewayThread, stack_config

pytestmark = pytest.mark.e2e


def test_past_the_subscription_cap_is_414_and_the_root_wildcard_510(broker, tmp_path):
    config = stack_config(broker, tmp_path, max_subscriptions=2)
    with GatewayThread(config) as gateway:
        async def scenario():
            async with await SMQPClient.open(*gateway.address) as client:
                for topic in ("/cap/a", "/cap/b", "/cap/c"):
                    await client.create_topic(topic)
                await client.subscribe("/cap/a")
                await client.subscribe("/cap/b")
                with pytest.raises(SMQPError) as capped:
                    await client.subscribe("/cap/c")
                assert capped.value.code == RESOURCE_TOO_LARGE and "cannot subscribe to any more" in str(capped.value)
                with pytest.raises(SMQPError) as root:
                    await client.subscribe("/*")
                assert root.value.code == MAX_QUANTITIES_EXCEEDED
                assert sorted(await client.list_subscriptions()) == ["/cap/a", "/cap/b"]
        asyncio.run(scenario())


def test_a_name_longer_than_128_characters_is_400_and_publishes_nothing(broker, tmp_path):
    config = stack_config(broker, tmp_path)
    with GatewayThread(config) as gateway:
        async def scenario():
            async with await SMQPClient.open(*gateway.address) as client:
                await client.create_topic("/named")
                await client.subscribe("/named")
                with pytest.raises(SMQPError) as long_name:
                    await client.publish("/named", "too long", headers=[("Name", "n" * 300)])
                assert long_name.value.code == BAD_REQUEST and "128 characters" in str(long_name.value)
                await client.publish("/named", "just right", headers=[("Name", "n" * 128)])
                note = await client.next_notification(30)
                assert (note.data, note.header("Name")) == (b"just right", "n" * 128)
                await note.ack()
        asyncio.run(scenario())
