"""Farm-wide presence end to end: DELIVERY ONE messages never wait for a subscriber who is logged
in at no gateway while another subscriber is online.

Real broker, real streaming job, Delta on disk, two real gateways and the reference client.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import pytest

from deploy.broker import free_port
from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, hashed, stack_config
from tests.e2e.test_queue_semantics import table_rows

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(600)  # bounded, but a loaded 2-core machine runs it for minutes
def test_one_messages_for_a_subscriber_whose_gateway_stopped_all_reach_the_one_online(broker, spark, tmp_path):
    """ann subscribes to a ONE topic through gateway 2 and holds her NOTIFYs without acknowledging
    them; bob subscribes through gateway 1 and acknowledges everything.  Gateway 2 stops (ann is
    logged in nowhere now): what was locked to her, and every message published afterwards that
    the job routes to her by its hash, ends up delivered to and acknowledged by bob.  The retry
    timeout is far beyond the test, so only presence can hand them on."""
    first = stack_config(broker, tmp_path, accounts=hashed(ann="a", bob="b", pub="p"), node_id=1,
                         topics={"/q/jobs": {"delivery": "one", "retry_timeout_s": 3600}})
    second = replace(first, gateway=replace(first.gateway, port=free_port(), node_id=2))
    per_batch = 10

    async def scenario(one, two):
        await create_smqp_topics(one.address, "/q/jobs")
        ann = await SMQPClient.open(*two.address, "ann", "a")
        await ann.subscribe("/q/jobs")
        acked: list[int] = []
        async with await SMQPClient.open(*one.address, "bob", "b") as bob, \
                await SMQPClient.open(*one.address, "pub", "p") as pub:
            await bob.subscribe("/q/jobs")

            async def take(total: int) -> None:
                while len(acked) < total:
                    note = await bob.next_notification(120)
                    await note.ack()
                    acked.append(note.smuid)

            taking = asyncio.create_task(take(2 * per_batch))
            published = [await pub.publish("/q/jobs", f"job {i}") for i in range(per_batch)]
            held = (await ann.next_notification(120)).smuid  # ann holds one, never acknowledged
            await asyncio.to_thread(two.__exit__, None, None, None)  # gateway 2 stops: ann is gone
            with contextlib.suppress(Exception):
                await ann.close()  # its connection ended with the gateway
            published += [await pub.publish("/q/jobs", f"job {i}") for i in range(per_batch, 2 * per_batch)]
            await asyncio.wait_for(taking, 240)
            with pytest.raises(asyncio.TimeoutError):  # nothing more: each message once
                await bob.next_notification(3)
        return published, held, acked

    with Router(spark, first), GatewayThread(first) as one:
        two = GatewayThread(second).__enter__()
        published, held, acked = asyncio.run(scenario(one, two))
        deliveries = table_rows(first, "deliveries", until=lambda rows: sum(
            r["status"] == "acked" for r in rows) >= 2 * per_batch)
    assert held in acked
    assert sorted(acked) == sorted(published)  # every message reached bob, each acknowledged once
    statuses = {}
    for row in deliveries:
        statuses.setdefault(row["smuid"], []).append((row["account"], row["status"]))
    assert all(s.count(("bob", "acked")) == 1 and ("ann", "acked") not in s for s in statuses.values())
    # the job routed some to ann after her gateway stopped: those too were handed on to bob
    assert sum(("ann", "released") in statuses[smuid] for smuid in published[per_batch:]) > 0
