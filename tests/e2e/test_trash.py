"""A topic's Trash end to end (issue 4): a message expires while its subscriber is offline, and
LIST / GET / COUNT MESSAGE on ``<topic>/Trash`` show it, with why and when.

Real broker, real streaming job (its ticks are the clock), Delta on disk, a real gateway and
the reference client.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

import pytest
from deltalake import DeltaTable

from gateway.accounts import hash_password
from gateway.client import SMQPClient
from schemas.timefmt import parse_date_time
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, stack_config

pytestmark = pytest.mark.e2e


@pytest.fixture
def engine(broker, spark, tmp_path):
    config = stack_config(broker, tmp_path, {name: hash_password(name, iterations=1000) for name in ("bob", "alice")})
    with Router(spark, config), GatewayThread(config) as gateway:
        asyncio.run(create_smqp_topics(gateway.address, "/q/quotes"))
        yield gateway.address


def test_a_message_expired_while_its_subscriber_was_offline_is_read_from_the_trash(engine):
    async def scenario():
        async with await SMQPClient.open(*engine, "bob", "bob") as bob:
            await bob.subscribe("/q/quotes")
        # bob is offline (QUIT keeps his subscription): nothing acknowledges what follows
        async with await SMQPClient.open(*engine, "alice", "alice") as alice:
            sent_at = datetime.now(timezone.utc)
            doomed = await alice.publish("/q/quotes", "24.567", headers=[("Timeout", "00:00:00:02"),
                                                                        ("Subject", "IBM")])
            kept = await alice.publish("/q/quotes", "24.600", headers=[("Timeout", "INFINITE")])
            deadline = time.monotonic() + 120
            while await alice.list_messages("/q/quotes/Trash") != [doomed]:  # the job's ticks expire it
                assert time.monotonic() < deadline, "the expired message never reached /q/quotes/Trash"
                await asyncio.sleep(0.5)

            (message,) = await alice.get_messages("/q/quotes/trash", doomed)  # Trash in any case
            assert await alice.count_messages("/Q/Quotes/TRASH") == 1
            assert await alice.list_messages("/q/quotes/Trash") == [doomed]

        assert message.topic == "/q/quotes/Trash" and message.smuid == doomed and message.data == b"24.567"
        assert message.header("X-Trash-Reason") == "expired"
        trashed = parse_date_time(message.header("X-Trashed"))
        assert trashed >= sent_at + timedelta(seconds=2) - timedelta(milliseconds=10)  # the hundredths shown
        assert message.header("Subject") == "IBM" and message.header("Timeout") == "00:00:00:02"
        assert message.cmuid.startswith("alice/") and message.header("Created")

        # back online, bob gets the message that did not expire, and never the one in the Trash
        async with await SMQPClient.open(*engine, "bob", "bob") as bob:
            first = await bob.next_notification(60)
            await first.ack()
            assert (first.smuid, first.data) == (kept, b"24.600")

    asyncio.run(scenario())


def test_removing_a_topic_trashes_the_messages_nobody_holds(broker, spark, tmp_path):
    """Issue 4: a REMOVE TOPIC sends the topic's messages that nobody holds any more (one that
    reached nobody, a state message kept for late subscribers) to its Trash, reason topic_removed."""
    config = stack_config(broker, tmp_path)

    async def scenario(address):
        await create_smqp_topics(address, "/q/gone")
        async with await SMQPClient.open(*address) as guest:
            unrouted = await guest.publish("/q/gone", "nobody yet", headers=[("Timeout", "00:00:05:00")])
            state = await guest.publish("/q/gone", "state", headers=[("Timeout", "INFINITE")])
            deadline = time.monotonic() + 180
            while await guest.count_messages("/q/gone") != 2:  # the job has stored both
                assert time.monotonic() < deadline, "the messages were never stored"
                await asyncio.sleep(0.5)
            await guest.remove_topic("/q/gone")
        return unrouted, state

    with Router(spark, config), GatewayThread(config) as gateway:
        unrouted, state = asyncio.run(scenario(gateway.address))
        deadline = time.monotonic() + 180
        while len(rows := trash_rows(config)) < 2:
            assert time.monotonic() < deadline, f"trash: still {rows}"
            time.sleep(0.5)
    assert sorted((r["smuid"], r["reason"], r["trash_topic"]) for r in rows) == [
        (unrouted, "topic_removed", "/q/gone/Trash"), (state, "topic_removed", "/q/gone/Trash")]


def trash_rows(config) -> list[dict]:
    path = config.table_path("trash")
    return DeltaTable(path).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(path) else []
