"""Login and notification guards over real sockets (issue 32, items 4 to 6): a stranger's failed
logins never lock the owner out and a correct password is refused no longer than a short bound;
SET NOTIFY PORT connects back to the client only, over TLS on an SMQPS session; CLEAR passwords
are refused on the plain port while SMQPS is configured, SCRAM stays allowed there."""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import replace

import pytest

from deploy.broker import free_port
from gateway.client import SMQPClient, SMQPError
from gateway.replies import NOT_ALLOWED, UNAUTHORIZED
from tests.e2e.stack import GatewayThread, hashed, stack_config
from tests.e2e.test_limits import self_signed

pytestmark = pytest.mark.e2e

ANN = hashed(ann="s3cret")
STRANGER = "127.0.0.2"  # another address of the loopback network, as a client elsewhere


def with_gateway(config, **changes):
    return replace(config, gateway=replace(config.gateway, **changes))


async def raw_login(address, account: str, password: str, *, source: str = "127.0.0.1") -> bytes:
    """LOGIN … CLEAR/1.0 then PASS from ``source``, by hand: the PASS reply's first line."""
    reader, writer = await asyncio.open_connection(*address, local_addr=(source, 0))
    try:
        await reader.readline()  # the greeting
        writer.write(f"LOGIN {account} CLEAR/1.0\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"200")
        writer.write(f"PASS {account} {password}\r\n".encode())
        return (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0]
    finally:
        writer.close()


# -- item 4


def test_a_stranger_failing_a_password_does_not_lock_its_owner_out(broker, tmp_path):
    config = stack_config(broker, tmp_path, {**ANN, **hashed(guest="guest-pw")})
    with GatewayThread(config) as gateway:
        async def scenario():
            for account in ("ann", "guest"):
                answers = [await raw_login(gateway.address, account, "guess", source=STRANGER) for _ in range(8)]
                assert answers[-1] == b"401 Unauthorized (too many failed logins; try again later)"
            async with await SMQPClient.open(*gateway.address, "ann", "s3cret") as owner:
                assert owner.login_attributes["Topic"] == "/accounts/ann"
            async with await SMQPClient.open(*gateway.address, "guest", "guest-pw") as guest:
                assert guest.login_attributes["Topic"] == "/accounts/guest"
        asyncio.run(scenario())


def test_a_correct_password_is_refused_no_longer_than_login_throttle_s(broker, tmp_path):
    config = with_gateway(stack_config(broker, tmp_path, ANN), max_login_failures=3, login_lockout_s=60,
                          login_throttle_s=1.5)
    with GatewayThread(config) as gateway:
        async def scenario():
            for _ in range(3):
                assert (await raw_login(gateway.address, "ann", "guess")).startswith(b"401 Unauthorized (password")
            assert await raw_login(gateway.address, "ann", "s3cret") == \
                b"401 Unauthorized (too many failed logins; try again later)"
            await asyncio.sleep(1.6)  # time itself: the throttle (login_throttle_s) runs out
            assert await raw_login(gateway.address, "ann", "s3cret") == b"200-OK"
        asyncio.run(scenario())


# -- item 5


def test_set_notify_port_elsewhere_is_401_and_the_server_connects_nowhere(broker, tmp_path):
    config = stack_config(broker, tmp_path)
    with GatewayThread(config) as gateway:
        async def scenario():
            knocked: list = []
            elsewhere = await asyncio.start_server(lambda r, w: knocked.append(w.close()), STRANGER, 0)
            port = elsewhere.sockets[0].getsockname()[1]
            async with await SMQPClient.open(*gateway.address) as client:
                with pytest.raises(SMQPError) as refused:
                    await client.command("SET", "NOTIFY", "PORT", str(port), STRANGER)
                assert refused.value.code == UNAUTHORIZED
                assert "own address 127.0.0.1" in str(refused.value)
                await client.notify_port()  # its own address stays allowed
                await client.noop()
            elsewhere.close()
            assert knocked == []
        asyncio.run(scenario())


def test_set_notify_port_to_a_host_the_configuration_names(broker, tmp_path):
    config = with_gateway(stack_config(broker, tmp_path), notify_hosts=(STRANGER,))
    with GatewayThread(config) as gateway:
        async def scenario():
            async with await SMQPClient.open(*gateway.address) as client:
                await client.create_topic("/relay/t")
                await client.subscribe("/relay/t")
                await client.notify_port(host=STRANGER)
                await client.publish("/relay/t", "to the relay")
                note = await client.next_notification(30)
                assert note.data == b"to the relay"
                await note.ack()
        asyncio.run(scenario())


def test_an_smqps_sessions_notifications_come_over_tls(broker, tmp_path):
    cert, key = self_signed(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert, client_key = self_signed(tmp_path / "client")  # the client's listener: 127.0.0.1
    config = with_gateway(stack_config(broker, tmp_path), tls_port=free_port(), tls_cert=cert, tls_key=key,
                          notify_tls_ca=client_cert)
    with GatewayThread(config) as gateway:
        listening = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        listening.load_cert_chain(client_cert, client_key)

        async def scenario():
            async with await SMQPClient.open(*gateway.gateway.tls_address,
                                             ssl=ssl.create_default_context(cafile=cert)) as client:
                await client.create_topic("/secure/n")
                await client.subscribe("/secure/n")
                with pytest.raises(ValueError, match="TLS"):  # a plain listener would get a TLS hello
                    await client.notify_port()
                await client.notify_port(ssl=listening)
                [channel] = client._notify_channels
                assert channel.writer.get_extra_info("ssl_object") is not None
                await client.publish("/secure/n", "secret")
                note = await client.next_notification(30)
                assert note.data == b"secret"
                await note.ack()
        asyncio.run(scenario())


def test_an_smqps_session_gets_404_from_a_listener_that_does_not_speak_tls(broker, tmp_path):
    cert, key = self_signed(tmp_path)
    config = with_gateway(stack_config(broker, tmp_path), tls_port=free_port(), tls_cert=cert, tls_key=key,
                          notify_tls_ca=cert)
    with GatewayThread(config) as gateway:
        async def scenario():
            hellos: list[bytes] = []

            async def plain(reader, writer):
                hellos.append(await reader.read(1))
                writer.close()
            listener = await asyncio.start_server(plain, "127.0.0.1", 0)
            port = listener.sockets[0].getsockname()[1]
            async with await SMQPClient.open(*gateway.gateway.tls_address,
                                             ssl=ssl.create_default_context(cafile=cert)) as client:
                started = time.monotonic()
                with pytest.raises(SMQPError) as refused:
                    await client.command("SET", "NOTIFY", "PORT", str(port))
                assert refused.value.code == 404 and time.monotonic() - started < 5
            listener.close()
            assert hellos == [b"\x16"]  # a TLS handshake record, never a NOTIFY in plain text
        asyncio.run(scenario())


# -- item 6


def test_clear_is_refused_on_the_plain_port_while_smqps_is_configured(broker, tmp_path):
    cert, key = self_signed(tmp_path)
    config = with_gateway(stack_config(broker, tmp_path, ANN), tls_port=free_port(), tls_cert=cert, tls_key=key)
    with GatewayThread(config) as gateway:
        async def scenario():
            async with await SMQPClient.connect(*gateway.address) as plain:
                with pytest.raises(SMQPError) as refused:
                    await plain.login("ann", "s3cret")
                assert refused.value.code == NOT_ALLOWED and "SMQPS" in str(refused.value)
                await plain.login("ann", "s3cret", method="SCRAM-SHA-256")
                with pytest.raises(SMQPError) as change:
                    await plain.change_password("s3cret", "n3w")
                assert change.value.code == NOT_ALLOWED
            async with await SMQPClient.open(*gateway.gateway.tls_address, "ann", "s3cret",
                                             ssl=ssl.create_default_context(cafile=cert)) as secure:
                assert secure.login_attributes["Topic"] == "/accounts/ann"
        asyncio.run(scenario())


def test_clear_on_the_plain_port_can_be_allowed_again(broker, tmp_path):
    cert, key = self_signed(tmp_path)
    config = with_gateway(stack_config(broker, tmp_path, ANN), tls_port=free_port(), tls_cert=cert, tls_key=key,
                          clear_only_over_tls=False)
    with GatewayThread(config) as gateway:
        async def scenario():
            async with await SMQPClient.open(*gateway.address, "ann", "s3cret") as client:
                assert client.login_attributes["Topic"] == "/accounts/ann"
        asyncio.run(scenario())
