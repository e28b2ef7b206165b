"""The gateway's Kafka feeds against a real Kafka node (gateway.server.feeds)."""

from __future__ import annotations

import asyncio

from gateway.server.feeds import open_commands_log, read_acks_since
from kafka_edge import Cluster
from schemas.events import Ack, Sync
from tests.conftest import kafka_config


def _config(bootstrap: str):
    return kafka_config(bootstrap)


def test_acks_since_the_jobs_progress_are_read_back_at_start(broker):
    config = _config(broker.bootstrap)

    async def scenario():
        cluster = Cluster(config, client_id="test")
        log = await open_commands_log(config, cluster)
        try:
            early = await log.append(b"bob", Ack("bob", "g", 1, 0).to_bytes())
            await log.append(b"", Sync("s").to_bytes(), partition=0)
            await log.append(b"bob", Ack("bob", "g", 2, 0).to_bytes())
            acks = await read_acks_since(config, cluster, {"0": early.offset + 1})
            assert [ack.smuid for ack in acks] == [2]
            assert [ack.smuid for ack in await read_acks_since(config, cluster, {})] == [1, 2]
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())
