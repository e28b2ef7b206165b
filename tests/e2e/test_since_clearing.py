"""SINCE clears what is pending, end to end (spec 4.1.9.1, issue 4).

Real broker, real streaming job, Delta on disk, a real gateway and the reference client.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

import pytest

from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, hashed, stack_config
from tests.e2e.test_queue_semantics import table_rows

pytestmark = pytest.mark.e2e


async def pending_at_gateway(gateway: GatewayThread, account: str, count: int, timeout: float = 60) -> None:
    """Wait until the gateway's delivery book holds ``count`` unacknowledged deliveries of ``account``
    (it has read the job's Delivers, or its withdrawals)."""
    deadline = time.monotonic() + timeout
    while (held := gateway.gateway.book.pending_count(account)) != count:
        assert time.monotonic() < deadline, f"{account}: {held} pending at the gateway, not {count}"
        await asyncio.sleep(0.1)


@pytest.mark.timeout(300)
def test_a_resubscribe_with_since_clears_the_pending_messages_before_it_and_later_ones_flow(broker, spark, tmp_path):
    """A subscriber with un-ACKed (suspended) messages re-subscribes with SINCE after them: it is
    never NOTIFYed of them, their deliveries are ``cleared``, and a later message arrives."""
    config = stack_config(broker, tmp_path, accounts=hashed(sub="s", pub="p"))

    async def scenario(gateway):
        address = gateway.address
        await create_smqp_topics(address, "/q/feed")
        async with await SMQPClient.open(*address, "sub", "s") as sub, \
                await SMQPClient.open(*address, "pub", "p") as pub:
            await sub.subscribe("/q/feed")
            await sub.suspend()  # they stay pending: nothing is sent, nothing acknowledged
            stale = [await pub.publish("/q/feed", f"stale {i}") for i in range(3)]
            await pending_at_gateway(gateway, "sub", 3)  # routed, and the gateway holds them
            await asyncio.sleep(0.05)  # SINCE goes in hundredths of a second: strictly after them
            await sub.subscribe("/q/feed", since=datetime.now(timezone.utc))
            await pending_at_gateway(gateway, "sub", 0)  # withdrawn by the job's Acked (cleared)
            await sub.resume()
            fresh = await pub.publish("/q/feed", "fresh")
            note = await sub.next_notification(60)
            await note.ack()
            with pytest.raises(asyncio.TimeoutError):  # and nothing else, ever
                await sub.next_notification(3)
            return stale, fresh, note

    with Router(spark, config), GatewayThread(config) as gateway:
        stale, fresh, note = asyncio.run(scenario(gateway))
        deliveries = table_rows(config, "deliveries", until=lambda rows: any(
            r["smuid"] == fresh and r["status"] == "acked" for r in rows))
    assert (note.smuid, note.data) == (fresh, b"fresh")
    assert sorted((r["smuid"], r["status"]) for r in deliveries) == [
        *((smuid, "cleared") for smuid in sorted(stale)), (fresh, "acked")]
