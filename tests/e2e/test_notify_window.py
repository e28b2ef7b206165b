"""SET NOTIFY WINDOW (our pipelining extension) through the whole stack: a windowed subscriber
gets up to n NOTIFYs before acknowledging any, each message once, each acknowledged once; a
retry resends only the message left unacknowledged; a backlog drains exactly once across a
reconnect.

Real broker, real streaming job, Delta on disk, a real gateway and the reference client.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from deploy.broker import KafkaBroker, free_port
from gateway.client import SMQPClient, SMQPError
from gateway.replies import SERVICE_UNAVAILABLE
from tests.e2e.proxy import KafkaProxy
from tests.e2e.stack import GatewayThread, Router, book_holds, create_smqp_topics, hashed, stack_config
from tests.e2e.test_queue_semantics import table_rows

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # bounded; a loaded 2-core machine takes minutes


async def stored(client: SMQPClient, topic: str, count: int, gateway: GatewayThread, account: str) -> None:
    """Wait until the job has stored (so routed) ``count`` messages of ``topic``, and ``gateway`` has
    read their deliveries to ``account``."""
    for _ in range(480):
        if await client.count_messages(topic) >= count:
            break
        await asyncio.sleep(0.25)
    await book_holds(gateway, account, count)


async def receive(client: SMQPClient, count: int, timeout: float = 60) -> list:
    return [await client.next_notification(timeout) for _ in range(count)]


async def ack_all(notes) -> None:
    """Acknowledge without waiting for one reply before sending the next ACK."""
    await asyncio.gather(*(note.ack() for note in notes))


async def drain(client: SMQPClient, count: int, timeout: float = 60) -> list:
    """Receive ``count`` notifications, acknowledging each as it comes without waiting for the reply."""
    notes, acks = [], []
    for _ in range(count):
        notes.append(await client.next_notification(timeout))
        acks.append(asyncio.ensure_future(notes[-1].ack()))
    await asyncio.gather(*acks)
    return notes


def acked_rows(config, smuids) -> list[dict]:
    return table_rows(config, "deliveries", until=lambda rows: {
        r["smuid"] for r in rows if r["status"] == "acked"} >= set(smuids))


def test_a_window_100_subscriber_gets_100_before_acknowledging_then_each_message_once(broker, spark, tmp_path):
    config = stack_config(broker, tmp_path, accounts=hashed(sub="s", pub="p"))
    total = 300

    async def scenario(gateway):
        address = gateway.address
        await create_smqp_topics(address, "/w/backlog")
        async with await SMQPClient.open(*address, "sub", "s") as sub, \
                await SMQPClient.open(*address, "pub", "p") as pub:
            await sub.subscribe("/w/backlog")
            await sub.set_notify_window(100)
            await sub.suspend()  # a backlog builds up
            published = [await pub.publish("/w/backlog", f"m{i}") for i in range(total)]
            await stored(pub, "/w/backlog", total, gateway, "sub")
            await sub.resume()
            first = await receive(sub, 100)  # none acknowledged yet
            with pytest.raises(asyncio.TimeoutError):
                await sub.next_notification(2)  # the window is full
            await ack_all(first)
            rest = await drain(sub, total - 100)
            with pytest.raises(asyncio.TimeoutError):
                await sub.next_notification(2)  # nothing more, nothing twice
            return published, [note.smuid for note in first + rest]

    with Router(spark, config), GatewayThread(config) as gateway:
        published, received = asyncio.run(scenario(gateway))
        assert gateway.gateway.metrics.frames_out.get("NOTIFY MESSAGE") == total  # each sent once
        deliveries = acked_rows(config, published)
    assert sorted(received) == sorted(published)
    assert received == sorted(received)  # one priority: FIFO
    assert sorted(r["smuid"] for r in deliveries if r["status"] == "acked") == sorted(published)


def test_in_a_window_a_retry_resends_only_the_unacknowledged_message(broker, spark, tmp_path):
    """Retry timeout 0.5 s, max_retries 2: the one message left without its ACK is sent twice
    more and trashed; the others, acknowledged by SMUID around it, are sent once."""
    config = stack_config(broker, tmp_path, accounts=hashed(sub="s", pub="p"),
                          topics={"/w/flaky": {"retry_timeout_s": 0.5, "max_retries": 2}})

    async def scenario(address):
        await create_smqp_topics(address, "/w/flaky")
        async with await SMQPClient.open(*address, "sub", "s") as sub, \
                await SMQPClient.open(*address, "pub", "p") as pub:
            await sub.subscribe("/w/flaky")
            await sub.set_notify_window(10)
            published = [await pub.publish("/w/flaky", f"m{i}") for i in range(3)]
            notes = await receive(sub, 3)
            assert [note.smuid for note in notes] == published
            await ack_all([notes[0], notes[2]])  # the middle one never
            # connected (retries are per login) until the job has trashed it
            trash = await asyncio.to_thread(table_rows, config, "trash", until=lambda rows: len(rows) >= 1)
            return published, trash

    with Router(spark, config), GatewayThread(config) as gateway:
        (first, doomed, third), trash = asyncio.run(scenario(gateway.address))
        deliveries = acked_rows(config, [first, third])
        # three NOTIFYs, then the doomed one max_retries (2) more times, nothing else
        assert gateway.gateway.metrics.frames_out.get("NOTIFY MESSAGE") == 5
    assert [(row["smuid"], row["reason"]) for row in trash] == [(doomed, "max_retries")]
    retries = {row["smuid"]: (row["status"], row["retries"] or 0) for row in deliveries}  # None: never NACKed
    assert retries[first] == retries[third] == ("acked", 0)


def test_a_windowed_subscriber_drains_a_backlog_exactly_once_across_a_reconnect(broker, spark, tmp_path):
    """The backlog builds while the subscriber is away; it drains it at window 100, drops the
    connection with 50 NOTIFYs unacknowledged, and on its next login gets exactly what it has not
    acknowledged: those 50 and the rest, nothing it acknowledged."""
    config = stack_config(broker, tmp_path, accounts=hashed(sub="s", pub="p"))
    total = 400

    async def scenario(gateway):
        address = gateway.address
        await create_smqp_topics(address, "/w/drain")
        async with await SMQPClient.open(*address, "sub", "s") as sub:
            await sub.subscribe("/w/drain")
        async with await SMQPClient.open(*address, "pub", "p") as pub:
            published = [await pub.publish("/w/drain", f"m{i}") for i in range(total)]
            await stored(pub, "/w/drain", total, gateway, "sub")
        sub = await SMQPClient.open(*address, "sub", "s")
        await sub.set_notify_window(100)
        acknowledged = await receive(sub, 100)  # the window's worth, then room for more
        await ack_all(acknowledged)
        more = await receive(sub, 50)
        await ack_all(more)
        acknowledged += more
        unacknowledged = await receive(sub, 50)
        sub._main.writer.transport.abort()  # the connection dies with those 50 in flight
        await sub.close()
        async with await SMQPClient.open(*address, "sub", "s") as again:
            await again.set_notify_window(100)
            second = await drain(again, total - 150)
            with pytest.raises(asyncio.TimeoutError):
                await again.next_notification(2)
        return (published, [n.smuid for n in acknowledged], [n.smuid for n in unacknowledged],
                [n.smuid for n in second])

    with Router(spark, config), GatewayThread(config) as gateway:
        published, acknowledged, unacknowledged, second = asyncio.run(scenario(gateway))
        deliveries = acked_rows(config, published)
    assert not set(acknowledged) & set(second)  # nothing acknowledged comes back
    assert set(unacknowledged) <= set(second)  # what was in flight does
    assert sorted(acknowledged + second) == sorted(published)  # each message acknowledged exactly once
    statuses = [r["status"] for r in deliveries]
    assert len(deliveries) == total and set(statuses) == {"acked"}


def test_the_window_applies_on_the_notification_port(broker, spark, tmp_path):
    """SET NOTIFY PORT: the NOTIFYs of the window come on the client's listener and are
    acknowledged there by SMUID, each message once."""
    config = stack_config(broker, tmp_path, accounts=hashed(sub="s", pub="p"))
    total = 60

    async def scenario(gateway):
        address = gateway.address
        await create_smqp_topics(address, "/w/port")
        async with await SMQPClient.open(*address, "sub", "s") as sub, \
                await SMQPClient.open(*address, "pub", "p") as pub:
            await sub.subscribe("/w/port")
            await sub.set_notify_window(20)
            await sub.notify_port()
            await sub.suspend()
            published = [await pub.publish("/w/port", f"m{i}") for i in range(total)]
            await stored(pub, "/w/port", total, gateway, "sub")
            await sub.resume()
            first = await receive(sub, 20)
            with pytest.raises(asyncio.TimeoutError):
                await sub.next_notification(2)  # the window is full
            await ack_all(first)
            rest = await drain(sub, total - 20)
            on_port = all(note._channel is not sub._main for note in first + rest)
            return published, [note.smuid for note in first + rest], on_port

    with Router(spark, config), GatewayThread(config) as gateway:
        published, received, on_port = asyncio.run(scenario(gateway))
        assert gateway.gateway.metrics.frames_out.get("NOTIFY MESSAGE") == total
        deliveries = acked_rows(config, published)
    assert on_port
    assert sorted(received) == sorted(published)
    assert sorted(r["smuid"] for r in deliveries if r["status"] == "acked") == sorted(published)


def test_in_a_window_an_ack_kafka_cannot_take_ends_the_login_and_leaves_the_messages_pending(spark, tmp_path):
    """Property 3 in a window: the gateway's way to Kafka is cut, so an ACK cannot be made durable:
    503 instead of 310, the login ends, and on the next login every message of the window is sent
    again (none was acknowledged).  Meanwhile the acknowledged NOTIFY left the window when the
    client's 310 ACK arrived: the next NOTIFY was written at once, ahead of the ACK's reply."""
    proxy_port = free_port()
    with KafkaBroker(tmp_path / "kafka", advertised_port=proxy_port) as broker, KafkaProxy(broker.port, proxy_port) as proxy:
        config = stack_config(broker, tmp_path, accounts=hashed(sub="s", pub="p"))
        config = replace(config, kafka=replace(config.kafka, delivery_timeout_ms=3000))

        async def scenario(address):
            await create_smqp_topics(address, "/w/pass")
            async with await SMQPClient.open(*address, "pub", "p") as pub:
                sub = await SMQPClient.open(*address, "sub", "s")
                await sub.subscribe("/w/pass")
                await sub.set_notify_window(2)
                published = [await pub.publish("/w/pass", f"m{i}") for i in range(3)]
                notes = await receive(sub, 2, timeout=120)
                with pytest.raises(asyncio.TimeoutError):  # the window is full
                    await sub.next_notification(1)
                await asyncio.to_thread(proxy.cut, "smqp-gateway")
                acking = asyncio.ensure_future(notes[0].ack())
                third = await sub.next_notification(2)  # the ACK's reply cannot have come: Kafka is cut
                assert third.smuid == published[2] and not acking.done()
                with pytest.raises(SMQPError) as refused:
                    await asyncio.wait_for(acking, 60)
                assert refused.value.code == SERVICE_UNAVAILABLE
                await asyncio.wait_for(sub.closed.wait(), 30)
                await sub.close()
                await asyncio.to_thread(proxy.restore)
                for _ in range(30):  # until the gateway's way to Kafka is back, an ACK may still get 503
                    async with await SMQPClient.open(*address, "sub", "s") as again:
                        await again.set_notify_window(3)
                        notes = await receive(again, 3, timeout=120)
                        try:
                            await ack_all(notes)
                            return published, sorted(note.smuid for note in notes)
                        except (SMQPError, ConnectionError):
                            await asyncio.sleep(1)
                raise AssertionError("the ACKs never became durable after the restore")

        with Router(spark, config), GatewayThread(config) as gateway:
            published, again = asyncio.run(scenario(gateway.address))
            acked_rows(config, published)
    assert again == sorted(published)  # all three again, the one whose ACK failed included
