"""Two farms, each with its own streaming job (a query of the test session's Spark), Delta tables and
gateway on the one test Kafka: what the jobs record of a forwarding, and what a user reads back.

A's job must route a ``Depth: 1`` message to B's link account and a ``Depth: 0`` one to nobody
there (the one forwarding rule, in SQL); B's job must store the forwarded message with its origin
and route, which ``GET MESSAGE`` on B then shows with the origin's SMUID."""

from __future__ import annotations

import asyncio
import time

import pytest
from deltalake import DeltaTable

from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics
from tests.federation.farms import (PASSWORD, LinkThread, farm_config, holds, nothing_more, publish, received,
                                    subscriber, until)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

A, B = "a.example", "b.example"
NEWS = "/news/x"


def rows(config, table: str) -> list[dict]:
    """Every row of one of ``config``'s Delta tables (none before the job created it)."""
    try:
        return DeltaTable(config.table_path(table)).to_pyarrow_table().to_pylist()
    except Exception:  # noqa: BLE001 - not created yet
        return []


def wait_for(what: str, found, routers: list[Router], timeout: float = 180):
    """Poll ``found()`` until it is truthy, the jobs still running; its value."""
    deadline = time.monotonic() + timeout
    while not (value := found()):
        for router in routers:
            assert router.query.exception() is None, f"a job failed: {router.query.exception()}"
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.5)
    return value


def test_each_farms_job_records_the_forwarding_and_b_serves_the_message_with_its_origin(spark, broker, tmp_path):
    a_config = farm_config(broker, tmp_path, A, peers=[B])
    with GatewayThread(a_config) as a_gateway:
        b_config = farm_config(broker, tmp_path, B, users=["bob"], links=[(A, a_gateway.address[1])])
        with GatewayThread(b_config) as b_gateway, Router(spark, a_config) as a_job, Router(spark, b_config) as b_job:
            for gateway in (a_gateway, b_gateway):
                asyncio.run(create_smqp_topics(gateway.address, NEWS))

            async def forward() -> tuple[int, int]:
                bob = await subscriber(b_gateway.address, "bob", "/news/*")
                await until(holds(a_gateway, "blink", "/news/*"), "B's link subscribed on A")
                [local] = await publish(a_gateway.address, NEWS, "stays on A")
                [far] = await publish(a_gateway.address, NEWS, "24.567", depth=1)
                [note] = await received(bob, 1)
                assert (note.topic, note.header("Smuid"), note.data) == (f"{A}{NEWS}", f"{A}/{far}", b"24.567")
                await nothing_more(bob, quiet=2)
                await bob.quit()
                return local, far

            with LinkThread(b_gateway.config):
                local, far = asyncio.run(forward())

            # A's job: B's link got the Depth 1 message (and ACKed it), never the Depth 0 one
            deliveries = wait_for("A's job recorded B's link's delivery, acknowledged", lambda: [
                row for row in rows(a_config, "deliveries") if row["account"] == "blink" and row["status"] == "acked"],
                [a_job, b_job])
            assert [row["smuid"] for row in deliveries] == [far]
            assert not [row for row in rows(a_config, "deliveries") if row["smuid"] == local and row["account"] == "blink"]

            # B's job: the forwarded message, once, with its origin and route
            stored = wait_for("B's job stored the forwarded message", lambda: [
                row for row in rows(b_config, "messages") if row["origin"] is not None], [a_job, b_job])
            assert [(row["origin"], row["origin_topic"], row["topic"], row["depth"], row["hops"]) for row in stored] == [
                (f"{A}/{far}", f"{A}{NEWS}", NEWS, 0, [A])]
            assert wait_for("B's job recorded bob's acknowledgement", lambda: [
                row for row in rows(b_config, "deliveries")
                if row["account"] == "bob" and row["smuid"] == stored[0]["smuid"] and row["status"] == "acked"],
                [a_job, b_job])

            async def read_back() -> list:
                async with await SMQPClient.open(*b_gateway.address, "bob", PASSWORD) as bob:
                    return await bob.get_messages(NEWS)

            [message] = asyncio.run(read_back())
            assert (message.header("Smuid"), message.header("Hops"), message.data) == (f"{A}/{far}", A, b"24.567")
