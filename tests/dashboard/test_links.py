"""The dashboard's Links: a real link process status page (``federation.metrics.serve_metrics`` of a
``LinkMetrics`` the test bumps as the sessions would, on 127.0.0.1) and an unreachable one, scraped by
a real dashboard: its JSON, its ``/metrics`` and, in headless Chromium, its Links table.  No Kafka,
no streaming job: the tables are absent, which the rest of the page already shows."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import pytest

from deploy.broker import free_port
from federation.metrics import LinkMetrics, serve_metrics
from schemas.config import DashboardConfig, FederationConfig, GatewayConfig, LinkConfig, SMQPConfig
from tests.dashboard import promtext
from tests.dashboard.harness import DashboardThread, http_get
from tests.dashboard.test_dashboard_page import Figures, chromium

pytestmark = pytest.mark.e2e

A, PULL = "a.example", "pull:c.example:guest"


def bumped() -> LinkMetrics:
    """Farm B's link process after a while: its link to A logged in, 4 forwarded, 3 dropped (2 seen,
    1 looped), 2 NOTIFYs not yet appended, the last appended 1.5 s old, 3 failed connections before
    it got in, one pattern refused; a remote topic's pull at C still down after one failure."""
    metrics = LinkMetrics()
    link = metrics.state(A)
    link.up, link.received, link.settled, link.refused = True, 9, 7, 1
    link.appended(created=1_000_000, now=2_500_000)
    for _ in range(4):
        metrics.forwarded.inc(A)
    metrics.dropped.inc(A, "seen", amount=2)
    metrics.dropped.inc(A, "looped")
    metrics.connect_failures.inc(A, amount=3)
    metrics.state(PULL)
    metrics.connect_failures.inc(PULL)
    return metrics


def config_with(tmp_path, links: tuple[str, ...]) -> SMQPConfig:
    return replace(SMQPConfig(), data_dir=str(tmp_path / "data"),
                   dashboard=DashboardConfig(port=free_port(), links=links, refresh_s=60, scrape_timeout_s=2))


class LinkProcess:
    """A link process's status page on the dashboard's own event loop (a server like smqp-link's)."""

    def __init__(self, dashboard: DashboardThread, metrics: LinkMetrics, port: int):
        self.server = dashboard.call(serve_metrics(metrics, "127.0.0.1", port))
        self.dashboard = dashboard

    def close(self) -> None:
        async def close():
            self.server.close()
            await self.server.wait_closed()
        self.dashboard.call(close())


@contextlib.contextmanager
def scraping_a_link_process(tmp_path):
    """A dashboard configured with two link processes: one serving :func:`bumped`, one that is not
    there.  Yields (dashboard, its URL, the dead one's), after one refresh."""
    port = free_port()
    url, dead_url = f"http://127.0.0.1:{port}/metrics", f"http://127.0.0.1:{free_port()}/metrics"
    with DashboardThread(config_with(tmp_path, (url, dead_url))) as dashboard:
        process = LinkProcess(dashboard, bumped(), port)
        try:
            dashboard.refresh()
            yield dashboard, url, dead_url
        finally:
            process.close()


def test_the_dashboard_shows_and_reexports_each_links_figures(tmp_path):
    with scraping_a_link_process(tmp_path) as (dashboard, url, dead_url):
        status, content_type, text = http_get(dashboard.url + "api/status")
        _, _, prometheus = http_get(dashboard.url + "metrics")

    assert (status, content_type) == (200, "application/json")
    links = json.loads(text)["links"]
    assert (links["configured"], links["reachable"], links["up"], links["total"]) == (2, 1, 1, 2)
    assert (links["forwarded"], links["dropped"]) == (4, 3)
    rows = {row["link"]: row for row in links["rows"]}
    assert {key: rows[A][key] for key in ("process", "state", "lag", "lag_seconds", "forwarded", "dropped",
                                          "dropped_total", "connect_failures", "refused_patterns")} == {
        "process": url, "state": "up", "lag": 2, "lag_seconds": 1.5, "forwarded": 4,
        "dropped": {"seen": 2, "looped": 1}, "dropped_total": 3, "connect_failures": 3, "refused_patterns": 1}
    assert (rows[PULL]["state"], rows[PULL]["forwarded"], rows[PULL]["connect_failures"]) == ("down", 0, 1)
    assert rows[None]["process"] == dead_url and rows[None]["state"] == "unreachable" and rows[None]["error"]

    families = promtext.parse(prometheus)
    assert families["smqp_dashboard_link_process_up"].by("link_process") == {url: 1, dead_url: 0}
    assert families["smqp_link_up"].by("link", link_process=url) == {A: 1, PULL: 0}
    assert families["smqp_link_lag"].value(link=A, link_process=url) == 2
    assert families["smqp_link_lag_seconds"].value(link=A, link_process=url) == 1.5
    assert families["smqp_link_forwarded_total"].type == "counter"
    assert families["smqp_link_forwarded_total"].by("link", link_process=url) == {A: 4}
    assert families["smqp_link_dropped_total"].by("reason", link=A) == {"seen": 2, "looped": 1}
    assert families["smqp_link_connect_failures_total"].by("link") == {A: 3, PULL: 1}
    assert families["smqp_link_refused_patterns"].value(link=A) == 1


