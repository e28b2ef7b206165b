"""Test harness for linked farms: several farms on the one test Kafka, each with its own topics,
gateway and domain (:func:`tests.e2e.stack.stack_config`), and a farm's link process on a thread."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from concurrent.futures import Future
from dataclasses import replace

from deploy.broker import free_port
from federation.process import LinkProcess
from gateway.client import SMQPClient
from schemas.config import FederationConfig, LinkConfig, SMQPConfig
from schemas.events import Publish, decode
from tests.e2e.stack import commands_records, hashed, stack_config

PASSWORD = "pw"
#: The environment the link processes read their peer passwords from.
LINK_ENV = {"LINK_PASSWORD": PASSWORD}


def link_account(domain: str) -> str:
    """The account farm ``domain``'s link logs in as at its peers: ``b.example`` → ``blink``."""
    return f"{domain.split('.')[0]}link"


def farm_config(broker, tmp_path, domain: str, *, users=(), peers=(), links=()) -> SMQPConfig:
    """Farm ``domain``: accounts ``users`` and the link accounts of ``peers`` (password :data:`PASSWORD`);
    ``links``: (domain, port) of the farms it links to, as :func:`link_account`."""
    accounts = hashed(**{name: PASSWORD for name in (*users, *map(link_account, peers))})
    config = stack_config(broker, tmp_path / domain, accounts, server_host=domain)
    return with_links(config, peers, links)


def with_links(config: SMQPConfig, peers=(), links=()) -> SMQPConfig:
    """``config`` with these peers and links, quick retries and a /metrics port."""
    own = link_account(config.domain)
    return replace(config, federation=FederationConfig(
        peers={link_account(peer): peer for peer in peers},
        links=tuple(LinkConfig(domain=domain, address=f"127.0.0.1:{port}", account=own,
                               password_env="LINK_PASSWORD") for domain, port in links),
        status_port=free_port(), retry_initial_s=0.1, retry_max_s=1.0))


class LinkThread:
    """A farm's link process on its own event loop in a background thread."""

    def __init__(self, config: SMQPConfig):
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.process = LinkProcess(config, env=LINK_ENV)
        self._thread = threading.Thread(target=self.loop.run_forever, name="link", daemon=True)

    def __enter__(self) -> LinkThread:
        self._thread.start()
        self.call(self.process.start(), timeout=90)
        return self

    def call(self, coroutine, timeout: float = 30):
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.config.federation.status_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as page:
            return page.read().decode()

    def __exit__(self, *exc) -> None:
        self.call(self.process.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def metric(page: str, sample: str) -> float:
    """The value of ``sample`` (name and labels, as rendered) on a /metrics page; 0 when absent."""
    for line in page.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def until(condition, what: str, timeout: float = 30) -> None:
    """Wait for ``condition()`` (checked every 50 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


def holds(gateway, account: str, pattern: str):
    """A condition: ``account`` is subscribed to ``pattern`` at ``gateway`` (a GatewayThread)."""
    return lambda: gateway.gateway.registry.subscribed(account, pattern)


async def subscriber(address: tuple[str, int], account: str, *patterns: str) -> SMQPClient:
    client = await SMQPClient.open(*address, account, PASSWORD)
    for pattern in patterns:
        await client.subscribe(pattern)
    return client


async def publish(address: tuple[str, int], topic: str, *texts: str, depth: int | None = None) -> list[int]:
    """PUB each of ``texts`` as guest, with ``Depth`` when given; their SMUIDs."""
    headers = [("Depth", str(depth))] if depth is not None else []
    async with await SMQPClient.open(*address) as client:
        return [await client.publish(topic, text, headers=headers) for text in texts]


async def received(client: SMQPClient, count: int, timeout: float = 30) -> list:
    """The next ``count`` NOTIFY MESSAGEs, each ACKed."""
    notes = []
    while len(notes) < count:
        note = await client.next_notification(timeout)
        if note.resource == "MESSAGE":
            await note.ack()
            notes.append(note)
    return notes


async def nothing_more(client: SMQPClient, quiet: float = 3.0) -> None:
    """No further NOTIFY MESSAGE within ``quiet`` seconds."""
    try:
        while True:
            note = await client.next_notification(quiet)
            assert note.resource != "MESSAGE", f"notified again: {note.topic} {note.data!r}"
    except asyncio.TimeoutError:
        return


def forwarded_publishes(config: SMQPConfig) -> list[Publish]:
    """The publishes with an origin on ``config``'s commands topic: what links appended there."""
    found = []
    for records in commands_records(config).values():
        for record in records:
            if record.value.startswith(b'{"type":"publish"'):
                event = decode(record.value)
                if event.origin:
                    found.append(event)
    return found
