"""Limits and SMQPS over real sockets: a full gateway redirects LOGINs to another of its farm (311),
and one past its connection limit greets with ``Not Available`` and closes."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from dataclasses import replace

import pytest

from deploy.broker import free_port
from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, stack_config

pytestmark = pytest.mark.e2e


def with_gateway(config, **changes):
    return replace(config, gateway=replace(config.gateway, **changes))


def test_a_full_gateway_redirects_to_another_of_the_farm(broker, tmp_path):
    config = stack_config(broker, tmp_path)
    second = with_gateway(config, port=free_port(), node_id=2)
    with GatewayThread(second) as spare:
        host, port = spare.address
        full = with_gateway(config, max_logins=1, redirect_to=f"{host}:{port}")
        with GatewayThread(full) as busy:
            async def scenario():
                first = await SMQPClient.open(*busy.address)  # takes the only login
                redirected = await SMQPClient.open(*busy.address)  # follows 311 to the spare
                assert redirected.login_attributes["Topic"] == "/accounts/guest"
                assert redirected.address == (host, port)
                await redirected.quit(), await first.quit()
            asyncio.run(scenario())


def test_past_the_connection_limit_the_greeting_says_not_available(broker, tmp_path):
    config = with_gateway(stack_config(broker, tmp_path), max_connections=1)
    with GatewayThread(config) as gateway:
        async def scenario():
            reader, writer = await asyncio.open_connection(*gateway.address)
            assert (await reader.readline()).startswith(b"SMQP/1.0 Ready.")
            reader2, writer2 = await asyncio.open_connection(*gateway.address)
            assert (await reader2.readline()).startswith(b"SMQP/1.0 Not Available.")
            assert await asyncio.wait_for(reader2.read(), 5) == b""  # closed by the server
            writer.close(), writer2.close()
        asyncio.run(scenario())


def self_signed(directory) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, made by openssl."""
    cert, key = str(directory / "server.crt"), str(directory / "server.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=smqp-test",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_a_whole_session_over_smqps(broker, tmp_path):
    """SMQPS: TLS beside the plain listener; the client verifies the server's certificate."""
    cert, key = self_signed(tmp_path)
    config = with_gateway(stack_config(broker, tmp_path), tls_port=free_port(), tls_cert=cert, tls_key=key)
    with GatewayThread(config) as gateway:
        trusting = ssl.create_default_context(cafile=cert)

        async def scenario():
            async with await SMQPClient.open(*gateway.gateway.tls_address, ssl=trusting) as client:
                await client.create_topic("/secure/t")
                assert await client.subscribe("/secure/*") == ["/secure/t"]
                assert await client.publish("/secure/t", b"over TLS")
                assert await client.list_subscriptions() == ["/secure/*"]
            with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust it
                await SMQPClient.connect(*gateway.gateway.tls_address, ssl=ssl.create_default_context())
        asyncio.run(scenario())


def test_scram_login_never_sends_the_password_and_failures_are_throttled(broker, tmp_path):
    """SCRAM-SHA-256 over real sockets against a PBKDF2-hashed account, over SMQPS too."""
    from gateway.accounts import hash_password
    from gateway.client import SMQPError
    cert, key = self_signed(tmp_path)
    config = with_gateway(stack_config(broker, tmp_path, {"ann": hash_password("s3cret", iterations=4096)}),
                          max_login_failures=2, tls_port=free_port(), tls_cert=cert, tls_key=key)
    with GatewayThread(config) as gateway:
        async def scenario():
            async with await SMQPClient.connect(*gateway.gateway.tls_address,
                                                ssl=ssl.create_default_context(cafile=cert)) as client:
                attributes = await client.login("ann", "s3cret", method="SCRAM-SHA-256")
                assert attributes["Topic"] == "/accounts/ann" and "Verifier" in attributes
            for _ in range(2):
                async with await SMQPClient.connect(*gateway.address) as client:
                    with pytest.raises(SMQPError) as refused:
                        await client.login("ann", "wrong", method="SCRAM-SHA-256")
                    assert refused.value.code == 401
            async with await SMQPClient.connect(*gateway.address) as client:
                with pytest.raises(SMQPError, match="too many failed logins"):
                    await client.login("ann", "s3cret", method="SCRAM-SHA-256")
        asyncio.run(scenario())


def test_a_full_topic_queue_refuses_publishes_until_subscribers_drain_it(broker, spark, tmp_path):
    """Per-topic limits from [topics."/…"]: 413 beyond the topic's message size; 414 while its
    queue holds max_messages undelivered messages, 200 again once one is acknowledged."""
    from gateway.client import SMQPError
    from gateway.replies import ENTITY_TOO_LARGE, RESOURCE_TOO_LARGE
    from tests.e2e.stack import Router

    config = replace(stack_config(broker, tmp_path), topics={"/q": {"max_messages": 2, "max_message_bytes": 100}})
    with Router(spark, config), GatewayThread(config) as gateway:
        async def queued() -> tuple[int, int]:
            return gateway.gateway.book.sizes.of("/q/work")

        async def scenario():
            async with await SMQPClient.open(*gateway.address) as sub, \
                    await SMQPClient.open(*gateway.address) as pub:
                await pub.create_topic("/q/work")
                await sub.subscribe("/q/work")
                with pytest.raises(SMQPError) as too_large:
                    await pub.publish("/q/work", b"x" * 101)
                assert too_large.value.code == ENTITY_TOO_LARGE
                await pub.publish("/q/work", "one")
                await pub.publish("/q/work", "two")
                first = await sub.next_notification(120)  # routed; not acknowledged yet
                for _ in range(240):  # until the gateway has heard of the second delivery too
                    if await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(queued(), gateway.loop)) == (2, 6):
                        break
                    await asyncio.sleep(0.25)
                with pytest.raises(SMQPError) as full:
                    await pub.publish("/q/work", "three")
                assert full.value.code == RESOURCE_TOO_LARGE and "2 messages waiting" in str(full.value)
                await first.ack()  # one drained: room for one more
                await pub.publish("/q/work", "three")
                second = await sub.next_notification(120)
                await second.ack()
                assert second.data == b"two"
        asyncio.run(scenario())
