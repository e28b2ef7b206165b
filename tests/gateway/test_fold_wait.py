"""A control command's reply waits for the gateway's registry fold to reach its offset (Gateway.folded)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.server.feeds import control_tail
from kafka_edge import Cluster
from gateway.server.gateway import Gateway
from schemas.config import load_config


def _gateway(tmp_path, timeout_ms: int) -> Gateway:
    """A gateway whose control tail is never started: the test hands ``_on_control`` its records."""
    gateway = Gateway(load_config(env={}, data_dir=str(tmp_path), kafka={"delivery_timeout_ms": timeout_ms}))
    gateway.control = control_tail(gateway.config.kafka, Cluster(gateway.config.kafka, client_id="test"), gateway._on_control)
    return gateway


def test_a_fold_wait_ends_once_partition_0_is_folded_past_its_offset(tmp_path):
    gateway = _gateway(tmp_path, 5000)

    async def scenario() -> None:
        waiting = asyncio.ensure_future(gateway.folded(2))
        await asyncio.sleep(0.05)
        gateway._on_control([(0, None), (1, None)])  # skipped records (publishes, acks) still advance the fold
        await asyncio.sleep(0.05)
        assert not waiting.done()
        gateway._on_control([(2, None)])
        await asyncio.wait_for(waiting, 1)

    asyncio.run(scenario())


def test_a_fold_that_never_arrives_fails_with_the_offsets_it_waited_between(tmp_path):
    """The 503 a client then gets is logged with a reason an operator can act on, not an empty one."""
    gateway = _gateway(tmp_path, 100)

    async def scenario() -> None:
        gateway._on_control([(0, None)])
        await gateway.folded(7)

    with pytest.raises(TimeoutError, match=r"up to offset 0, not yet 7, after 0\.1 s"):
        asyncio.run(scenario())
