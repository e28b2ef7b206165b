"""Test harness for the whole system: a real Kafka node, a real Spark query,
Delta tables on disk and a real gateway on a 127.0.0.1 socket."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import Future

from kafka import KafkaConsumer, TopicPartition

from deploy.broker import create_topics, free_port
from gateway.accounts import hash_password
from gateway.client import SMQPClient
from gateway.server.gateway import Gateway
from schemas.config import SMQPConfig, load_config


def stack_config(broker, tmp_path, accounts=None, topics=None, **gateway) -> SMQPConfig:
    """A configuration with topics and tables of its own, so tests never see each other's data.

    ``topics``: per-topic queue parameters (``[topics."/path"]``), e.g. short retry timeouts."""
    suffix = uuid.uuid4().hex[:8]
    config = load_config(
        env={}, data_dir=str(tmp_path / "data"),
        kafka={"bootstrap": broker.bootstrap, "commands_topic": f"cmd-{suffix}",
               "deliveries_topic": f"dlv-{suffix}"},
        gateway={"port": free_port(), **gateway},
        streaming={"query_name": f"router-{suffix}", "trigger_interval": "0 seconds"},
        accounts=accounts or {}, topics=topics or {},
    )
    create_topics(config.kafka)
    return config


def hashed(**passwords: str) -> dict[str, str]:
    """``[accounts]`` entries for the given passwords (a cheap KDF: tests log in often)."""
    return {name: hash_password(password, iterations=1000) for name, password in passwords.items()}


class GatewayThread:
    """A gateway running on its own event loop in a background thread."""

    def __init__(self, config: SMQPConfig):
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.gateway = Gateway(config)
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway", daemon=True)

    def __enter__(self) -> GatewayThread:
        self._thread.start()
        self.call(self.gateway.start(), timeout=90)
        return self

    def call(self, coroutine, timeout: float = 30):
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    @property
    def address(self) -> tuple[str, int]:
        return self.gateway.address

    def __exit__(self, *exc) -> None:
        self.call(self.gateway.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class Router:
    """The streaming job's query, startable and stoppable on one checkpoint."""

    def __init__(self, spark, config: SMQPConfig):
        self.spark = spark
        self.config = config
        self.query = None

    def start(self) -> Router:
        from streaming.job import build_query

        self.query = build_query(self.spark, self.config)
        return self

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None

    def __enter__(self) -> Router:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.query is not None and self.query.exception():
            raise self.query.exception()
        self.stop()


async def book_holds(gateway: GatewayThread, account: str, count: int, timeout: float = 60) -> None:
    """Wait until ``gateway``'s delivery book holds ``count`` deliveries pending for ``account``.

    The event a test waits for before a RESUME or a login that must find a whole backlog: the
    gateway has read every delivery (routed early from its fold, or from the job's records)."""
    deadline = time.monotonic() + timeout
    while (held := gateway.gateway.book.pending_count(account)) < count:
        assert time.monotonic() < deadline, f"{account} has {held} of {count} deliveries in the book"
        await asyncio.sleep(0.02)


async def create_smqp_topics(address: tuple[str, int], *topics: str) -> None:
    """CREATE TOPIC each of ``topics`` as guest (they must exist before PUB/SUB)."""
    async with await SMQPClient.open(*address) as admin:
        for topic in topics:
            await admin.create_topic(topic)


def commands_records(config: SMQPConfig) -> dict[int, list]:
    """Every record on the commands topic so far, by partition, each in offset order."""
    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(config.kafka.commands_topic, p)
                      for p in sorted(consumer.partitions_for_topic(config.kafka.commands_topic))]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        records: dict[int, list] = {tp.partition: [] for tp in partitions}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for tp, batch in consumer.poll(timeout_ms=200).items():
                records[tp.partition] += batch
            if all(consumer.highwater(tp) is not None and consumer.position(tp) >= consumer.highwater(tp)
                   for tp in partitions):
                break
        return records
    finally:
        consumer.close()
