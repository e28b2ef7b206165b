"""Two farms on the one test Kafka, end to end: B's link process logs in to A's gateway as B's
account there, holds what B's subscribers want, and appends what A forwards to B's commands topic
before its ACK; B's gateway NOTIFYs it from there (early routing, no job needed: DELIVERY ALL)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import pytest

from deploy.broker import free_port
from federation.link import PeerSession
from tests.e2e.stack import GatewayThread, create_smqp_topics
from tests.e2e.test_limits import self_signed
from tests.federation.farms import (LinkThread, farm_config, forwarded_publishes, holds, link_account, metric,
                                    nothing_more, publish, received, subscriber, until, with_links)

pytestmark = pytest.mark.e2e

A, B = "a.example", "b.example"
NEWS = "/news/x"


@contextlib.contextmanager
def two_farms(broker, tmp_path, a_port: int | None = None):
    """A (where B's link logs in, ``blink``) and B (subscriber ``bob``), each with /news/x; B's
    configuration links to A at ``a_port`` (A's own port unless given: a gate in front of it)."""
    a_config = farm_config(broker, tmp_path, A, peers=[B])
    with GatewayThread(a_config) as a_gateway:
        b_config = farm_config(broker, tmp_path, B, users=["bob"], links=[(A, a_port or a_gateway.address[1])])
        with GatewayThread(b_config) as b_gateway:
            for gateway in (a_gateway, b_gateway):
                asyncio.run(create_smqp_topics(gateway.address, NEWS))
            yield a_gateway, b_gateway


def test_a_message_published_on_a_with_depth_1_reaches_bs_subscriber_once(broker, tmp_path):
    with two_farms(broker, tmp_path) as (a_gateway, b_gateway):

        async def scenario(link: LinkThread) -> None:
            bob = await subscriber(b_gateway.address, "bob", "/news/*")
            await until(holds(a_gateway, "blink", "/news/*"), "B's link subscribed on A to what bob wants")
            await publish(a_gateway.address, NEWS, "stays on A")  # no Depth: 0
            [smuid] = await publish(a_gateway.address, NEWS, "24.567", depth=1)
            [note] = await received(bob, 1)
            assert (note.topic.rpartition("/news/")[2], note.data) == ("x", b"24.567")
            await nothing_more(bob)
            [appended] = forwarded_publishes(b_gateway.config)  # not the one without Depth
            assert (appended.origin, appended.origin_topic, appended.topic) == (f"{A}/{smuid}", f"{A}{NEWS}", NEWS)
            assert (appended.depth, appended.hops) == (0, [A])
            assert all(name.lower() != "depth" for name, _ in appended.headers)
            page = link.metrics()
            assert f'smqp_link_up{{link="{A}"}} 1' in page
            assert f'smqp_link_forwarded_total{{link="{A}"}} 1' in page
            await bob.quit()

        with LinkThread(b_gateway.config) as link:
            asyncio.run(scenario(link))


def test_bs_subscriber_sees_the_origin_smuid(broker, tmp_path):
    """Needs the gateways' rendering of a forwarded message (``Smuid: <origin>``)."""
    with two_farms(broker, tmp_path) as (a_gateway, b_gateway):

        async def scenario() -> None:
            bob = await subscriber(b_gateway.address, "bob", "/news/*")
            await until(holds(a_gateway, "blink", "/news/*"), "B's link subscribed on A")
            [smuid] = await publish(a_gateway.address, NEWS, "24.567", depth=1)
            [note] = await received(bob, 1)
            assert note.header("Smuid") == f"{A}/{smuid}"
            await bob.quit()

        with LinkThread(b_gateway.config):
            asyncio.run(scenario())


def test_a_link_killed_between_its_append_and_its_ack_delivers_the_message_once(broker, tmp_path, monkeypatch):
    """The first link appends, then dies before its ACK; A keeps the message for B's account and
    sends it again to the restarted link, whose dedup set (rebuilt from B's commands topic) drops
    it and ACKs it.  Bob has it once, and what follows goes on."""
    with two_farms(broker, tmp_path) as (a_gateway, b_gateway):
        appended_here = asyncio.Event()

        async def never_ack(session, note) -> None:
            appended_here.set()
            await asyncio.Event().wait()  # killed before the ACK

        async def first_run() -> int:
            await until(holds(a_gateway, "blink", "/news/*"), "B's link subscribed on A")
            [smuid] = await publish(a_gateway.address, NEWS, "once", depth=1)
            await until(lambda: len(forwarded_publishes(b_gateway.config)) == 1, "the append on B")
            return smuid

        loop = asyncio.new_event_loop()
        try:
            bob = loop.run_until_complete(subscriber(b_gateway.address, "bob", "/news/*"))
            monkeypatch.setattr(PeerSession, "acknowledge", never_ack)
            with LinkThread(b_gateway.config):
                smuid = loop.run_until_complete(first_run())
                assert loop.run_until_complete(received(bob, 1))[0].data == b"once"
                assert a_gateway.gateway.book.pending_count("blink") == 1  # A never got the ACK
            monkeypatch.undo()
            with LinkThread(b_gateway.config) as link:
                loop.run_until_complete(until(lambda: a_gateway.gateway.book.pending_count("blink") == 0,
                                              "the restarted link ACKed the resent message"))
                assert f'smqp_link_dropped_total{{link="{A}",reason="seen"}} 1' in link.metrics()
                loop.run_until_complete(publish(a_gateway.address, NEWS, "next", depth=1))
                assert [n.data for n in loop.run_until_complete(received(bob, 1))] == [b"next"]
                loop.run_until_complete(nothing_more(bob))
            assert [p.origin for p in forwarded_publishes(b_gateway.config)][0] == f"{A}/{smuid}"
            assert len(forwarded_publishes(b_gateway.config)) == 2
            loop.run_until_complete(bob.quit())
        finally:
            loop.close()


class Gate:
    """A TCP port in front of a gateway that refuses connections until :meth:`open`."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.pipes: set[asyncio.Task] = set()

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for pipe in self.pipes:
            pipe.cancel()
        await asyncio.gather(*self.pipes, return_exceptions=True)

    async def _accept(self, reader, writer) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.ensure_future(_pipe(source, sink))
            self.pipes.add(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


def test_a_link_whose_peer_is_unreachable_retries_and_catches_up(broker, tmp_path):
    """B's link starts while A cannot be reached (its account there still holds /news/*, from an
    earlier run): it retries with backoff, and once A is reachable gets what was published meanwhile."""
    a_config = farm_config(broker, tmp_path, A, peers=[B])
    with GatewayThread(a_config) as a_gateway:
        b_config = farm_config(broker, tmp_path, B, users=["bob"])
        with GatewayThread(b_config) as b_gateway:
            loop = asyncio.new_event_loop()
            gate = Gate(a_gateway.address)
            b_config = with_links(b_config, links=[(A, gate.port)])
            try:
                for gateway in (a_gateway, b_gateway):
                    loop.run_until_complete(create_smqp_topics(gateway.address, NEWS))
                bob = loop.run_until_complete(subscriber(b_gateway.address, "bob", "/news/*"))
                earlier = loop.run_until_complete(subscriber(a_gateway.address, link_account(B), "/news/*"))
                loop.run_until_complete(earlier.quit())
                with LinkThread(b_config) as link:
                    loop.run_until_complete(until(
                        lambda: metric(link.metrics(), 'smqp_link_connect_failures_total{link="a.example"}') >= 3,
                        "three failed attempts"))
                    assert 'smqp_link_up{link="a.example"} 0' in link.metrics()
                    texts = [f"meanwhile {i}" for i in range(3)]
                    loop.run_until_complete(publish(a_gateway.address, NEWS, *texts, depth=1))
                    loop.run_until_complete(gate.open())
                    assert [n.data.decode() for n in loop.run_until_complete(received(bob, 3))] == texts
                    loop.run_until_complete(nothing_more(bob, 1.0))
                    assert 'smqp_link_up{link="a.example"} 1' in link.metrics()
                loop.run_until_complete(bob.quit())
            finally:
                loop.run_until_complete(gate.close())
                loop.close()


def test_a_link_over_tls(broker, tmp_path):
    """B's link reaches A's SMQPS port, verifying A's certificate against its ``tls_ca``."""
    cert, key = self_signed(tmp_path)
    a_config = farm_config(broker, tmp_path, A, peers=[B])
    a_config = replace(a_config, gateway=replace(a_config.gateway, tls_port=free_port(), tls_cert=cert, tls_key=key,
                                                 clear_only_over_tls=False))  # the test's guest publishes
    with GatewayThread(a_config) as a_gateway:
        b_config = farm_config(broker, tmp_path, B, users=["bob"])
        link = replace(with_links(b_config, links=[(A, a_gateway.gateway.tls_address[1])]).federation.links[0],
                       tls=True, tls_ca=cert)
        b_config = replace(b_config, federation=replace(with_links(b_config).federation, links=(link,)))
        with GatewayThread(b_config) as b_gateway:

            async def scenario() -> None:
                for gateway in (a_gateway, b_gateway):
                    await create_smqp_topics(gateway.address, NEWS)
                bob = await subscriber(b_gateway.address, "bob", "/news/*")
                await until(holds(a_gateway, "blink", "/news/*"), "B's link subscribed on A over TLS")
                await publish(a_gateway.address, NEWS, "secure", depth=1)
                assert [n.data for n in await received(bob, 1)] == [b"secure"]
                await bob.quit()

            with LinkThread(b_config) as running:
                asyncio.run(scenario())
                channel = running.process.sessions[A].client._main
                assert channel.writer.get_extra_info("ssl_object") is not None


def test_a_plain_link_logs_in_with_scram_where_the_peer_refuses_clear(broker, tmp_path):
    """A's plain port refuses LOGIN CLEAR (it has an SMQPS port, ``clear_only_over_tls``): B's plain
    link still logs in, with SCRAM-SHA-256, and its password never crosses the wire."""
    cert, key = self_signed(tmp_path)
    a_config = farm_config(broker, tmp_path, A, peers=[B])
    a_config = replace(a_config, gateway=replace(a_config.gateway, tls_port=free_port(), tls_cert=cert, tls_key=key))
    with GatewayThread(a_config) as a_gateway:
        b_config = farm_config(broker, tmp_path, B, users=["bob"], links=[(A, a_gateway.address[1])])
        with GatewayThread(b_config), LinkThread(b_config) as link:

            async def scenario() -> None:
                await until(lambda: 'smqp_link_up{link="a.example"} 1' in link.metrics(), "B's link logged in at A")
                assert metric(link.metrics(), 'smqp_link_connect_failures_total{link="a.example"}') == 0

            asyncio.run(scenario())


def test_the_link_follows_bs_interest_and_retries_what_a_refused_when_bs_registry_changes(broker, tmp_path):
    """A has no /sport yet: its 404 for /sport/* is skipped and counted; once A has it, the next
    change of B's subscriptions brings it; bob's UNSUB on B is the link's UNSUB on A."""
    with two_farms(broker, tmp_path) as (a_gateway, b_gateway):
        asyncio.run(create_smqp_topics(b_gateway.address, "/sport/x"))

        async def scenario(link: LinkThread) -> None:
            bob = await subscriber(b_gateway.address, "bob", "/news/*", "/sport/*")
            await until(holds(a_gateway, "blink", "/news/*"), "B's link subscribed /news/* on A")
            await until(lambda: 'smqp_link_refused_patterns{link="a.example"} 1' in link.metrics(),
                        "/sport/* refused")
            await create_smqp_topics(a_gateway.address, "/sport/x")
            await bob.subscribe("/sport/x")  # B's registry changes
            await until(holds(a_gateway, "blink", "/sport/*"), "/sport/* subscribed on A at last")
            # A's registry folds the SUB from Kafka, maybe before the link has read A's 200 for it
            await until(lambda: 'smqp_link_refused_patterns{link="a.example"} 0' in link.metrics(),
                        "the link counts no refused pattern")
            await publish(a_gateway.address, "/sport/x", "goal", depth=1)
            assert [n.data for n in await received(bob, 1)] == [b"goal"]
            await bob.unsubscribe("/news/*")
            await until(lambda: not holds(a_gateway, "blink", "/news/*")(), "B's link unsubscribed /news/* on A")
            await bob.quit()

        with LinkThread(b_gateway.config) as link:
            asyncio.run(scenario(link))
