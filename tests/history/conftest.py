"""A message history made by the real engine, shared by the history tests.

Real broker, real streaming job (with its metrics listener), real gateway and
the reference client:

- phase 1: bob subscribes ``/news/*`` and carol ``/news/sport``; alice
  publishes 3 to ``/news/sport``, 2 to ``/news/weather`` and 1 to
  ``/stocks/ibm`` (no subscriber). Once Delta holds all 6 messages and their
  8 pending deliveries, the moment ``t1`` and each table's version are noted.
- phase 2: bob ACKs his 5; carol ACKs only the first sport message; alice
  publishes 2 more to ``/news/sport``; bob ACKs those too.

Final state: messages sport 5 / weather 2 / ibm 1; deliveries bob 7 acked,
carol 1 acked + 4 pending (all ``/news/sport``). At ``t1`` every one of the 8
deliveries was pending (6 of them on ``/news/sport``).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest
from deltalake import DeltaTable

from gateway.accounts import hash_password
from gateway.client import SMQPClient
from schemas.config import SMQPConfig
from streaming.metrics import parse_offsets
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, stack_config

SPORT, WEATHER, IBM = "/news/sport", "/news/weather", "/stocks/ibm"
ACCOUNTS = {name: hash_password(f"{name}-pw", iterations=1000) for name in ("alice", "bob", "carol")}


@dataclass
class History:
    config: SMQPConfig
    t1: datetime  # every delivery pending, nothing acknowledged yet
    versions_at_t1: dict[str, int]
    smuids: dict[str, list[int]] = field(default_factory=dict)  # topic → smuids in publish order

    @property
    def data_dir(self) -> str:
        return self.config.data_dir


def _rows(config: SMQPConfig, table: str) -> list[dict]:
    try:
        return DeltaTable(config.table_path(table)).to_pyarrow_table().to_pylist()
    except Exception:  # not created yet
        return []


def _wait(what: str, check, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


async def _login(address, account: str) -> SMQPClient:
    client = await SMQPClient.connect(*address)
    await client.login(account, f"{account}-pw")
    return client


async def _take(client: SMQPClient, count: int) -> list[int]:
    smuids = []
    for _ in range(count):
        note = await client.next_notification(90)
        await note.ack()
        smuids.append(note.smuid)
    return smuids


def _acked(config: SMQPConfig, account: str) -> int:
    return sum(1 for d in _rows(config, "deliveries") if d["account"] == account and d["status"] == "acked")


@pytest.fixture(scope="session")
def history(broker, spark, tmp_path_factory) -> History:
    config = stack_config(broker, tmp_path_factory.mktemp("history"), ACCOUNTS)
    smuids: dict[str, list[int]] = {SPORT: [], WEATHER: [], IBM: []}
    with Router(spark, config) as router, GatewayThread(config) as gateway:
        address = gateway.address

        async def phase1():
            await create_smqp_topics(address, SPORT, WEATHER, IBM)
            bob, carol, alice = [await _login(address, a) for a in ("bob", "carol", "alice")]
            await bob.subscribe("/news/*")
            await carol.subscribe(SPORT)
            for topic, count in ((SPORT, 3), (WEATHER, 2), (IBM, 1)):
                for i in range(count):
                    smuids[topic].append(await alice.publish(topic, f"{topic} #{i}", cmuid=f"A{topic[-3:]}{i}"))
            return bob, carol, alice

        loop = asyncio.new_event_loop()
        try:
            bob, carol, alice = loop.run_until_complete(phase1())
            # subscriptions too: a batch commits them last, after its messages and deliveries
            _wait("6 messages, 8 deliveries and 2 subscriptions in Delta",
                  lambda: len(_rows(config, "messages")) == 6 and len(_rows(config, "deliveries")) == 8
                  and len(_rows(config, "subscriptions")) == 2)
            t1 = datetime.now(timezone.utc)
            versions = {name: DeltaTable(config.table_path(name)).version()
                        for name in ("messages", "deliveries", "subscriptions")}
            time.sleep(0.05)  # later commits get later timestamps than t1

            async def phase2():
                assert sorted(await _take(bob, 5)) == sorted(smuids[SPORT] + smuids[WEATHER])
                assert await _take(carol, 1) == [smuids[SPORT][0]]  # FIFO within a priority
                for i in range(3, 5):
                    smuids[SPORT].append(await alice.publish(SPORT, f"{SPORT} #{i}", cmuid=f"Aort{i}"))
                assert await _take(bob, 2) == smuids[SPORT][3:]
                for client in (alice, bob, carol):
                    await client.quit()
                    await client.close()

            loop.run_until_complete(phase2())
        finally:
            loop.close()
        _wait("bob's 7 and carol's 1 ACK in Delta",
              lambda: _acked(config, "bob") == 7 and _acked(config, "carol") == 1 and
              len(_rows(config, "deliveries")) == 12)
        query = router.query
    # The listener appends its last rows when the query's termination event arrives.
    # (either source's form: partition 0 of the one commands topic)
    ends = parse_offsets(json.loads(query.lastProgress.json)["sources"][0]["endOffset"])
    last = next(offset for (_, partition), offset in ends.items() if partition == 0)
    _wait("the last batch in the metrics table",
          lambda: any(p["end_offset"] == last for r in _rows(config, "metrics") for p in r["partitions"]),
          timeout=30)
    return History(config=config, t1=t1, versions_at_t1=versions, smuids=smuids)
