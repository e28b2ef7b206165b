"""``smqp-dashboard``: the engine's health at a glance, in a browser and for Prometheus.

Serves, on ``[dashboard] host:port`` (standard library asyncio HTTP, no framework):

* ``/`` — a live page: throughput, latency, Kafka lag, queue depth per topic,
  pending and in-flight deliveries, Trash growth and errors; it polls
  ``/api/status`` every ``refresh_s`` and redraws itself (inline JS and SVG,
  nothing fetched from elsewhere);
* ``/api/status`` — the same figures as JSON;
* ``/metrics`` — the same figures in the Prometheus text format, plus every
  gateway's own counters re-exposed with a ``gateway`` label, and every link
  process's with a ``link_process`` label, for Grafana.

Where the figures come from:

* the gateways' status pages (``[dashboard] gateways``, or this
  configuration's gateway when its ``status_port`` is set), scraped every
  ``refresh_s``: connections, frames per verb, NOTIFYs in flight, ACK latency
  (NOTIFY written → the client's ACK, as the gateway that sent the NOTIFY timed
  it: since each gateway started, and over the last five minutes from the
  difference of two scrapes), errors per reply code;
* the link processes' status pages (``[dashboard] links``, or this
  configuration's ``smqp-link`` when it has links and a ``[federation]
  status_port``), scraped alike: per link its state, lag (in flight and in
  seconds), forwarded, dropped by reason, connect failures and refused
  patterns (:mod:`deploy.dashboard_links`);
* the job's Delta tables, read with delta-rs in a worker thread (never on the
  event loop): ``messages`` (per topic, last minute), ``deliveries`` (pending
  and acknowledged per topic), ``trash`` (per topic,
  when the table exists) and ``metrics`` (one row per micro-batch, written by
  the job's ``StreamingQueryListener``; see :mod:`schemas.metrics`).  A table
  the job has not created yet is shown as absent, not as an error.

Each table is opened once and brought up to date incrementally; what is
derived from it is recomputed only when its version changed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import time
from collections import deque
from dataclasses import replace
from importlib import resources

from deploy.dashboard_gateways import (
    RECENT_S,
    Scrape,
    ack_buckets,
    gateway_totals,
    recent_ack_latency,
    scrape,
    summarize_gateway,
)
from deploy.dashboard_links import link_summary
from deploy.dashboard_tables import DeltaTables, finite
from gateway.metrics import CONTENT_TYPE, ParsedFamily, Response, escape_label, format_value, serve_http
from schemas.config import SMQPConfig, load_config
from schemas.metrics import DURATION_PHASES

log = logging.getLogger("smqp.dashboard")


# --------------------------------------------------------------------------
# The dashboard


def page_html(refresh_s: float) -> str:
    """The page (``deploy/static/dashboard.html``, shipped as package data), polling every ``refresh_s``.

    A file rather than a string here, so that it reads, lints and diffs as the HTML and JavaScript it is."""
    page = resources.files("deploy").joinpath("static", "dashboard.html").read_text(encoding="utf-8")
    return page.replace("__REFRESH_MS__", str(int(refresh_s * 1000)))


class Dashboard:
    """Refreshes the figures every ``refresh_s`` and serves them (page, JSON, Prometheus)."""

    def __init__(self, config: SMQPConfig):
        self.config = config
        self.settings = config.dashboard
        self.gateway_urls = self.settings.gateway_urls(config.gateway)
        self.link_urls = self.settings.link_urls(config.gateway, config.federation)
        self.tables = DeltaTables(config, self.settings.history_batches)
        self._page_html = page_html(self.settings.refresh_s)
        self.status: dict | None = None
        self.scrapes: list[Scrape] = []
        self.link_scrapes: list[Scrape] = []
        self.history: deque = deque(maxlen=600)  # one point per refresh, for the charts
        self.ack_snapshots: deque = deque()  # (time, the gateways' ACK histogram) per refresh, RECENT_S of them
        self.server: asyncio.base_events.Server | None = None
        self._lock: asyncio.Lock | None = None
        self._task: asyncio.Task | None = None
        self._refresh_seconds = 0.0

    async def refresh(self) -> dict:
        """Read the tables (in a worker thread) and scrape the gateways and link processes, now."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            started = time.monotonic()
            timeout = self.settings.scrape_timeout_s
            tables, *scrapes = await asyncio.gather(
                asyncio.to_thread(self.tables.read),
                *(scrape(url, timeout) for url in (*self.gateway_urls, *self.link_urls)))
            scrapes, link_scrapes = scrapes[:len(self.gateway_urls)], scrapes[len(self.gateway_urls):]
            now = time.time()
            gateways = [summarize_gateway(s) for s in scrapes]
            totals = gateway_totals(gateways)
            self.ack_snapshots.append((now, ack_buckets(gateways)))
            totals["ack_latency_recent_s"] = recent_ack_latency(self.ack_snapshots)
            point = {"t": now, "pending": tables["deliveries"].get("pending"),
                     "trash": tables["trash"].get("total"), "errors": totals["errors_total"],
                     "published": totals["frames_in"].get("PUBLISH", 0), "in_flight": totals["notify_in_flight"]}
            previous = self.history[-1] if self.history else None
            rates = {}
            if previous and now > previous["t"] and totals["up"]:
                span = now - previous["t"]
                rates = {"publish_per_s": max(0.0, (point["published"] - previous["published"]) / span),
                         "errors_per_s": max(0.0, (point["errors"] - previous["errors"]) / span)}
            self.history.append(point)
            self.scrapes, self.link_scrapes = scrapes, link_scrapes
            self._refresh_seconds = time.monotonic() - started
            self.status = finite({
                "generated_at": now, "refresh_s": self.settings.refresh_s, "data_dir": self.config.data_dir,
                "gateways": [{k: v for k, v in g.items() if k != "ack_buckets"} for g in gateways],
                "totals": totals | rates,
                "links": link_summary(link_scrapes),
                "topics": _topic_rows(tables),
                "tables": tables,
                "trash_growth_per_min": self._growth("trash"),
                "history": list(self.history)[-120:],
            })
            return self.status

    def _growth(self, key: str, window: float = 300) -> float | None:
        """Change per minute of ``key`` over the last ``window`` seconds of history."""
        points = [p for p in self.history if p.get(key) is not None and p["t"] >= self.history[-1]["t"] - window]
        if len(points) < 2 or points[-1]["t"] <= points[0]["t"]:
            return None
        return (points[-1][key] - points[0][key]) * 60 / (points[-1]["t"] - points[0]["t"])

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # keep refreshing; the page shows the age of its figures
                log.exception("dashboard refresh failed")
            await asyncio.sleep(self.settings.refresh_s)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        self.server = await serve_http(self.settings.host, self.settings.port, {
            "/": self._page, "/index.html": self._page, "/api/status": self._json,
            "/metrics": self._metrics, "/healthz": self._health})

    @property
    def address(self) -> tuple[str, int]:
        return self.server.sockets[0].getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/"

    async def close(self) -> None:
        if self.server:
            self.server.close()
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _current(self) -> dict:
        return self.status if self.status is not None else await self.refresh()

    async def _page(self, query: str) -> Response:
        return Response(self._page_html, "text/html; charset=utf-8")

    async def _json(self, query: str) -> Response:
        return Response(json.dumps(await self._current(), separators=(",", ":")), "application/json")

    async def _metrics(self, query: str) -> Response:
        status = await self._current()
        return Response(render_prometheus(status, self.scrapes, self._refresh_seconds, self.link_scrapes),
                        CONTENT_TYPE)

    async def _health(self, query: str) -> Response:
        return Response("ok\n")


