"""The dashboard page, rendered by headless Chromium against a running engine.

A real broker, the streaming job (with its metrics listener), a gateway with
its status page and the dashboard.  Alice publishes 5 messages to
/dash/alpha and 3 to /dash/beta; bob (subscribed to /dash/*) acknowledges 4
and holds the 5th NOTIFY unacknowledged; carol (subscribed to /dash/beta)
has quit.  Once the job has recorded the 4 ACKs it is stopped, so the tables
hold still, and Chromium loads the page: the figures it shows must be those
of the deliveries, messages and metrics tables and of the gateway's
counters.  The screenshot is saved as ``dash.png`` in the test's tmp_path.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deploy.broker import free_port
from gateway.accounts import hash_password
from gateway.client import SMQPClient, SMQPError
from gateway.metrics import ACK_LATENCY_BUCKETS
from schemas.config import DashboardConfig
from tests.dashboard import promtext
from tests.dashboard.harness import DashboardThread, http_get
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, stack_config

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ACCOUNTS = {name: hash_password(f"{name}-pw", iterations=1000) for name in ("alice", "bob", "carol")}


def chromium(url: str, profile: Path, *mode: str) -> str:
    """Load ``url`` headless, let its script run for 5 s of virtual time; stdout."""
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed (.ci/run installs it: apt-get install -y chromium)")
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,900",
         "--virtual-time-budget=5000", *mode, url],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


class Figures(HTMLParser):
    """The rendered figures: ``data-figure`` elements, and the rows of the page's tables."""

    def __init__(self, html: str):
        super().__init__()
        self.figures: dict[str, str] = {}
        self.values: dict[str, str] = {}
        self.rows: dict[tuple[str, str], dict[str, str]] = {}  # (kind, key) -> {data-col: text}
        self._open: list[tuple[str, object]] = []  # (tag, what its text goes to)
        self._row: dict[str, str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        target = None
        if "data-figure" in attrs:
            target = ("figure", attrs["data-figure"])
            self.figures[attrs["data-figure"]] = ""
            self.values[attrs["data-figure"]] = attrs.get("data-value", "")
        elif tag == "tr":
            for kind in ("data-topic", "data-batch", "data-code", "data-gateway", "data-link"):
                if kind in attrs:
                    self._row = self.rows[(kind[5:], attrs[kind])] = {}
        elif tag == "td" and self._row is not None and "data-col" in attrs:
            target = ("cell", attrs["data-col"])
            self._row[attrs["data-col"]] = ""
        self._open.append((tag, target))

    def handle_endtag(self, tag):
        while self._open:
            open_tag, _ = self._open.pop()
            if open_tag == tag:
                break
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        for _, target in reversed(self._open):
            if target is None:
                continue
            kind, name = target
            if kind == "figure":
                self.figures[name] += data
            else:
                self._row[name] += data
            break


def number(text: str) -> float:
    return float(text.replace(",", ""))


def shown(value, digits: int = 0) -> str:
    """How the page formats a number (en-US grouping, fixed digits)."""
    return f"{value:,.{digits}f}"


def wait_for(predicate, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = predicate()
        except Exception:  # a table not created yet
            result = None
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def table(config, name: str) -> list[dict]:
    return DeltaTable(config.table_path(name)).to_pyarrow_table().to_pylist()


def settled_metrics(config) -> list[dict]:
    """The metrics table once no commit has come for a second (the recorder flushes at stop)."""
    def still():
        before = DeltaTable(config.table_path("metrics")).version()
        time.sleep(1.0)
        return DeltaTable(config.table_path("metrics")).version() == before
    wait_for(still, "the metrics table to settle", 60)
    return table(config, "metrics")


async def drive(config, address) -> tuple[SMQPClient, float]:
    """The scenario; returns bob's connection, holding one NOTIFY unacknowledged, and a time
    before the last ACK was appended (the micro-batch that routes it starts later)."""
    await create_smqp_topics(address, "/dash/alpha", "/dash/beta")
    bob = await SMQPClient.open(*address, "bob", "bob-pw")
    assert await bob.subscribe("/dash/*") == ["/dash/alpha", "/dash/beta"]
    async with await SMQPClient.open(*address, "carol", "carol-pw") as carol:
        await carol.subscribe("/dash/beta")
        await carol.quit()
    async with await SMQPClient.open(*address, "alice", "alice-pw") as alice:
        for i in range(5):
            await alice.publish("/dash/alpha", f"alpha {i}")
        for i in range(3):
            await alice.publish("/dash/beta", f"beta {i}")
        with pytest.raises(SMQPError):
            await alice.count_topics("/dash/nowhere")  # one 404
        await alice.quit()
    for _ in range(4):
        note = await bob.next_notification(120)
        before_ack = time.time()
        await note.ack()
    await bob.next_notification(120)  # the 5th: left unacknowledged, in flight
    return bob, before_ack


def test_dashboard_in_chromium_shows_the_tables_figures(broker, spark, tmp_path):
    status_port = free_port()
    config = stack_config(broker, tmp_path, accounts=ACCOUNTS, status_port=status_port)
    config = replace(config, dashboard=DashboardConfig(
        port=free_port(), gateways=(f"http://127.0.0.1:{status_port}/metrics",), refresh_s=1.0))
    screenshot = tmp_path / "dash.png"
    session: dict[str, float] = {}  # the scenario's wall time: no latency it measured can exceed it

    with GatewayThread(config) as gateway:
        router = Router(spark, config).start()
        try:
            async def scenario() -> tuple[str, str]:
                started = time.time()
                bob, before_ack = await drive(config, gateway.address)
                session["wall_s"] = time.time() - started
                try:
                    await asyncio.to_thread(wait_for, lambda: sum(
                        d["status"] == "acked" for d in table(config, "deliveries")) == 4
                        and len(table(config, "deliveries")) == 11, "4 acked of 11 deliveries")
                    # and the listener recorded the micro-batch that routed the last ACK (it buffers
                    # rows for a few seconds): then no batch is left to run, and stopping loses none
                    await asyncio.to_thread(wait_for, lambda: any(
                        b["timestamp"].timestamp() >= before_ack - 0.01 for b in table(config, "metrics")),
                        "the metrics row of the last ACK's micro-batch", 60)
                    router.stop()
                    await asyncio.to_thread(settled_metrics, config)
                    with DashboardThread(config) as dashboard:
                        await asyncio.to_thread(dashboard.refresh)
                        dom = await asyncio.to_thread(chromium, dashboard.url, tmp_path / "profile-dom", "--dump-dom")
                        await asyncio.to_thread(chromium, dashboard.url, tmp_path / "profile-shot",
                                                f"--screenshot={screenshot}")
                        _, _, prometheus = await asyncio.to_thread(http_get, dashboard.url + "metrics")
                    return dom, prometheus
                finally:
                    await bob.close()
            dom, prometheus = asyncio.run(scenario())
        finally:
            router.stop()

    page = Figures(dom)
    figures = page.figures
    assert figures["gateways-up"] == "gateways 1/1 up", dom[:3000]

    # deliveries and messages tables
    deliveries = table(config, "deliveries")
    messages = table(config, "messages")
    pending = [d for d in deliveries if d["status"] == "pending"]
    assert figures["pending"] == shown(len(pending)) == "7"
    assert figures["acked"] == shown(len(deliveries) - len(pending)) == "4"
    assert figures["messages"] == shown(len(messages)) == "8"
    for topic in ("/dash/alpha", "/dash/beta"):
        row = page.rows[("topic", topic)]
        assert number(row["messages"]) == sum(m["topic"] == topic for m in messages)
        assert number(row["pending"]) == sum(d["topic"] == topic for d in pending)
        assert number(row["acked"]) == sum(d["topic"] == topic and d["status"] == "acked" for d in deliveries)
        assert number(row["trash"]) == 0
    # the job creates the (empty) trash table when a SUBSCRIBE looks for stored messages to hand a late subscriber
    assert figures["trash"] == shown(len(table(config, "trash"))) == "0"

    # the metrics table: the latest micro-batch, and the rows of the batch list
    batches = sorted(settled_metrics(config), key=lambda b: (b["timestamp"], b["batch_id"]))
    assert batches, "the metrics listener recorded no micro-batch"
    latest = batches[-1]
    assert figures["batch-id"] == shown(latest["batch_id"])
    assert figures["batch-rows"] == shown(latest["num_input_rows"])
    assert figures["batch-duration"] == shown(latest["batch_duration_ms"])
    assert number(page.values["processed-rate"]) == pytest.approx(latest["processed_rows_per_second"])
    assert number(figures["processed-rate"]) == pytest.approx(latest["processed_rows_per_second"], abs=0.051)
    assert number(page.values["input-rate"]) == pytest.approx(latest["input_rows_per_second"])
    if latest["kafka_lag"] is None:
        assert figures["lag"] == "—"
    else:
        assert figures["lag"] == shown(latest["kafka_lag"])
    listed = {int(number(key)): row for (kind, key), row in page.rows.items() if kind == "batch"}
    assert 1 <= len(listed) <= 8
    by_id = {b["batch_id"]: b for b in batches}
    for batch_id, row in listed.items():
        recorded = by_id[batch_id]
        assert number(row["num_input_rows"]) == recorded["num_input_rows"]
        assert number(row["batch_duration_ms"]) == recorded["batch_duration_ms"]
        assert number(row["processed_rows_per_second"]) == pytest.approx(recorded["processed_rows_per_second"],
                                                                        abs=0.051)
    assert sum(b["num_input_rows"] for b in batches) >= 8 + 4  # the PUBs and ACKs (one batch may read them all)

    # the gateway's counters
    assert figures["in-flight"] == "1"  # bob's fifth NOTIFY
    assert figures["published"] == "8"
    assert figures["ack-count"] == "4"
    assert figures["errors"] == "1"
    assert page.rows[("code", "404")]["count"] == "1"
    assert figures["connections"] == figures["logins"] == "1"  # bob, still holding his fifth NOTIFY
    assert figures["pending"] == shown(number(figures["pending"]))  # (a number, not "—")
    assert 0 <= number(figures["messages-minute"]) <= 8
    # bob's deliveries not yet acknowledged: one in flight, the rest queued behind it (carol's wait offline)
    assert number(figures["in-flight"]) + number(figures["queued"]) == 4
    assert number(figures["frames-in"]) >= 8 + 4  # at least the PUBs and the ACKs
    if latest["add_batch_ms"] is not None:
        assert figures["add-batch"] == shown(latest["add_batch_ms"])
    for rate in ("publish-rate", "error-rate", "trash-growth"):  # "—" until two refreshes
        assert figures[rate] == "—" or number(figures[rate]) >= 0, (rate, figures[rate])

    # every latency shown: measured from the NOTIFY bob got to his ACK, so never negative, and
    # never longer than the session that made it (the gateway routes early: the job's Deliver
    # record of a message may come after its ACK). A quantile read from the gateways' histogram is
    # interpolated within its bucket, so "never longer" holds up to the bucket the session ends in.
    wall_ms = session["wall_s"] * 1000
    bound_ms = 1000 * min(b for b in ACK_LATENCY_BUCKETS if 1000 * b >= wall_ms)
    for name in ("ack-p50", "ack-p99", "delivery-p50", "delivery-p99"):
        assert figures[name] != "—", f"{name} not shown"
        assert 0 <= number(page.values[name]) <= bound_ms, f"{name} = {figures[name]} ms (session {wall_ms:.0f} ms)"
    assert number(page.values["delivery-p50"]) <= number(page.values["delivery-p99"])

    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000

    # the same figures on the dashboard's /metrics
    families = promtext.parse(prometheus)
    for topic in ("/dash/alpha", "/dash/beta"):
        assert families["smqp_topic_deliveries"].value(topic=topic, status="pending") == sum(
            d["topic"] == topic for d in pending)
        assert families["smqp_topic_messages"].value(topic=topic) == sum(m["topic"] == topic for m in messages)
    assert families["smqp_streaming_last_batch_id"].value(query=config.streaming.query_name) == latest["batch_id"]
    assert families["smqp_streaming_batch_duration_seconds"].value() == pytest.approx(
        latest["batch_duration_ms"] / 1000)
    assert families["smqp_gateway_notify_in_flight"].value() == 1
    assert families["smqp_gateway_ack_latency_seconds"].value("smqp_gateway_ack_latency_seconds_count") == 4
    assert families["smqp_dashboard_table_up"].by("table") == {"messages": 1, "deliveries": 1, "trash": 1,
                                                               "metrics": 1}
