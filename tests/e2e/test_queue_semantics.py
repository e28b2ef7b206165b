"""Queue semantics end to end (issue 4, first part): priority and GUARANTEE NO.

Real broker, real streaming job, Delta on disk, a real gateway and the reference client.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, stack_config

pytestmark = pytest.mark.e2e


@pytest.fixture
def engine(broker, spark, tmp_path):
    config = stack_config(broker, tmp_path)
    with Router(spark, config), GatewayThread(config) as gateway:
        asyncio.run(create_smqp_topics(gateway.address, "/q/work", "/q/mouse"))
        yield gateway.address


def test_a_high_priority_message_overtakes_the_waiting_backlog(engine):
    """2002 revision: higher priorities are sent first, FIFO within one."""
    async def scenario():
        async with await SMQPClient.open(*engine) as sub, await SMQPClient.open(*engine) as pub:
            await sub.subscribe("/q/work")
            await sub.suspend()  # the backlog builds up while nothing is sent
            backlog = [await pub.publish("/q/work", f"low {i}", headers=[("Priority", "1")]) for i in range(20)]
            urgent = await pub.publish("/q/work", "urgent", headers=[("Priority", "9")])
            for _ in range(240):  # until the job has committed (so routed) all 21
                if await pub.count_messages("/q/work") == 21:
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(1)  # and the gateway has read their deliveries
            await sub.resume()
            got = []
            for _ in range(21):
                note = await sub.next_notification(60)
                await note.ack()
                got.append(note.smuid)
            assert got == [urgent, *backlog]

    asyncio.run(scenario())


def test_non_guaranteed_messages_need_no_acknowledgements(engine):
    """GUARANTEE NO: no reply to the PUB, no ACK of the NOTIFY; guaranteed traffic flows past."""
    async def scenario():
        async with await SMQPClient.open(*engine) as sub, await SMQPClient.open(*engine) as pub:
            await sub.subscribe("/q/mouse")
            for i in range(5):
                await pub.publish_unguaranteed("/q/mouse", f"move {i}")
            await pub.publish_unguaranteed("/q/nowhere", "dropped silently")  # no reply, not even 404
            last = await pub.publish("/q/mouse", "click")  # the next reply is this PUB's
            got = []
            while True:
                note = await sub.next_notification(60)
                assert not note.needs_ack or note.smuid == last
                got.append(note.data)
                if note.needs_ack:
                    await note.ack()
                    break
            assert got == [f"move {i}".encode() for i in range(5)] + [b"click"]

    asyncio.run(scenario())