def test_without_link_processes_the_links_are_empty_and_nothing_else_changes(tmp_path):
    with DashboardThread(config_with(tmp_path, ())) as dashboard:
        summary = dashboard.refresh()
        _, _, prometheus = http_get(dashboard.url + "metrics")
    assert summary["links"] == {"processes": [], "rows": [], "configured": 0, "reachable": 0, "up": 0,
                                "total": 0, "forwarded": 0, "dropped": 0}
    families = promtext.parse(prometheus)
    assert families["smqp_dashboard_link_process_up"].samples == []
    assert not [name for name in families if name.startswith("smqp_link_")]
    assert families["smqp_dashboard_table_up"].by("table") == {"messages": 0, "deliveries": 0, "trash": 0,
                                                               "metrics": 0}


def test_a_configuration_with_links_and_a_status_port_scrapes_its_own_link_process():
    federation = FederationConfig(links=(LinkConfig(A, "10.0.0.5:7720"),), status_port=7723)
    gateway = GatewayConfig(host="0.0.0.0")
    assert DashboardConfig().link_urls(gateway, federation) == ("http://127.0.0.1:7723/metrics",)
    assert DashboardConfig().link_urls(GatewayConfig(host="10.0.0.9"), federation) == (
        "http://10.0.0.9:7723/metrics",)
    assert DashboardConfig().link_urls(gateway, replace(federation, status_port=0)) == ()  # no page to scrape
    assert DashboardConfig().link_urls(gateway, replace(federation, links=())) == ()  # smqp-link does not run
    assert DashboardConfig(links="http://x:1/metrics, http://y:2/metrics").link_urls(gateway, federation) == (
        "http://x:1/metrics", "http://y:2/metrics")  # SMQP_DASHBOARD_LINKS=url,url


def test_chromium_shows_the_links_table(tmp_path):
    with scraping_a_link_process(tmp_path) as (dashboard, url, dead_url):
        dom = chromium(dashboard.url, tmp_path / "profile", "--dump-dom")

    page = Figures(dom)
    assert page.figures["links-up"] == "links 1/2 up · 1 link process unreachable", dom[:3000]
    link = page.rows[("link", A)]
    assert (link["link"], link["state"], link["forwarded"]) == (A, "up", "4")
    assert (link["lag"], link["lag-seconds"]) == ("2", "1.5")
    assert (link["connect-failures"], link["refused-patterns"]) == ("3", "1")
    assert link["dropped"] == "looped 1 · seen 2"
    assert link["process"] == url.removeprefix("http://")
    assert (page.rows[("link", PULL)]["state"], page.rows[("link", PULL)]["forwarded"]) == ("down", "0")
    dead = page.rows[("link", dead_url)]
    assert dead["state"] == "unreachable" and dead["error"].startswith("link process unreachable")


def test_chromium_says_when_no_link_process_is_configured(tmp_path):
    with DashboardThread(config_with(tmp_path, ())) as dashboard:
        dashboard.refresh()
        dom = chromium(dashboard.url, tmp_path / "profile", "--dump-dom")
    page = Figures(dom)
    assert page.figures["links-up"] == "no links"
    assert "no link processes configured" in dom
    assert page.figures["gateways-up"] == "gateways 0/0 up"  # the rest of the page rendered