def _topic_rows(tables: dict) -> list[dict]:
    messages = tables["messages"].get("per_topic", {})
    deliveries = tables["deliveries"].get("per_topic", {})
    trash = tables["trash"].get("per_topic", {})
    rows = []
    for topic in sorted(set(messages) | set(deliveries) | set(trash)):
        statuses = deliveries.get(topic, {})
        rows.append({"topic": topic, "messages": messages.get(topic, 0), "pending": statuses.get("pending", 0),
                     "acked": statuses.get("acked", 0), "trash": trash.get(topic, 0)})
    return rows


# --------------------------------------------------------------------------
# Prometheus text


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help: str, samples) -> None:
        self.lines.append(f"# HELP {name} {help}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            if value is None:
                continue
            label_text = ",".join(f'{k}="{escape_label(str(v))}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{label_text}}} {format_value(value)}" if label_text
                              else f"{name} {format_value(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def reexport(self, scrapes: list[Scrape], label: str) -> None:
        """Every family of the pages scraped, each sample labelled ``label`` = the page it came from."""
        merged: dict[str, ParsedFamily] = {}
        for scraped in scrapes:
            for name, family in scraped.families.items():
                target = merged.setdefault(name, ParsedFamily(name, family.kind, family.help))
                target.samples += [(sample, {**labels, label: scraped.url}, value)
                                   for sample, labels, value in family.samples]
        for name, family in merged.items():
            self.lines.append(f"# HELP {name} " + family.help.replace("\\", "\\\\").replace("\n", "\\n"))
            self.lines.append(f"# TYPE {name} {family.kind}")
            for sample, labels, value in family.samples:
                label_text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
                self.lines.append(f"{sample}{{{label_text}}} {format_value(value)}")


def render_prometheus(status: dict, scrapes: list[Scrape], refresh_seconds: float,
                      link_scrapes: list[Scrape] = ()) -> str:
    """The dashboard's figures, each gateway's families with a ``gateway`` label, and each link
    process's (``smqp_link_*``) with a ``link_process`` label."""
    out = _Text()
    tables = status["tables"]
    out.family("smqp_dashboard_gateway_up", "gauge", "1 when the gateway's status page answered the last scrape.",
               [({"gateway": s.url}, 1 if s.up else 0) for s in scrapes])
    out.reexport(scrapes, "gateway")
    out.family("smqp_dashboard_link_process_up", "gauge",
               "1 when the link process's status page answered the last scrape.",
               [({"link_process": s.url}, 1 if s.up else 0) for s in link_scrapes])
    out.reexport(link_scrapes, "link_process")
    out.family("smqp_dashboard_table_up", "gauge", "1 when the Delta table exists and was read.",
               [({"table": name}, 1 if t.get("available") else 0) for name, t in tables.items()])
    out.family("smqp_dashboard_refresh_seconds", "gauge", "How long the last refresh took.",
               [({}, refresh_seconds)])
    out.family("smqp_topic_messages", "gauge", "Messages of the topic in the Delta messages table.",
               [({"topic": r["topic"]}, r["messages"]) for r in status["topics"]])
    out.family("smqp_topic_deliveries", "gauge", "Deliveries of the topic's messages, by status "
               "(pending: the queue depth, waiting for a subscriber's two-phase ACK).",
               [({"topic": r["topic"], "status": s}, r[s]) for r in status["topics"] for s in ("pending", "acked")])
    out.family("smqp_topic_trash_messages", "gauge", "Messages in the topic's Trash.",
               [({"topic": r["topic"]}, r["trash"]) for r in status["topics"]] if tables["trash"].get("available")
               else [])
    out.family("smqp_messages_accepted_last_minute", "gauge", "Messages accepted in the last 60 s (messages table).",
               [({}, tables["messages"].get("last_minute"))] if tables["messages"].get("available") else [])
    latency = status["totals"].get("ack_latency_recent_s", {})
    out.family("smqp_delivery_ack_latency_seconds", "gauge",
               f"NOTIFY written -> the client's ACK (the gateways' own timing), over the last {RECENT_S} s.",
               [({"quantile": q}, latency.get(k)) for q, k in (("0.5", "p50"), ("0.99", "p99"))])
    batches = tables["metrics"].get("batches") or []
    latest: dict[str, dict] = {}
    for batch in batches:
        latest[batch.get("query_name") or ""] = batch
    def per_query(column: str, divisor: float = 1) -> list:  # noqa: E306 - the last batch of each query
        return [({"query": q}, b[column] / divisor if b.get(column) is not None else None)
                for q, b in latest.items()]
    out.family("smqp_streaming_last_batch_id", "gauge", "Id of the last micro-batch recorded.", per_query("batch_id"))
    out.family("smqp_streaming_last_batch_timestamp_seconds", "gauge", "When the last micro-batch started.",
               per_query("timestamp"))
    out.family("smqp_streaming_input_rows", "gauge", "Input rows of the last micro-batch.",
               per_query("num_input_rows"))
    out.family("smqp_streaming_input_rows_per_second", "gauge", "Arrival rate at the last micro-batch.",
               per_query("input_rows_per_second"))
    out.family("smqp_streaming_processed_rows_per_second", "gauge", "Processing rate of the last micro-batch.",
               per_query("processed_rows_per_second"))
    out.family("smqp_streaming_batch_duration_seconds", "gauge", "Duration of the last micro-batch.",
               per_query("batch_duration_ms", 1000))
    out.family("smqp_streaming_phase_duration_seconds", "gauge", "Phases of the last micro-batch (Spark durationMs).",
               [({"query": q, "phase": phase}, b[column] / 1e3 if b.get(column) is not None else None)
                for q, b in latest.items() for phase, column in DURATION_PHASES.items()])
    out.family("smqp_streaming_kafka_lag", "gauge", "Kafka records not yet consumed after the last micro-batch.",
               per_query("kafka_lag"))
    out.family("smqp_streaming_partition_lag", "gauge", "Kafka lag per source partition after the last micro-batch.",
               [({"query": q, "source": p.get("source") or "", "partition": p.get("partition")}, p.get("lag"))
                for q, b in latest.items() for p in b.get("partitions") or ()])
    return out.text()


# --------------------------------------------------------------------------
# Command line


async def serve(config: SMQPConfig) -> None:
    dashboard = Dashboard(config)
    await dashboard.start()
    print(f"SMQP dashboard on {dashboard.url}  (Prometheus: {dashboard.url}metrics; "
          f"gateways: {', '.join(dashboard.gateway_urls) or 'none configured'}; "
          f"link processes: {', '.join(dashboard.link_urls) or 'none configured'})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await dashboard.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="smqp-dashboard",
        description="Serve the live ops dashboard (/) and Prometheus metrics (/metrics) from the gateways' "
                    "and link processes' status pages and the job's Delta tables.",
    )
    parser.add_argument("--config", help="TOML configuration file (default: $SMQP_CONFIG, else built-in defaults)")
    parser.add_argument("--host", help="listen address (overrides [dashboard] host)")
    parser.add_argument("--port", type=int, help="listen port (overrides [dashboard] port)")
    parser.add_argument("--gateway", action="append", metavar="URL",
                        help="a gateway status page, e.g. http://127.0.0.1:7721/metrics (repeatable; "
                             "overrides [dashboard] gateways)")
    parser.add_argument("--link", action="append", metavar="URL",
                        help="a link process's status page (smqp-link's [federation] status_port), e.g. "
                             "http://127.0.0.1:7723/metrics (repeatable; overrides [dashboard] links)")
    parser.add_argument("--data-dir", help="where the Delta tables live (overrides data_dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config(args.config)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if args.gateway:
        overrides["gateways"] = tuple(args.gateway)
    if args.link:
        overrides["links"] = tuple(args.link)
    config = replace(config, dashboard=replace(config.dashboard, **overrides))
    if args.data_dir:
        config = replace(config, data_dir=args.data_dir)
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
