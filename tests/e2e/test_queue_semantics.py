"""Queue semantics end to end (issue 4): priority, GUARANTEE NO, retries into the Trash.

Real broker, real streaming job, Delta on disk, a real gateway and the reference client.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from deltalake import DeltaTable

from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, hashed, stack_config

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


def table_rows(config, table: str, until=lambda rows: True, timeout: float = 60) -> list[dict]:
    """The rows of Delta table ``table``, once ``until(rows)`` holds (the job commits a moment
    after the gateway has answered)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = DeltaTable(config.table_path(table)).to_pyarrow_table().to_pylist()
        if until(rows):
            return rows
        assert time.monotonic() < deadline, f"{table}: still {rows}"
        time.sleep(0.25)


def test_a_notify_never_acknowledged_is_sent_max_retries_more_times_then_trashed(broker, spark, tmp_path):
    """Spec 5.1 retries: a NOTIFY left without its 310 ACK for the topic's retry timeout is sent
    again, max_retries times; then the message goes to the topic's Trash for that subscriber
    (reason max_retries) and is withdrawn, and the next message flows."""
    config = stack_config(broker, tmp_path, accounts=hashed(sub="s", pub="p"),
                          topics={"/q/flaky": {"retry_timeout_s": 0.5, "max_retries": 2}})

    async def scenario(address):
        await create_smqp_topics(address, "/q/flaky")
        async with await SMQPClient.open(*address, "sub", "s") as sub, \
                await SMQPClient.open(*address, "pub", "p") as pub:
            await sub.subscribe("/q/flaky")
            doomed = await pub.publish("/q/flaky", "never acknowledged")
            notes = [await sub.next_notification(60) for _ in range(3)]
            assert [note.smuid for note in notes] == [doomed] * 3
            later = await pub.publish("/q/flaky", "acknowledged")
            note = await sub.next_notification(60)  # once the job has withdrawn the dead one
            assert note.smuid == later
            await note.ack()
            return doomed, later

    with Router(spark, config), GatewayThread(config) as gateway:
        doomed, later = asyncio.run(scenario(gateway.address))
        deliveries = table_rows(config, "deliveries", until=lambda rows: any(
            r["smuid"] == later and r["status"] == "acked" for r in rows))
    trash = table_rows(config, "trash")
    assert [(row["smuid"], row["account"], row["reason"], row["trash_topic"]) for row in trash] == [
        (doomed, "sub", "max_retries", "/q/flaky/Trash")]
    by_smuid = {row["smuid"]: row for row in deliveries}
    assert (by_smuid[doomed]["status"], by_smuid[doomed]["retries"]) == ("trashed", 3)
