"""Property 1 when Kafka is gone: a PUBLISH the gateway cannot make durable gets 503, never 200."""

from __future__ import annotations

import asyncio
import time

import pytest

from deploy.broker import DevBroker
from gateway.client import SMQPClient, SMQPError
from gateway.replies import SERVICE_UNAVAILABLE
from tests.e2e.stack import GatewayThread, stack_config

pytestmark = pytest.mark.e2e


def test_publish_while_kafka_is_down_gets_503(tmp_path):
    with DevBroker() as broker:
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
