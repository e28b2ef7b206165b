"""Federation at the gateway (issue 33), over real sockets: two farms, a.example and b.example, each a
real gateway on its own Kafka topics of the one real broker.  No job runs: a gateway routes DELIVERY
ALL messages from its fold, which is all these tests need.

Farm B lets ann read ``/stocks`` and nobody else (guest included); ``/public`` is open.  Farm A
gives the remote right to ann and bob (not zed); its ``[[federation.links]]`` to b.example logs ann
in there as herself (her password at B in ``$ANN_AT_B``) and anyone else as guest; ``bfarm`` is
farm B's link account on A (``[federation] peers``).

* CREATE TOPIC /x > b.example/y is made only when that login may read /y at B: 200, 401 for a
  login refused or no read right there, 404 for no such topic or a farm that cannot be reached;
  LIST TOPIC shows the link; PUB to it is 405.
* PUB with a Depth other than 0 needs the remote right: 401 and nothing published.
* A peer's link is NOTIFYed early only what may go to it: Depth 0 stays here, Depth 1 and -1 go,
  with ``Depth`` and this farm's ``Smuid``.
* A link may use TLS, and then trusts only the certificate its ``tls_ca`` vouches for.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from deploy.broker import free_port
from gateway.client import SMQPClient, SMQPError
from schemas.config import FederationConfig, LinkConfig
from tests.e2e.stack import GatewayThread, create_smqp_topics, hashed, stack_config
from tests.e2e.test_limits import self_signed

pytestmark = pytest.mark.e2e

QUIET_S = 1.5  # long enough for a NOTIFY that is coming to arrive (the fold polls every 20 ms)


@pytest.fixture
def farms(broker, tmp_path, monkeypatch):
    """(farm A's gateway, farm B's gateway), B holding /stocks/ibm and /public/news."""
    monkeypatch.setenv("ANN_AT_B", "ann-at-b")
    config_b = stack_config(broker, tmp_path / "b", hashed(ann="ann-at-b", eve="e"), server_host="b.example")
    config_b = replace(config_b, ual={"/stocks": {"subscribe": ["ann"]}})
    with GatewayThread(config_b) as farm_b:
        asyncio.run(create_smqp_topics(farm_b.address, "/stocks/ibm", "/public/news"))
        config_a = stack_config(broker, tmp_path / "a", hashed(ann="a", bob="b", zed="z", bfarm="f"),
                                server_host="a.example")
        config_a = replace(config_a, ual={"/": {"remote": ["ann", "bob"]}}, federation=FederationConfig(
            peers={"bfarm": "b.example"},
            links=[LinkConfig("b.example", f"127.0.0.1:{farm_b.address[1]}", account="afarm",
                              accounts={"ann": "ANN_AT_B"}),
                   LinkConfig("c.example", f"127.0.0.1:{free_port()}")]))  # nobody listens there
        with GatewayThread(config_a) as farm_a:
            asyncio.run(create_smqp_topics(farm_a.address, "/news"))
            yield farm_a, farm_b


async def login(gateway: GatewayThread, account: str, password: str) -> SMQPClient:
    return await SMQPClient.open(*gateway.address, account, password)


async def refusal(coroutine) -> str:
    """The reply a refused command got: ``<code> <text>``."""
    with pytest.raises(SMQPError) as refused:
        await coroutine
    return str(refused.value)


def test_a_remote_link_is_made_only_when_the_other_farm_lets_its_login_read_the_target(farms, monkeypatch):
    farm_a, _ = farms

    async def scenario() -> None:
        async with await login(farm_a, "ann", "a") as ann, await login(farm_a, "bob", "b") as bob, \
                await login(farm_a, "zed", "z") as zed:
            await ann.create_topic("/quotes/ibm", target="b.example/stocks/ibm")  # ann may read it at B
            assert await ann.list_topics("/quotes") == [("/quotes/ibm", "b.example/stocks/ibm")]
            assert await bob.list_topics("/quotes") == [("/quotes/ibm", "b.example/stocks/ibm")]
            # bob is not named by the link: guest at B, who may not read /stocks
            assert await refusal(bob.create_topic("/quotes/ibm2", target="b.example/stocks/ibm")) == \
                "401 Unauthorized (guest may not read /stocks/ibm at b.example)"
            await bob.create_topic("/quotes/news", target="b.example/public/news")  # guest may read that
            assert await refusal(bob.create_topic("/quotes/none", target="b.example/public/none")) == \
                "404 Not found (no topic /public/none at b.example)"
            assert (await refusal(bob.create_topic("/quotes/c", target="c.example/x"))).startswith(
                "404 Not found (c.example not reachable at 127.0.0.1:")
            assert await refusal(bob.create_topic("/quotes/d", target="d.example/x")) == \
                "404 Not found (d.example: no link to that farm is configured here)"
            assert await refusal(zed.create_topic("/quotes/z", target="b.example/public/news")) == \
                "401 Unauthorized (no remote permission on /quotes/z)"
            monkeypatch.setenv("ANN_AT_B", "not-her-password")
            assert (await refusal(ann.create_topic("/quotes/ibm3", target="b.example/stocks/ibm"))).startswith(
                "401 Unauthorized (b.example refused the login of ann: ")
            assert [path for path, _ in await ann.list_topics("/quotes")] == ["/quotes/ibm", "/quotes/news"]
            assert await refusal(ann.publish("/quotes/ibm", b"24.5")) == (
                "405 Not allowed (/quotes/ibm links to another farm: publishing to a remote topic is not supported)")
            assert await ann.subscribe("/quotes/ibm") == ["/quotes/ibm"]  # its messages are stored here
    asyncio.run(scenario())
    assert [link.topic for link in farm_a.gateway.registry.remote_links()] == ["/quotes/ibm", "/quotes/news"]


async def publish(client: SMQPClient, data: bytes, depth: str | None) -> int:
    headers = [("Depth", depth)] if depth is not None else []
    return await client.publish("/news", data, headers=headers)


async def quiet(client: SMQPClient) -> bool:
    try:
        await client.next_notification(QUIET_S)
    except asyncio.TimeoutError:
        return True
    return False


def test_a_peers_link_is_notified_early_only_what_its_depth_lets_go_there(farms):
    farm_a, _ = farms

    async def scenario() -> None:
        async with await login(farm_a, "ann", "a") as ann, await login(farm_a, "bob", "b") as bob, \
                await login(farm_a, "bfarm", "f") as bfarm, await login(farm_a, "zed", "z") as zed:
            await bob.subscribe("/news")
            await bfarm.subscribe("/news")
            assert (await refusal(publish(zed, b"far", "1"))).startswith(
                "401 Unauthorized (no remote permission on /news")
            assert await quiet(bob)  # nothing was published
            for depth in (None, "0"):
                await publish(ann, b"stays", depth)
                note = await bob.next_notification(30)
                assert note.data == b"stays" and note.header("Depth") is None
                await note.ack()
            assert await quiet(bfarm)
            for depth in ("1", "-1"):
                smuid = await publish(ann, b"goes " + depth.encode(), depth)
                note = await bfarm.next_notification(30)
                assert (note.topic, note.data) == ("/news", b"goes " + depth.encode())
                assert note.header("Smuid") == f"a.example/{smuid}" and note.header("Depth") == depth
                assert note.header("Hops") is None
                await note.ack()
                await (await bob.next_notification(30)).ack()
    asyncio.run(scenario())


def test_a_link_over_tls_trusts_only_the_certificate_it_is_given(broker, tmp_path, monkeypatch):
    """SMQPS between farms (``tls``, ``tls_ca``): the check logs in over TLS; a link whose CA does
    not vouch for the other farm's certificate reaches nothing (404, no login sent in clear)."""
    cert, key = self_signed(tmp_path)
    (tmp_path / "other").mkdir()
    other, _ = self_signed(tmp_path / "other")
    monkeypatch.setenv("ANN_AT_B", "ann-at-b")
    config_b = stack_config(broker, tmp_path / "b", hashed(ann="ann-at-b"), server_host="b.example",
                            tls_port=free_port(), tls_cert=cert, tls_key=key, clear_only_over_tls=False)
    with GatewayThread(config_b) as farm_b:
        asyncio.run(create_smqp_topics(farm_b.address, "/stocks/ibm"))
        address = f"127.0.0.1:{farm_b.gateway.tls_address[1]}"
        config_a = stack_config(broker, tmp_path / "a", hashed(ann="a"), server_host="a.example")
        config_a = replace(config_a, federation=FederationConfig(links=[
            LinkConfig("b.example", address, tls=True, tls_ca=cert, accounts={"ann": "ANN_AT_B"}),
            LinkConfig("c.example", address, tls=True, tls_ca=other, accounts={"ann": "ANN_AT_B"})]))
        with GatewayThread(config_a) as farm_a:
            async def scenario() -> None:
                async with await login(farm_a, "ann", "a") as ann:
                    await ann.create_topic("/quotes/ibm", target="b.example/stocks/ibm")
                    assert (await refusal(ann.create_topic("/quotes/c", target="c.example/stocks/ibm"))).startswith(
                        "404 Not found (c.example not reachable at 127.0.0.1:")
            asyncio.run(scenario())
