"""The protocol surface end to end: two gateways on one Kafka and one Delta store,
the real streaming job, real sockets, the reference client.

* A topic created on gateway 1 is published to on gateway 2 and received by a
  subscriber on gateway 1; a publisher on gateway 2 watching the topic's
  subscribers sees the count change when the subscriber on gateway 1 comes.
* A client sees its own writes through any gateway: created on one, published
  to on the other straight after the 200.
* A representative set of the other commands over sockets: LIST / COUNT /
  FIND / GET, NOTIFY TOPIC on rename and removal, PUB REPLY round trip,
  SET NOTIFY PORT and SUSPEND/RESUME.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import pytest

from deploy.broker import free_port
from gateway.accounts import hash_password
from gateway.admin import set_server_timeout
from gateway.client import SMQPClient, SMQPError
from tests.e2e.stack import GatewayThread, Router, stack_config

pytestmark = pytest.mark.e2e

ACCOUNTS = {name: hash_password(f"{name}-pw", iterations=1000) for name in ("alice", "bob", "carol")}


def second_gateway(config):
    return replace(config, gateway=replace(config.gateway, port=free_port(), node_id=config.gateway.node_id + 1))


@contextlib.asynccontextmanager
async def login(address, account):
    client = await SMQPClient.connect(*address)
    try:
        await client.login(account, f"{account}-pw")
        yield client
    finally:
        with contextlib.suppress(Exception):
            await client.quit()
        await client.close()


async def next_of(client: SMQPClient, resource: str, timeout: float = 60):
    """The next notification of ``resource`` (MESSAGE, TOPIC, SUB, SERVER), skipping no other kind."""
    note = await client.next_notification(timeout)
    assert note.resource.upper().startswith(resource), (note.resource, note.topic, note.headers)
    return note


@pytest.fixture
def stack(broker, spark, tmp_path):
    """The job and two gateways of one farm: (config, address one, address two)."""
    config = stack_config(broker, tmp_path, ACCOUNTS)
    with Router(spark, config), GatewayThread(config) as one, GatewayThread(second_gateway(config)) as two:
        yield config, one.address, two.address


@pytest.fixture
def farm(stack):
    return stack[1:]


def test_topic_created_on_one_gateway_flows_through_the_other(farm):
    one, two = farm

    async def scenario():
        async with login(one, "alice") as alice, login(two, "bob") as bob, login(one, "carol") as carol:
            await alice.create_topic("/news/tech", keywords=["TECH", "IT NEWS"])
            # bob, on the other gateway, watches the subscribers of the topic alice just created
            assert await bob.subscribe_subscribers("/news/tech")
            assert await carol.subscribe("/news/*") == ["/news/tech"]
            watched = await next_of(bob, "SUB")
            assert (watched.topic, watched.count) == ("/news/tech", 1)
            smuid = await bob.publish("/news/tech", b"hello from gateway 2", cmuid="B1")
            note = await next_of(carol, "MESSAGE")
            assert (note.topic, note.smuid, note.data) == ("/news/tech", smuid, b"hello from gateway 2")
            await note.ack()
            await carol.unsubscribe("/news/*")
            watched = await next_of(bob, "SUB")
            assert (watched.topic, watched.count) == ("/news/tech", 0)
            assert await bob.find_topics("/news/*", ["it"]) == [("/news/tech", ["TECH", "IT NEWS"])]

    asyncio.run(scenario())


def test_a_client_reads_its_own_writes_through_any_gateway(farm):
    one, two = farm

    async def scenario():
        async with login(one, "alice") as on_one, login(two, "alice") as on_two:
            for n in range(5):  # no waiting between the two gateways
                await on_one.create_topic(f"/ryw/t{n}")
                assert await on_two.publish(f"/ryw/t{n}", b"x")
            assert [t for t, _ in await on_two.list_topics("/ryw")] == [f"/ryw/t{n}" for n in range(5)]
            await on_two.remove_topic("/ryw/t0")
            with pytest.raises(SMQPError) as gone:  # through the gateway that removed it: at once
                await on_two.publish("/ryw/t0", b"x")
            assert gone.value.code == 404
            for _ in range(100):  # through the other one: as soon as it has folded the removal
                try:
                    await on_one.publish("/ryw/t0", b"x")
                except SMQPError as refused:
                    assert refused.code == 404
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the other gateway never saw the removal")

    asyncio.run(scenario())


def test_history_queries_topic_notifications_and_replies(farm):
    one, two = farm

    async def scenario():
        async with login(one, "alice") as alice, login(two, "bob") as bob:
            await alice.create_topic("/stocks/quotes/ibm", keywords=["IBM", "BIG BLUE"])
            await bob.subscribe_topic("/stocks/*")
            await bob.subscribe("/stocks/quotes/ibm")
            smuids = [await alice.publish("/stocks/quotes/ibm", f"q{i}".encode(), cmuid=f"A{i}",
                                          headers=[("Reply", "YES")]) for i in range(3)]
            first = await next_of(bob, "MESSAGE")
            assert first.smuid == smuids[0]
            # bob replies; alice gets it on her account topic with her original CMUID
            await bob.publish_reply("/stocks/quotes/ibm", first.header("Cmuid"), b"thanks", cmuid="R1")
            reply = await next_of(alice, "MESSAGE")
            assert (reply.topic, reply.header("In-Reply-To"), reply.data) == (
                "/accounts/alice", first.header("Cmuid"), b"thanks")
            await reply.ack()
            await first.ack()
            for _ in range(2):
                await (await next_of(bob, "MESSAGE")).ack()
            # the history the job committed, read through the other gateway (the store may lag)
            for _ in range(60):
                if await bob.count_messages("/stocks/quotes/ibm") == 3:
                    break
                await asyncio.sleep(0.5)
            assert await bob.list_messages("/stocks/quotes/ibm") == smuids
            [message] = await bob.get_messages("/stocks/quotes/ibm", smuids[1])
            assert message.data == b"q1"
            assert await alice.count_subscribers("/stocks/*") == 1
            # renaming and removing are announced to the topic's watchers
            await alice.rename_topic("/stocks/quotes/ibm", "/stocks/quotes/bigblue")
            renamed = await next_of(bob, "TOPIC")
            assert (renamed.topic, renamed.action, renamed.value) == ("/stocks/quotes/ibm", "RENAME",
                                                                      "/stocks/quotes/bigblue")
            assert await alice.remove_topic("/stocks/quotes/bigblue") == 0
            removed = await next_of(bob, "TOPIC")
            assert (removed.topic, removed.action) == ("/stocks/quotes/bigblue", "DELETED")

    asyncio.run(scenario())


def test_notify_port_and_suspend_resume(farm):
    one, _ = farm

    async def scenario():
        async with login(one, "alice") as alice, login(one, "bob") as bob:
            await alice.create_topic("/chat/a")
            await alice.create_topic("/chat/b")
            await bob.subscribe("/chat/*")
            await bob.suspend("/chat/a")
            await bob.notify_port()  # the gateway connects back; NOTIFYs arrive there
            held = await alice.publish("/chat/a", b"held")
            passed = await alice.publish("/chat/b", b"passes")
            note = await next_of(bob, "MESSAGE")
            assert note.smuid == passed
            await note.ack()
            with pytest.raises(asyncio.TimeoutError):
                await bob.next_notification(2)
            await bob.resume("/chat/a")
            note = await next_of(bob, "MESSAGE")
            assert note.smuid == held
            await note.ack()

    asyncio.run(scenario())


def test_server_timeout_changes_reach_every_subscribed_login(stack):
    """SUB SERVER TIMEOUT on both gateways; the administrator changes it once."""
    config, one, two = stack

    async def scenario():
        async with login(one, "alice") as alice, login(two, "bob") as bob:
            for client in (alice, bob):
                await client.subscribe_server_timeout()
                assert (await next_of(client, "SERVER")).timeout == config.gateway.default_timeout
            await asyncio.to_thread(set_server_timeout, config, "00:00:05:00")
            for client in (alice, bob):
                assert (await next_of(client, "SERVER")).timeout == "00:00:05:00"
        async with await SMQPClient.connect(*two) as carol:
            assert (await carol.login("carol", "carol-pw"))["Timeout"] == "00:00:05:00"

    asyncio.run(scenario())
