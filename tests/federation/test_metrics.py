"""The link process's ``/metrics``: its lag in time, ``smqp_link_lag_seconds``, set by what the
forwarder appends (the forwarding itself runs for real in test_link / test_process)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from federation.forwarder import Forwarder
from federation.metrics import LinkMetrics
from federation.seen import Seen
from gateway.client import Notification
from gateway.metrics import parse
from gateway.registry import Registry
from schemas.config import GatewayConfig, SMQPConfig
from schemas.events import Publish, decode
from schemas.timefmt import format_micros

A = "a.example"


class Appended:
    """Stands for this farm's commands topic: keeps what is appended, as Kafka would."""

    def __init__(self):
        self.records: list[Publish] = []

    async def append(self, key: bytes, value: bytes) -> None:
        self.records.append(decode(value))


def lag_seconds(metrics: LinkMetrics) -> dict[str, float]:
    family = parse(metrics.render())["smqp_link_lag_seconds"]
    return {labels["link"]: value for _, labels, value in family.samples}


def note(smuid: str, created_ago_s: float) -> Notification:
    created = format_micros(time.time_ns() // 1000 - int(created_ago_s * 1_000_000))
    return Notification("MESSAGE", "/news/x", [("Created", created), ("Smuid", smuid), ("Depth", "1")])


def forwarder() -> tuple[Forwarder, LinkMetrics, Appended]:
    config = replace(SMQPConfig(), gateway=GatewayConfig(server_host="b.example"))
    registry = Registry(is_account=lambda account: False, server_timeout=config.gateway.default_timeout)
    metrics, commands = LinkMetrics(), Appended()
    return Forwarder(config, commands, Seen(), registry, metrics), metrics, commands


def test_the_lag_in_seconds_is_the_age_of_the_last_message_appended():
    forwarding, metrics, commands = forwarder()
    metrics.state(A)  # the session exists, logged in or not: nothing appended yet
    assert lag_seconds(metrics) == {A: 0}

    async def scenario() -> None:
        await forwarding.forward(A, A, note("a.example/1", created_ago_s=7.5))
        assert lag_seconds(metrics)[A] == pytest.approx(7.5, abs=1.0)
        await forwarding.forward(A, A, note("a.example/2", created_ago_s=0.2))
        assert lag_seconds(metrics)[A] == pytest.approx(0.2, abs=1.0) and lag_seconds(metrics)[A] < 7
        # a message dropped (already here) is not appended: the lag stays that of the last one appended
        await forwarding.forward(A, A, note("a.example/1", created_ago_s=60))
        assert lag_seconds(metrics)[A] < 7

    asyncio.run(scenario())
    assert [p.origin for p in commands.records] == ["a.example/1", "a.example/2"]
    assert parse(metrics.render())["smqp_link_forwarded_total"].samples[0][2] == 2


def test_a_peer_clock_ahead_of_this_one_gives_no_negative_lag():
    forwarding, metrics, _ = forwarder()
    asyncio.run(forwarding.forward(A, A, note("a.example/1", created_ago_s=-30)))
    assert lag_seconds(metrics) == {A: 0}


def test_the_lag_in_flight_is_still_served_beside_it():
    metrics = LinkMetrics()
    state = metrics.state(A)
    state.received, state.settled = 3, 1
    families = parse(metrics.render())
    assert families["smqp_link_lag"].samples[0][1:] == ({"link": A}, 2)
    assert families["smqp_link_lag_seconds"].kind == "gauge"
