"""Clients that stop reading cannot make the gateway buffer without bound (issue 6).

A real client socket with a small receive buffer stops reading while the gateway has more and
more to send it: NOTIFY TOPIC frames caused by another client, or the replies to its own
pipelined commands.  The gateway stops reading from it, keeps what it holds for it within
``max_buffered_bytes`` and closes it; other sessions go on working meanwhile.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request

import pytest

from deploy.broker import free_port
from gateway.accounts import hash_password
from gateway.client import SMQPClient
from gateway.metrics import parse
from tests.e2e.stack import GatewayThread, stack_config

pytestmark = pytest.mark.e2e

BOUND = 256 * 1024
KEYWORDS = [f"keyword{n:04d}" for n in range(550)]  # each NOTIFY TOPIC ... KEYWORDS frame is ~6.6 KB


@pytest.fixture
def gateway(broker, tmp_path):
    config = stack_config(broker, tmp_path, {"ann": hash_password("pw", iterations=1000)}, max_buffered_bytes=BOUND,
                          stalled_client_timeout_s=2.0, status_port=free_port())
    with GatewayThread(config) as running:
        asyncio.run(create_topic(running.address, "/flood/t"))
        yield running


async def create_topic(address, topic: str) -> None:
    async with await SMQPClient.open(*address) as client:
        await client.create_topic(topic)


def scrape(gateway: GatewayThread) -> dict:
    host, port = gateway.gateway.status_address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as page:
        families = parse(page.read().decode())
    closed = {labels["reason"]: value for _, labels, value in families["smqp_gateway_slow_clients_closed_total"].samples}
    return {"closed": closed, "peak": families["smqp_gateway_buffered_bytes_peak"].samples[0][2],
            "now": families["smqp_gateway_buffered_bytes"].samples[0][2]}


def stalled_login(address, *commands: bytes) -> socket.socket:
    """A blocking socket with a 4 KiB receive buffer, logged in as guest, that has read the
    replies to ``commands`` and will read nothing more."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(address)
    script = b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n" + b"".join(commands)
    sock.sendall(script)
    received = b""
    while received.count(b"\r\n\r\n") < 2 + len(commands):  # greeting has no empty line; 200, PASS, commands
        received += sock.recv(4096)
    return sock


def closed_by_server(sock: socket.socket, timeout: float = 30) -> bool:
    """Read what is left; True once the server has closed the connection (EOF or reset)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        return False
    return True


async def bystander_works(address) -> None:
    async with await SMQPClient.open(*address) as other:
        await other.noop()
        assert await other.publish("/flood/t", "still served")


def closes(gateway: GatewayThread, timeout: float = 60) -> dict:
    """The gateway's closes of slow clients by reason, once there is one (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while not (closed := scrape(gateway)["closed"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return closed


def test_a_client_that_stops_reading_its_notifications_is_closed_within_the_bound(gateway):
    """Another client's SET TOPIC KEYWORDs make NOTIFY TOPIC frames for a watcher that reads
    nothing; once the kernel's socket buffers are full (up to 4 MiB here) they pile up in the
    gateway, and the one that would pass max_buffered_bytes closes the watcher instead."""
    address = gateway.address
    stalled = stalled_login(address, b"SUB TOPIC /flood/*\r\n")
    try:
        async def flood() -> int:
            async with await SMQPClient.open(*address, "ann", "pw") as flooder:  # not the watching account
                for batch in range(1, 41):  # at most 2,000 changes, ~13 MB of notifications
                    await asyncio.gather(*(flooder.set_keywords("/flood/t", [f"k{n}", *KEYWORDS])
                                           for n in range(50)))
                    await bystander_works(address)  # served meanwhile
                    if (await asyncio.to_thread(scrape, gateway))["closed"]:
                        return batch * 50
            return 2000
        started = time.monotonic()
        changes = asyncio.run(flood())
        print(f"closed after {changes} keyword changes, {time.monotonic() - started:.1f} s")
        assert closes(gateway) == {"overflow": 1}
        assert closed_by_server(stalled)
    finally:
        stalled.close()
    figures = scrape(gateway)
    print(figures)
    assert 0 < figures["peak"] <= BOUND and figures["now"] < BOUND
    asyncio.run(bystander_works(address))


def test_a_client_that_never_reads_its_replies_is_paused_then_closed(gateway):
    """Pipelined NOOPs whose replies are never read: the gateway stops reading the client past
    half the bound (replies to one more read fit in the other half) and closes it after
    stalled_client_timeout_s."""
    address = gateway.address
    stalled = stalled_login(address)
    try:
        stalled.settimeout(3)
        sent = 0
        chunk = b"NOOP\r\n" * 10000
        with pytest.raises((socket.timeout, ConnectionError)):  # until neither side's buffers take more
            for _ in range(1000):
                stalled.sendall(chunk)
                sent += len(chunk)
        print(f"{sent} bytes of NOOPs sent before the gateway stopped reading")
        asyncio.run(bystander_works(address))
        assert closes(gateway) == {"stalled": 1}
        assert closed_by_server(stalled)
    finally:
        stalled.close()
    figures = scrape(gateway)
    print(figures)
    assert 0 < figures["peak"] <= BOUND
    asyncio.run(bystander_works(address))
