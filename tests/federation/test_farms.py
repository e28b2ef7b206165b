"""Three farms on the one test Kafka: Depth through a chain, the triangle, a remote virtual topic.

Each farm is a gateway of its own (topics, domain) and its link process.  DELIVERY ALL messages are
NOTIFYed by the gateways' early routing and ACKs are durable in Kafka without a job, so only the
triangle runs one per farm (a query each in the test session's Spark), and checks each farm's
history holds each message once."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.e2e.stack import GatewayThread, Router, create_smqp_topics
from tests.federation.farms import (LinkThread, farm_config, forwarded_publishes, holds, link_account, nothing_more,
                                    publish, received, subscriber, until, with_links)
from tests.federation.test_farms_with_jobs import rows, wait_for

pytestmark = pytest.mark.e2e

A, B, C = "a.example", "b.example", "c.example"
NEWS = "/news/x"


@contextlib.contextmanager
def farms(broker, tmp_path, users: dict[str, list[str]], links: dict[str, list[str]], topics=(NEWS,), spark=None):
    """Farms by domain, each with ``users``, linked to ``links[domain]`` (and a peer of those);
    every farm has ``topics``; each farm with links runs its link process, and with ``spark`` each
    farm its job (:class:`Router`).  Yields the gateways."""
    peers = {domain: [other for other, theirs in links.items() if domain in theirs] for domain in users}
    configs = {domain: farm_config(broker, tmp_path, domain, users=users[domain], peers=peers[domain])
               for domain in users}
    configs = {domain: with_links(config, peers[domain], [(peer, configs[peer].gateway.port)
                                                          for peer in links.get(domain, [])])
               for domain, config in configs.items()}
    with contextlib.ExitStack() as stack:
        gateways = {domain: stack.enter_context(GatewayThread(config)) for domain, config in configs.items()}
        if spark is not None:
            for config in configs.values():
                stack.enter_context(Router(spark, config))
        for gateway in gateways.values():
            asyncio.run(create_smqp_topics(gateway.address, *topics))
        for domain in links:
            stack.enter_context(LinkThread(configs[domain]))
        yield gateways


def test_depth_0_1_and_minus_1_through_a_chain(broker, tmp_path):
    """A → B → C: B's link logs in at A, C's at B.  Depth 0 stays on A, 1 reaches B, -1 reaches C."""
    with farms(broker, tmp_path, {A: [], B: ["bob"], C: ["carol"]}, {B: [A], C: [B]}) as gateways:

        async def scenario() -> None:
            bob = await subscriber(gateways[B].address, "bob", "/news/*")
            carol = await subscriber(gateways[C].address, "carol", "/news/*")
            await until(holds(gateways[B], link_account(C), "/news/*"), "C's link holds carol's interest on B")
            await until(holds(gateways[A], link_account(B), "/news/*"), "B's link holds it on A, for C too")
            for depth in (0, 1, -1):
                await publish(gateways[A].address, NEWS, f"depth {depth}", depth=depth)
            assert [n.data for n in await received(bob, 2)] == [b"depth 1", b"depth -1"]
            assert [n.data for n in await received(carol, 1)] == [b"depth -1"]
            await nothing_more(bob)
            await nothing_more(carol, 1.0)
            await bob.quit()
            await carol.quit()

        asyncio.run(scenario())


@pytest.mark.timeout(600)
def test_the_triangle_with_depth_minus_1_delivers_exactly_once_at_each_subscriber(spark, broker, tmp_path):
    users = {A: ["alice"], B: ["bob"], C: ["carol"]}
    with farms(broker, tmp_path, users, {A: [B, C], B: [A, C], C: [A, B]}, spark=spark) as gateways:

        async def scenario() -> None:
            clients = {domain: await subscriber(gateways[domain].address, users[domain][0], "/news/*")
                       for domain in users}
            for domain in users:
                for peer in users:
                    if peer != domain:
                        await until(holds(gateways[domain], link_account(peer), "/news/*"),
                                    f"{peer}'s link holds its interest on {domain}")
            await publish(gateways[A].address, NEWS, "from a", depth=-1)
            await publish(gateways[B].address, NEWS, "from b", depth=-1)
            for domain, client in clients.items():
                assert sorted(n.data for n in await received(client, 2)) == [b"from a", b"from b"], domain
            for client in clients.values():
                await nothing_more(client, 2.0)
                await client.quit()

        asyncio.run(scenario())
        # each farm took in, once, each message another farm published: in its log and its history
        came_from = {domain: sorted(p.origin.partition("/")[0] for p in forwarded_publishes(gateways[domain].config))
                     for domain in users}
        assert came_from == {A: [B], B: [A], C: [A, B]}
        for domain, gateway in gateways.items():
            stored = wait_for(f"{domain}'s job stored both messages",
                              lambda: found if len(found := rows(gateway.config, "messages")) >= 2 else None, [])
            assert sorted(row["origin"] is None for row in stored) == [False, domain != C], domain


def test_a_remote_virtual_topic_created_subscribed_receiving(broker, tmp_path):
    """On A, /quotes/ibm > b.example/stocks/ibm; A's link pulls it from B as guest (A's link names
    no account for alice), and alice, subscribed on A, gets B's messages with B's Smuid."""
    with farms(broker, tmp_path, {A: ["alice"], B: []}, {A: [B]}, topics=("/stocks/ibm",)) as gateways:

        async def scenario() -> None:
            alice = await subscriber(gateways[A].address, "alice")
            await alice.create_topic("/quotes/ibm", target=f"{B}/stocks/ibm")
            assert ("/quotes/ibm", f"{B}/stocks/ibm") in await alice.list_topics("/quotes")
            await alice.subscribe("/quotes/ibm")
            await until(holds(gateways[B], "guest", "/stocks/ibm"), "A's link pulls /stocks/ibm from B")
            [smuid] = await publish(gateways[B].address, "/stocks/ibm", "24.567")
            [note] = await received(alice, 1)
            assert (note.data, note.header("Smuid")) == (b"24.567", f"{B}/{smuid}")
            await nothing_more(alice, 1.0)
            await alice.quit()

        asyncio.run(scenario())
