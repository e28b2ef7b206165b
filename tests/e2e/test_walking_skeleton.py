"""The walking skeleton end to end: real broker, real Spark query, Delta on disk, real sockets.

A publisher sends 100 messages to /stocks/quotes/ibm; a subscriber on
/stocks/* receives all of them in publish order, exactly once, with the
two-phase ACK; it QUITs without unsubscribing, 50 more are published, it logs
in again and receives those 50.  The Delta tables then hold 150 messages and
150 acknowledged deliveries.  The second variant stops and restarts the
streaming job in the middle.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from deltalake import DeltaTable

from gateway.accounts import hash_password
from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, stack_config

pytestmark = pytest.mark.e2e

ACCOUNTS = {"alice": hash_password("alice-pw", iterations=1000), "bob": hash_password("bob-pw", iterations=1000)}
TOPIC = "/stocks/quotes/ibm"


async def publish(host, port, count, start) -> list[int]:
    """Publish ``count`` messages over one pipelined connection; smuids in publish order."""
    async with await SMQPClient.connect(host, port) as alice:
        await alice.login("alice", "alice-pw")
        smuids = await asyncio.gather(*(alice.publish(TOPIC, f"quote {start + i}".encode(), cmuid=f"A{start + i}",
                                                      headers=[("Priority", "1")]) for i in range(count)))
        await alice.quit()
    return list(smuids)


async def take(client: SMQPClient, count: int) -> list[int]:
    """Receive and two-phase-ACK ``count`` notifications, whatever follows."""
    smuids = []
    for _ in range(count):
        note = await client.next_notification(90)
        await note.ack()
        smuids.append(note.smuid)
    return smuids


async def receive(client: SMQPClient, count: int, timeout: float = 90) -> list[int]:
    """Receive and two-phase-ACK ``count`` notifications; then prove nothing else arrives."""
    received = []
    deadline = time.monotonic() + timeout
    while len(received) < count:
        note = await client.next_notification(max(0.1, deadline - time.monotonic()))
        assert note.resource.upper() in ("MESSAGE", "MESS") and note.topic == TOPIC
        assert note.data == f"quote {note.header('Cmuid').rsplit('/A', 1)[1]}".encode()
        await note.ack()
        received.append(note.smuid)
    with pytest.raises(asyncio.TimeoutError):
        extra = await client.next_notification(1.5)
        pytest.fail(f"unexpected extra notification {extra.smuid}")
    return received


async def subscriber(host, port) -> SMQPClient:
    bob = await SMQPClient.connect(host, port)
    attrs = await bob.login("bob", "bob-pw")
    assert attrs["Topic"] == "/accounts/bob"
    return bob


def wait_for_acked(config, expected: int, timeout: float = 90) -> tuple[int, int, int]:
    """Poll Delta until the job recorded ``expected`` acknowledged deliveries."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            deliveries = DeltaTable(config.table_path("deliveries")).to_pyarrow_table().to_pylist()
            messages = DeltaTable(config.table_path("messages")).to_pyarrow_table().to_pylist()
        except Exception:  # table not created yet
            deliveries, messages = [], []
        acked = sum(1 for d in deliveries if d["status"] == "acked")
        if acked >= expected or time.monotonic() > deadline:
            assert len({(d["account"], d["smuid"]) for d in deliveries}) == len(deliveries), "duplicate delivery rows"
            assert len({m["smuid"] for m in messages}) == len(messages), "duplicate message rows"
            return len(messages), len(deliveries), acked
        time.sleep(0.5)


