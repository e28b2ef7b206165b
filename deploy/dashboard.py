"""``smqp-dashboard``: the engine's health at a glance, in a browser and for Prometheus.

Serves, on ``[dashboard] host:port`` (standard library asyncio HTTP, no framework):

* ``/`` — a live page: throughput, latency, Kafka lag, queue depth per topic,
  pending and in-flight deliveries, Trash growth and errors; it polls
  ``/api/status`` every ``refresh_s`` and redraws itself (inline JS and SVG,
  nothing fetched from elsewhere);
* ``/api/status`` — the same figures as JSON;
* ``/metrics`` — the same figures in the Prometheus text format, plus every
  gateway's own counters re-exposed with a ``gateway`` label, for Grafana.

Where the figures come from:

* the gateways' status pages (``[dashboard] gateways``, or this
  configuration's gateway when its ``status_port`` is set), scraped every
  ``refresh_s``: connections, frames per verb, NOTIFYs in flight, ACK latency
  (NOTIFY written → the client's ACK, as the gateway that sent the NOTIFY timed
  it: since each gateway started, and over the last five minutes from the
  difference of two scrapes), errors per reply code;
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
import math
import signal
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime
from importlib import resources
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from gateway.metrics import (
    CONTENT_TYPE,
    ParsedFamily,
    Response,
    escape_label,
    format_value,
    histogram_quantile,
    parse,
    serve_http,
)
from schemas.config import SMQPConfig, load_config

log = logging.getLogger("smqp.dashboard")

try:  # the metrics table's columns, from the one definition of tables
    from schemas.metrics import DURATION_PHASES, METRICS_TABLE

    METRICS_COLUMNS = tuple(f.name for f in METRICS_TABLE.fields)
except ImportError:  # pragma: no cover - a tree without the streaming metrics recorder
    DURATION_PHASES, METRICS_COLUMNS = {}, ()

#: The metrics-table columns the dashboard shows (those present in the table are read).
BATCH_COLUMNS = ("query_name", "run_id", "batch_id", "timestamp", "num_input_rows", "input_rows_per_second",
                 "processed_rows_per_second", "batch_duration_ms", *DURATION_PHASES.values(), "kafka_lag",
                 "state_rows_total", "partitions")
RECENT_S = 300  # window of the "recent" figures (ACK latency, per-minute rates)


def _finite(value: Any) -> Any:
    """JSON has no NaN/Infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _micros(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A timestamp column as int64 microseconds since the epoch (nulls kept)."""
    if pa.types.is_timestamp(column.type) and column.type.unit != "us":
        column = pc.cast(column, pa.timestamp("us", tz=column.type.tz))
    return pc.cast(column, pa.int64())


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    if len(column) == 0:
        return {}
    counted = pc.value_counts(column)
    return {v.as_py(): c.as_py() for v, c in zip(counted.field("values"), counted.field("counts"))
            if v.as_py() is not None}


# --------------------------------------------------------------------------
# The Delta tables


class PerFile:
    """Something derived from each data file of a table, kept per file path.

    After a new commit only the files it added are read; the parts of files
    it removed (a MERGE rewriting them, a compaction) are dropped.  So a
    growing history costs its new rows, not its whole size, at each refresh.
    """

    def __init__(self, columns: list[str], derive):
        self.columns = columns
        self.derive = derive  # pa.Table (the file's rows, ``columns``) -> part
        self.parts: dict[str, Any] = {}

    def update(self, table: DeltaTable, only: set[str] | None = None) -> list:
        """The parts of the table's current files (of ``only`` those, when given)."""
        dataset = table.to_pyarrow_dataset()
        fragments = {f.path: f for f in dataset.get_fragments() if only is None or f.path in only}
        for gone in set(self.parts) - set(fragments):
            del self.parts[gone]
        columns = [c for c in self.columns if c in dataset.schema.names]
        for path, fragment in fragments.items():
            if path not in self.parts:
                one = ds.FileSystemDataset([fragment], dataset.schema, dataset.format, dataset.filesystem)
                self.parts[path] = self.derive(one.to_table(columns=columns))
        return list(self.parts.values())


def _messages_part(rows: pa.Table) -> dict:
    accepted = _micros(rows.column("accepted_at"))
    since = int((time.time() - RECENT_S) * 1e6)
    return {"total": rows.num_rows, "per_topic": _counts(rows.column("topic")),
            "recent_accepted": pc.filter(accepted, pc.fill_null(pc.greater_equal(accepted, since), False))}


def _deliveries_part(rows: pa.Table) -> dict:
    per_topic: dict[str, dict[str, int]] = {}
    if rows.num_rows:
        grouped = rows.group_by(["topic", "status"]).aggregate([("status", "count")])
        for topic, status, count in zip(*(grouped.column(c).to_pylist() for c in ("topic", "status", "status_count"))):
            per_topic.setdefault(topic, {})[status] = count
    return {"per_topic": per_topic}


def _trash_part(rows: pa.Table) -> dict:
    return {"total": rows.num_rows, "per_topic": _counts(rows.column("topic")) if "topic" in rows.column_names else {}}


def _sum_counts(parts: list[dict], key: str) -> dict:
    total: dict = {}
    for part in parts:
        for name, count in part[key].items():
            if isinstance(count, dict):
                inner = total.setdefault(name, {})
                for status, n in count.items():
                    inner[status] = inner.get(status, 0) + n
            else:
                total[name] = total.get(name, 0) + count
    return total


class DeltaTables:
    """The job's tables by name, each opened once and updated incrementally.

    Not thread-safe: one :meth:`read` at a time (the dashboard holds a lock).
    """

    def __init__(self, config: SMQPConfig, history_batches: int = 120):
        self.config = config
        self.history_batches = history_batches
        self._tables: dict[str, DeltaTable] = {}
        self._derived: dict[str, tuple[int, dict]] = {}  # name -> (version, what was derived from it)
        self._files = {
            "messages": PerFile(["topic", "accepted_at"], _messages_part),
            "deliveries": PerFile(["topic", "status"], _deliveries_part),
            "trash": PerFile(["topic"], _trash_part),
            "metrics": PerFile(list(BATCH_COLUMNS), lambda rows: rows),
        }

    def _open(self, name: str) -> DeltaTable | None:
        table = self._tables.get(name)
        if table is None:
            try:
                table = self._tables[name] = DeltaTable(self.config.table_path(name))
            except TableNotFoundError:
                return None
        else:
            table.update_incremental()
        return table

    def _derive(self, name: str, derive) -> dict:
        """``derive(table)`` for the table's current version, cached until the version changes."""
        try:
            table = self._open(name)
            if table is None:
                return {"available": False, "error": None}
            version = table.version()
            cached = self._derived.get(name)
            if cached is None or cached[0] != version:
                cached = self._derived[name] = (version, {"available": True, "error": None, "version": version,
                                                          **derive(table)})
            return cached[1]
        except Exception as error:  # unreadable: say so, keep serving the rest
            log.warning("cannot read table %s: %s", name, error)
            self._tables.pop(name, None)
            return {"available": False, "error": str(error)}

    def read(self, now: float | None = None) -> dict:
        """Everything the dashboard shows from Delta, as plain data."""
        now = time.time() if now is None else now
        messages = self._derive("messages", self._messages)
        deliveries = self._derive("deliveries", self._deliveries)
        trash = self._derive("trash", self._trash)
        metrics = self._derive("metrics", self._metrics)
        minute = int((now - 60) * 1e6)
        last_minute = sum(pc.sum(pc.greater_equal(a, minute)).as_py() or 0
                          for a in messages.get("recent_accepted", ()))
        return {
            "messages": {k: v for k, v in messages.items() if k != "recent_accepted"} | {"last_minute": last_minute},
            "deliveries": deliveries,
            "trash": trash,
            "metrics": metrics,
        }

    def _messages(self, table: DeltaTable) -> dict:
        parts = self._files["messages"].update(table)
        return {"total": sum(p["total"] for p in parts), "per_topic": _sum_counts(parts, "per_topic"),
                "recent_accepted": [p["recent_accepted"] for p in parts if len(p["recent_accepted"])]}

    def _deliveries(self, table: DeltaTable) -> dict:
        parts = self._files["deliveries"].update(table)
        per_topic = _sum_counts(parts, "per_topic")
        statuses: dict[str, int] = {}
        for counts in per_topic.values():
            for status, n in counts.items():
                statuses[status] = statuses.get(status, 0) + n
        return {"total": sum(statuses.values()), "pending": statuses.get("pending", 0),
                "acked": statuses.get("acked", 0), "by_status": statuses, "per_topic": per_topic}

    def _trash(self, table: DeltaTable) -> dict:
        parts = self._files["trash"].update(table)
        return {"total": sum(p["total"] for p in parts), "per_topic": _sum_counts(parts, "per_topic")}

    def _metrics(self, table: DeltaTable) -> dict:
        """The last ``history_batches`` micro-batches, oldest first."""
        present = set(table.schema().to_arrow().names)
        order = "timestamp" if "timestamp" in present else None
        parts = self._files["metrics"].update(table, only=self._newest_files(table, order))
        rows = pa.concat_tables(parts, promote_options="permissive") if parts else None
        if rows is None or rows.num_rows == 0:
            return {"batches": [], "latest": None}
        if order:
            keys = [(order, "ascending")] + ([("batch_id", "ascending")] if "batch_id" in rows.column_names else [])
            rows = rows.sort_by(keys)
        rows = rows.slice(max(0, rows.num_rows - self.history_batches))
        batches = rows.to_pylist()
        for batch in batches:
            for key, value in list(batch.items()):
                if isinstance(value, datetime):
                    batch[key] = value.timestamp()
        return {"batches": batches, "latest": batches[-1]}

    def _newest_files(self, table: DeltaTable, order: str | None) -> set[str] | None:
        """The files that can hold the newest ``history_batches`` rows by ``order`` (from the log's
        file statistics); None (every file) when the statistics cannot tell."""
        if not order:
            return None
        files = pa.table(table.get_add_actions(flatten=True))
        low, high = f"min.{order}", f"max.{order}"
        if not files.num_rows or high not in files.column_names or files.column(low).null_count:
            return None
        files = files.sort_by([(high, "descending")])
        paths, low_values, high_values = (files.column(c).to_pylist() for c in ("path", low, high))
        records = files.column("num_records").to_pylist()
        chosen: set[str] = set()
        taken, cutoff = 0, None
        for path, first, last, count in zip(paths, low_values, high_values, records):
            if taken >= self.history_batches and last < cutoff:
                break  # every row of this and later files is older than the rows already taken
            chosen.add(path)
            taken += count or 0
            cutoff = first if cutoff is None else min(cutoff, first)
        return chosen


# --------------------------------------------------------------------------
# The gateways


@dataclass
class Scrape:
    url: str
    families: dict[str, ParsedFamily]
    error: str | None = None
    seconds: float = 0.0

    @property
    def up(self) -> bool:
        return self.error is None


def _fetch(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - configured status URLs
        return response.read().decode("utf-8")


async def scrape(url: str, timeout: float) -> Scrape:
    started = time.monotonic()
    try:
        text = await asyncio.wait_for(asyncio.to_thread(_fetch, url, timeout), timeout + 1)
        return Scrape(url, parse(text), seconds=time.monotonic() - started)
    except Exception as error:  # down, slow or not a metrics page: shown as down
        return Scrape(url, {}, error=str(error) or type(error).__name__, seconds=time.monotonic() - started)


def _by_label(families: dict[str, ParsedFamily], name: str, label: str) -> dict[str, float]:
    family = families.get(name)
    out: dict[str, float] = {}
    for _, labels, value in family.samples if family else ():
        out[labels.get(label, "")] = out.get(labels.get(label, ""), 0) + value
    return out


def _scalar(families: dict[str, ParsedFamily], name: str) -> float | None:
    family = families.get(name)
    return sum(v for _, _, v in family.samples) if family and family.samples else None


def _sample(families: dict[str, ParsedFamily], family: str, sample: str) -> float:
    """Sum of the samples named ``sample`` in ``family`` (a histogram's ``_sum`` / ``_count``)."""
    found = families.get(family)
    return sum(v for name, _, v in found.samples if name == sample) if found else 0


def _buckets(families: dict[str, ParsedFamily], name: str) -> dict[float, float]:
    family = families.get(name)
    out: dict[float, float] = {}
    for sample, labels, value in family.samples if family else ():
        if sample == f"{name}_bucket":
            bound = float(labels["le"])
            out[bound] = out.get(bound, 0) + value
    return out


def summarize_gateway(scraped: Scrape) -> dict:
    f = scraped.families
    return {
        "url": scraped.url, "up": scraped.up, "error": scraped.error, "scrape_s": scraped.seconds,
        "connections": _scalar(f, "smqp_gateway_connections"),
        "logins": _scalar(f, "smqp_gateway_logins"),
        "notify_in_flight": _scalar(f, "smqp_gateway_notify_in_flight"),
        "notify_queued": _scalar(f, "smqp_gateway_notify_queued"),
        "frames_in": _by_label(f, "smqp_gateway_frames_in_total", "verb"),
        "frames_out": _by_label(f, "smqp_gateway_frames_out_total", "verb"),
        "errors": _by_label(f, "smqp_gateway_errors_total", "code"),
        "ack_buckets": _buckets(f, "smqp_gateway_ack_latency_seconds"),
        "ack_count": _sample(f, "smqp_gateway_ack_latency_seconds", "smqp_gateway_ack_latency_seconds_count"),
        "ack_sum": _sample(f, "smqp_gateway_ack_latency_seconds", "smqp_gateway_ack_latency_seconds_sum"),
    }


def _add(into: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    for key, value in more.items():
        into[key] = into.get(key, 0) + value
    return into


def ack_buckets(gateways: list[dict]) -> dict[float, float]:
    """The cumulative NOTIFY -> ACK histogram of the gateways that answered, merged."""
    buckets: dict[float, float] = {}
    for gateway in gateways:
        if gateway["up"]:
            _add(buckets, gateway["ack_buckets"])
    return buckets


def latency_quantiles(buckets: dict[float, float]) -> dict:
    """count / p50 / p99 (seconds) of a cumulative histogram."""
    return {"count": max(buckets.values(), default=0),
            "p50": histogram_quantile(0.5, buckets.items()), "p99": histogram_quantile(0.99, buckets.items())}


def recent_ack_latency(snapshots: deque, window: float = RECENT_S) -> dict:
    """NOTIFY -> ACK over the last ``window`` seconds: the gateways' histogram now less the one scraped
    ``window`` ago (everything they counted, when the dashboard has not watched that long).

    Timed by the gateway from the NOTIFY the client got to its ACK, never from the job's record of the
    delivery: a gateway NOTIFYs a DELIVERY ALL message before the job routes it (route_early), so that
    record may come after the ACK.  A count that went down (a gateway restarted, or did not answer)
    makes the histogram now stand alone.  ``snapshots``: (time, buckets), oldest first; those older
    than the baseline are dropped."""
    newest_t, newest = snapshots[-1]
    while len(snapshots) > 2 and snapshots[1][0] <= newest_t - window:
        snapshots.popleft()
    oldest_t, oldest = snapshots[0]
    baseline = oldest if oldest_t <= newest_t - window else {}
    recent = {bound: count - baseline.get(bound, 0) for bound, count in newest.items()}
    if set(baseline) - set(newest) or any(count < 0 for count in recent.values()):
        recent = dict(newest)
    return latency_quantiles(recent)


def gateway_totals(gateways: list[dict]) -> dict:
    up = [g for g in gateways if g["up"]]
    buckets = ack_buckets(gateways)
    count = sum(g["ack_count"] for g in up)
    frames_in: dict[str, float] = {}
    errors: dict[str, float] = {}
    for gateway in up:
        _add(frames_in, gateway["frames_in"])
        _add(errors, gateway["errors"])
    return {
        "up": len(up), "configured": len(gateways),
        "connections": sum(g["connections"] or 0 for g in up),
        "logins": sum(g["logins"] or 0 for g in up),
        "notify_in_flight": sum(g["notify_in_flight"] or 0 for g in up),
        "notify_queued": sum(g["notify_queued"] or 0 for g in up),
        "frames_in": frames_in, "errors": errors, "errors_total": sum(errors.values()),
        "ack_latency_s": {"count": count, "mean": (sum(g["ack_sum"] for g in up) / count) if count else None,
                          "p50": histogram_quantile(0.5, buckets.items()),
                          "p99": histogram_quantile(0.99, buckets.items())},
    }


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
        self.tables = DeltaTables(config, self.settings.history_batches)
        self._page_html = page_html(self.settings.refresh_s)
        self.status: dict | None = None
        self.scrapes: list[Scrape] = []
        self.history: deque = deque(maxlen=600)  # one point per refresh, for the charts
        self.ack_snapshots: deque = deque()  # (time, the gateways' ACK histogram) per refresh, RECENT_S of them
        self.server: asyncio.base_events.Server | None = None
        self._lock: asyncio.Lock | None = None
        self._task: asyncio.Task | None = None
        self._refresh_seconds = 0.0

    async def refresh(self) -> dict:
        """Read the tables (in a worker thread) and scrape the gateways, now."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            started = time.monotonic()
            timeout = self.settings.scrape_timeout_s
            tables, *scrapes = await asyncio.gather(asyncio.to_thread(self.tables.read),
                                                    *(scrape(url, timeout) for url in self.gateway_urls))
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
            self.scrapes = scrapes
            self._refresh_seconds = time.monotonic() - started
            self.status = _finite({
                "generated_at": now, "refresh_s": self.settings.refresh_s, "data_dir": self.config.data_dir,
                "gateways": [{k: v for k, v in g.items() if k != "ack_buckets"} for g in gateways],
                "totals": totals | rates,
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
        return Response(render_prometheus(status, self.scrapes, self._refresh_seconds), CONTENT_TYPE)

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


def render_prometheus(status: dict, scrapes: list[Scrape], refresh_seconds: float) -> str:
    """The dashboard's figures, and each gateway's families with a ``gateway`` label."""
    out = _Text()
    tables = status["tables"]
    out.family("smqp_dashboard_gateway_up", "gauge", "1 when the gateway's status page answered the last scrape.",
               [({"gateway": s.url}, 1 if s.up else 0) for s in scrapes])
    merged: dict[str, ParsedFamily] = {}
    for scraped in scrapes:
        for name, family in scraped.families.items():
            target = merged.setdefault(name, ParsedFamily(name, family.kind, family.help))
            target.samples += [(sample, {**labels, "gateway": scraped.url}, value)
                               for sample, labels, value in family.samples]
    for name, family in merged.items():
        out.lines.append(f"# HELP {name} " + family.help.replace("\\", "\\\\").replace("\n", "\\n"))
        out.lines.append(f"# TYPE {name} {family.kind}")
        for sample, labels, value in family.samples:
            label_text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            out.lines.append(f"{sample}{{{label_text}}} {format_value(value)}")
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
          f"gateways: {', '.join(dashboard.gateway_urls) or 'none configured'})", flush=True)
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
                    "status pages and the job's Delta tables.",
    )
    parser.add_argument("--config", help="TOML configuration file (default: $SMQP_CONFIG, else built-in defaults)")
    parser.add_argument("--host", help="listen address (overrides [dashboard] host)")
    parser.add_argument("--port", type=int, help="listen port (overrides [dashboard] port)")
    parser.add_argument("--gateway", action="append", metavar="URL",
                        help="a gateway status page, e.g. http://127.0.0.1:7721/metrics (repeatable; "
                             "overrides [dashboard] gateways)")
    parser.add_argument("--data-dir", help="where the Delta tables live (overrides data_dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config(args.config)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if args.gateway:
        overrides["gateways"] = tuple(args.gateway)
    config = replace(config, dashboard=replace(config.dashboard, **overrides))
    if args.data_dir:
        config = replace(config, data_dir=args.data_dir)
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
