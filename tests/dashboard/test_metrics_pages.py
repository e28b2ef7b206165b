"""``/metrics`` of a real gateway after a known session, and of the dashboard aggregating it
(with a second, unreachable gateway and no streaming job: tables absent, not errors)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import pytest

from deploy.broker import free_port
from gateway.client import SMQPClient, SMQPError
from schemas.config import DashboardConfig
from tests.dashboard import promtext
from tests.dashboard.harness import DashboardThread, http_get
from tests.e2e.stack import GatewayThread, stack_config

pytestmark = pytest.mark.e2e

PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
FRAMES_IN = {"LOGIN": 1, "PASS": 1, "CREATE": 1, "PUBLISH": 3, "SUBSCRIBE": 1, "COUNT": 1, "UNKNOWN": 1,
             "NOOP": 1, "QUIT": 1}


async def known_session(address) -> None:
    client = await SMQPClient.open(*address)  # LOGIN + PASS
    await client.create_topic("/metrics/a")
    for i in range(3):
        await client.publish("/metrics/a", f"m{i}")
    await client.subscribe("/metrics/*")
    with pytest.raises(SMQPError) as missing:
        await client.count_topics("/nowhere")
    assert missing.value.code == 404
    with pytest.raises(SMQPError) as unknown:
        await client.command("FROB")
    assert unknown.value.code == 400
    await client.noop()
    await client.quit()


def scrape(url: str) -> dict[str, promtext.Family]:
    status, content_type, text = http_get(url)
    assert (status, content_type) == (200, PROMETHEUS), text
    return promtext.parse(text)


def test_gateway_and_dashboard_expose_the_session_counters(broker, tmp_path):
    status_port = free_port()
    config = stack_config(broker, tmp_path, status_port=status_port)
    gateway_url = f"http://127.0.0.1:{status_port}/metrics"
    dead_url = f"http://127.0.0.1:{free_port()}/metrics"
    config = replace(config, dashboard=DashboardConfig(port=free_port(), gateways=(gateway_url, dead_url),
                                                       refresh_s=60, scrape_timeout_s=2))
    with GatewayThread(config) as gateway:
        assert gateway.gateway.status_address == ("127.0.0.1", status_port)
        asyncio.run(known_session(gateway.address))
        deadline = time.monotonic() + 10
        while (families := scrape(gateway_url))["smqp_gateway_connections"].value() != 0:
            assert time.monotonic() < deadline, "the connection never closed"
            time.sleep(0.05)

        assert families["smqp_gateway_frames_in_total"].type == "counter"
        assert families["smqp_gateway_frames_in_total"].by("verb") == FRAMES_IN
        assert families["smqp_gateway_frames_out_total"].by("verb") == {"GREETING": 1, "REPLY": 11}
        assert families["smqp_gateway_replies_total"].by("code") == {"200": 9, "400": 1, "404": 1}
        assert families["smqp_gateway_errors_total"].by("code") == {"400": 1, "404": 1}
        assert families["smqp_gateway_connections_total"].value() == 1
        assert families["smqp_gateway_logins"].value() == 0
        assert families["smqp_gateway_notify_in_flight"].value() == 0
        assert families["smqp_gateway_ack_latency_seconds"].type == "histogram"
        assert families["smqp_gateway_ack_latency_seconds"].value("smqp_gateway_ack_latency_seconds_count") == 0
        assert families["smqp_gateway_info"].by("node_id") == {"0": 1}
        assert http_get(gateway_url.replace("/metrics", "/healthz"))[0] == 200
        assert http_get(gateway_url.replace("/metrics", "/nothing"))[0] == 404

        with DashboardThread(config) as dashboard:
            dashboard.refresh()
            families = scrape(dashboard.url + "metrics")
            assert families["smqp_dashboard_gateway_up"].by("gateway") == {gateway_url: 1, dead_url: 0}
            assert families["smqp_gateway_frames_in_total"].by("verb", gateway=gateway_url) == FRAMES_IN
            assert families["smqp_gateway_errors_total"].by("code", gateway=gateway_url) == {"400": 1, "404": 1}
            # no streaming job ran: every table is absent, and shown so
            assert families["smqp_dashboard_table_up"].by("table") == {
                "messages": 0, "deliveries": 0, "trash": 0, "metrics": 0}
            assert families["smqp_topic_messages"].samples == []

            status, content_type, text = http_get(dashboard.url + "api/status")
            assert (status, content_type) == (200, "application/json")
            summary = json.loads(text)
            assert [g["up"] for g in summary["gateways"]] == [True, False]
            assert summary["totals"]["frames_in"] == FRAMES_IN
            assert summary["totals"]["errors_total"] == 2
            assert all(t["available"] is False and t["error"] is None for t in summary["tables"].values())

            status, content_type, page = http_get(dashboard.url)
            assert (status, content_type) == (200, "text/html; charset=utf-8")
            assert "/api/status" in page and "__REFRESH_MS__" not in page
            assert http_get(dashboard.url + "nothing")[0] == 404