def test_offline_subscriber_gets_everything_once_in_order(broker, spark, tmp_path):
    config = stack_config(broker, tmp_path, ACCOUNTS)
    with Router(spark, config), GatewayThread(config) as gateway:
        host, port = gateway.address

        async def scenario():
            await create_smqp_topics((host, port), TOPIC)
            bob = await subscriber(host, port)
            assert await bob.subscribe("/stocks/*") == ["/stocks/quotes", TOPIC]  # CREATE made the parent too
            first = await publish(host, port, 100, 0)
            assert first == sorted(first) and len(set(first)) == 100
            assert await receive(bob, 100) == first
            await bob.quit()  # no UNSUBSCRIBE: the queue is kept
            second = await publish(host, port, 50, 100)
            bob = await subscriber(host, port)
            assert await receive(bob, 50) == second
            await bob.quit()

        asyncio.run(scenario())
        assert wait_for_acked(config, 150) == (150, 150, 150)


def test_streaming_job_restart_loses_and_duplicates_nothing(broker, spark, tmp_path):
    config = stack_config(broker, tmp_path, ACCOUNTS)
    router = Router(spark, config).start()
    try:
        with GatewayThread(config) as gateway:
            host, port = gateway.address

            async def scenario():
                await create_smqp_topics((host, port), TOPIC)
                bob = await subscriber(host, port)
                await bob.subscribe("/stocks/*")
                first = await publish(host, port, 100, 0)
                got = await take(bob, 40)
                await asyncio.to_thread(router.stop)  # job down mid-stream; ACKs keep going to Kafka
                second = await publish(host, port, 50, 100)  # accepted while the job is down
                await asyncio.to_thread(router.start)
                got += await receive(bob, 110)
                assert got == first + second
                await bob.quit()

            asyncio.run(scenario())
            assert wait_for_acked(config, 150) == (150, 150, 150)
    finally:
        router.stop()


def test_gateway_restart_never_renotifies_an_acknowledged_message(broker, spark, tmp_path):
    """Property 3 across a gateway restart: the new gateway rebuilds its book from the
    deliveries topic plus the ACKs the job has not processed yet, so the 40 messages
    acknowledged before the restart never come again and the other 60 all do."""
    config = stack_config(broker, tmp_path, ACCOUNTS)
    with Router(spark, config):
        with GatewayThread(config) as gateway:
            host, port = gateway.address

            async def before():
                await create_smqp_topics((host, port), TOPIC)
                bob = await subscriber(host, port)
                await bob.subscribe("/stocks/*")
                published = await publish(host, port, 100, 0)
                acked = await take(bob, 40)
                await bob.close()  # no QUIT: the gateway goes down under it
                return published, acked

            published, acked = asyncio.run(before())
        assert acked == published[:40]
        with GatewayThread(config) as gateway:
            host, port = gateway.address

            async def after():
                bob = await subscriber(host, port)
                got = await receive(bob, 60)
                await bob.quit()
                return got

            assert asyncio.run(after()) == published[40:]
        assert wait_for_acked(config, 100) == (100, 100, 100)


def test_every_login_of_an_account_receives_the_messages(broker, spark, tmp_path):
    """Spec section 3: the same account logged in twice gets every message at each login,
    and a login that never acknowledges (here: the publisher itself, logged in as bob)
    holds up no other login."""
    config = stack_config(broker, tmp_path, ACCOUNTS)
    with Router(spark, config), GatewayThread(config) as gateway:
        host, port = gateway.address

        async def scenario():
            await create_smqp_topics((host, port), TOPIC)
            first, second = await subscriber(host, port), await subscriber(host, port)
            await first.subscribe("/stocks/*")
            async with await SMQPClient.connect(host, port) as bob_publishing:
                await bob_publishing.login("bob", "bob-pw")
                smuids = [await bob_publishing.publish(TOPIC, f"quote {i}".encode(), cmuid=f"A{i}")
                          for i in range(20)]
                got_first, got_second = await asyncio.gather(receive(first, 20), receive(second, 20))
                assert got_first == got_second == smuids
                assert (await bob_publishing.next_notification(30)).smuid == smuids[0]  # its own copy
            await first.quit(), await second.quit()

        asyncio.run(scenario())
        assert wait_for_acked(config, 20) == (20, 20, 20)
