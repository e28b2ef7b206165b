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


class Dashboard:
    """Refreshes the figures every ``refresh_s`` and serves them (page, JSON, Prometheus)."""

    def __init__(self, config: SMQPConfig):
        self.config = config
        self.settings = config.dashboard
        self.gateway_urls = self.settings.gateway_urls(config.gateway)
        self.tables = DeltaTables(config, self.settings.history_batches)
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
        return Response(PAGE.replace("__REFRESH_MS__", str(int(self.settings.refresh_s * 1000))),
                        "text/html; charset=utf-8")

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
# The page


PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>SMQP on Spark · dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
:root{--bg:#0f1720;--panel:#17212c;--line:#263445;--text:#e6edf3;--dim:#8da2b5;--accent:#4fb3ff;--good:#3ecf8e;--warn:#f5b041;--bad:#ff6b6b}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--text);font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
header{display:flex;align-items:center;gap:16px;padding:12px 20px;border-bottom:1px solid var(--line);background:#111b25}
header h1{font-size:17px;margin:0;font-weight:600}
header .meta{color:var(--dim);font-size:12px;margin-left:auto;display:flex;gap:14px;align-items:center}
.dot{width:9px;height:9px;border-radius:50%;background:var(--dim);display:inline-block;margin-right:6px}
.dot.live{background:var(--good)} .dot.stale{background:var(--bad)}
main{padding:14px 20px;display:grid;gap:14px}
.tiles{display:grid;grid-template-columns:repeat(6,1fr);gap:12px}
.tile{background:var(--panel);border:1px solid var(--line);border-radius:8px;padding:10px 12px;min-height:84px}
.tile .label{color:var(--dim);font-size:11px;text-transform:uppercase;letter-spacing:.06em}
.tile .value{font-size:26px;font-weight:600;margin-top:2px;font-variant-numeric:tabular-nums}
.tile .unit{font-size:13px;color:var(--dim);margin-left:4px;font-weight:400}
.tile .sub{color:var(--dim);font-size:12px;margin-top:2px;font-variant-numeric:tabular-nums}
.tile.bad .value{color:var(--bad)} .tile.warn .value{color:var(--warn)}
.charts{display:grid;grid-template-columns:repeat(4,1fr);gap:12px}
.chart{background:var(--panel);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.chart .label{color:var(--dim);font-size:11px;text-transform:uppercase;letter-spacing:.06em;display:flex;justify-content:space-between}
.chart svg{width:100%;height:70px;display:block;margin-top:6px}
.panels{display:grid;grid-template-columns:1.3fr 1fr;gap:12px}
.panel{background:var(--panel);border:1px solid var(--line);border-radius:8px;padding:10px 12px;overflow:hidden}
.panel h2{font-size:12px;color:var(--dim);text-transform:uppercase;letter-spacing:.06em;margin:0 0 6px;font-weight:600}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{text-align:right;padding:3px 8px;border-bottom:1px solid var(--line);white-space:nowrap}
th{color:var(--dim);font-weight:500;font-size:12px}
th:first-child,td:first-child{text-align:left}
td.topic{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px;max-width:320px;overflow:hidden;text-overflow:ellipsis}
.bar{display:inline-block;height:8px;background:var(--accent);border-radius:2px;vertical-align:middle;margin-left:6px;opacity:.8}
.empty{color:var(--dim);font-style:italic;padding:6px 0}
.up{color:var(--good)} .down{color:var(--bad)}
td[data-col="frames-in"]{white-space:normal;text-align:left;font-size:12px;color:var(--dim);min-width:180px}
th.left{text-align:left}
</style></head>
<body>
<header><h1>SMQP on Spark</h1><span style="color:var(--dim)">engine dashboard</span>
<div class="meta"><span><span id="live" class="dot"></span><span id="updated">connecting…</span></span>
<span id="gateways-up" data-figure="gateways-up">—</span><span id="tables-state"></span></div></header>
<main>
<section class="tiles">
 <div class="tile"><div class="label">Processed</div><div class="value"><span data-figure="processed-rate">—</span><span class="unit">rows/s</span></div><div class="sub">input <span data-figure="input-rate">—</span> rows/s · batch <span data-figure="batch-id">—</span></div></div>
 <div class="tile"><div class="label">Batch duration</div><div class="value"><span data-figure="batch-duration">—</span><span class="unit">ms</span></div><div class="sub"><span data-figure="batch-rows">—</span> rows · add batch <span data-figure="add-batch">—</span> ms</div></div>
 <div class="tile"><div class="label">Kafka lag</div><div class="value"><span data-figure="lag">—</span><span class="unit">records</span></div><div class="sub" data-figure="lag-partitions">—</div></div>
 <div class="tile"><div class="label">Pending deliveries</div><div class="value"><span data-figure="pending">—</span></div><div class="sub"><span data-figure="acked">—</span> acknowledged</div></div>
 <div class="tile"><div class="label">NOTIFY in flight</div><div class="value"><span data-figure="in-flight">—</span></div><div class="sub"><span data-figure="queued">—</span> queued · <span data-figure="connections">—</span> connections</div></div>
 <div class="tile"><div class="label">ACK latency p50</div><div class="value"><span data-figure="ack-p50">—</span><span class="unit">ms</span></div><div class="sub">p99 <span data-figure="ack-p99">—</span> ms · <span data-figure="ack-count">—</span> ACKs</div></div>
 <div class="tile"><div class="label">Messages</div><div class="value"><span data-figure="messages">—</span></div><div class="sub"><span data-figure="messages-minute">—</span> in the last minute</div></div>
 <div class="tile"><div class="label">Publish rate</div><div class="value"><span data-figure="publish-rate">—</span><span class="unit">/s</span></div><div class="sub"><span data-figure="published">—</span> PUBLISH frames</div></div>
 <div class="tile"><div class="label">NOTIFY → ACK</div><div class="value"><span data-figure="delivery-p50">—</span><span class="unit">ms</span></div><div class="sub">p99 <span data-figure="delivery-p99">—</span> ms · last 5 min</div></div>
 <div class="tile" id="trash-tile"><div class="label">Trash</div><div class="value"><span data-figure="trash">—</span></div><div class="sub"><span data-figure="trash-growth">—</span> per minute</div></div>
 <div class="tile" id="errors-tile"><div class="label">Errors</div><div class="value"><span data-figure="errors">—</span></div><div class="sub"><span data-figure="error-rate">—</span> per second</div></div>
 <div class="tile"><div class="label">Logins</div><div class="value"><span data-figure="logins">—</span></div><div class="sub"><span data-figure="frames-in">—</span> frames in</div></div>
</section>
<section class="charts">
 <div class="chart"><div class="label"><span>Processed rows/s per batch</span><span data-chart-last="rate"></span></div><svg id="chart-rate" viewBox="0 0 300 70" preserveAspectRatio="none"></svg></div>
 <div class="chart"><div class="label"><span>Batch duration, ms</span><span data-chart-last="duration"></span></div><svg id="chart-duration" viewBox="0 0 300 70" preserveAspectRatio="none"></svg></div>
 <div class="chart"><div class="label"><span>Kafka lag per batch</span><span data-chart-last="lag"></span></div><svg id="chart-lag" viewBox="0 0 300 70" preserveAspectRatio="none"></svg></div>
 <div class="chart"><div class="label"><span>Pending deliveries</span><span data-chart-last="pending"></span></div><svg id="chart-pending" viewBox="0 0 300 70" preserveAspectRatio="none"></svg></div>
</section>
<section class="panels">
 <div class="panel"><h2>Queue depth per topic</h2>
  <table><thead><tr><th>topic</th><th>messages</th><th>pending</th><th>acked</th><th>trash</th></tr></thead><tbody id="topics"></tbody></table></div>
 <div class="panel"><h2>Gateways</h2>
  <table><thead><tr><th>status page</th><th>up</th><th>conn</th><th>in flight</th><th class="left">frames in</th></tr></thead><tbody id="gateways"></tbody></table>
  <h2 style="margin-top:12px">Errors by reply code</h2>
  <table><thead><tr><th>code</th><th>replies</th></tr></thead><tbody id="errors"></tbody></table></div>
</section>
<section class="panel"><h2>Latest micro-batches</h2>
 <table><thead><tr><th>batch</th><th>started</th><th>input rows</th><th>input rows/s</th><th>processed rows/s</th><th>duration ms</th><th>add batch ms</th><th>lag</th></tr></thead><tbody id="batches"></tbody></table></section>
</main>
<script>
"use strict";
const REFRESH_MS = __REFRESH_MS__;
const $ = s => document.querySelector(s);
function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "—";
  return Number(v).toLocaleString("en-US", {minimumFractionDigits: digits || 0, maximumFractionDigits: digits || 0});
}
function ms(seconds) { return seconds === null || seconds === undefined ? null : seconds * 1000; }
function set(name, value, digits) {
  for (const el of document.querySelectorAll('[data-figure="' + name + '"]')) {
    el.textContent = typeof value === "string" ? value : fmt(value, digits);
    el.dataset.value = value === null || value === undefined ? "" : String(value);
  }
}
function cell(text, cls, attrs) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  for (const [k, v] of Object.entries(attrs || {})) td.setAttribute(k, v);
  return td;
}
function fill(tbody, rows, emptyText, cols) {
  tbody.replaceChildren();
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell(emptyText, "empty"); td.colSpan = cols; tr.append(td); tbody.append(tr);
    return;
  }
  for (const r of rows) tbody.append(r);
}
function spark(id, values, color) {
  const svg = document.getElementById(id);
  const pts = values.map((v, i) => [i, v]).filter(p => p[1] !== null && p[1] !== undefined);
  svg.replaceChildren();
  if (pts.length < 1) return;
  const max = Math.max(1e-9, ...pts.map(p => p[1]));
  const n = Math.max(1, values.length - 1);
  const xy = pts.map(([i, v]) => [(i / n) * 300, 66 - (v / max) * 60]);
  const ns = "http://www.w3.org/2000/svg";
  const area = document.createElementNS(ns, "polygon");
  area.setAttribute("points", "0,70 " + xy.map(p => p.join(",")).join(" ") + " " + xy[xy.length - 1][0] + ",70");
  area.setAttribute("fill", color); area.setAttribute("opacity", "0.15");
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", xy.map(p => p.join(",")).join(" "));
  line.setAttribute("fill", "none"); line.setAttribute("stroke", color); line.setAttribute("stroke-width", "1.8");
  line.setAttribute("vector-effect", "non-scaling-stroke");
  const dot = document.createElementNS(ns, "circle");  // the latest value, visible even alone
  const [x, y] = xy[xy.length - 1];
  dot.setAttribute("cx", Math.min(297, Math.max(3, x))); dot.setAttribute("cy", y); dot.setAttribute("r", "2.5");
  dot.setAttribute("fill", color);
  svg.append(area, line, dot);
}
function render(s) {
  const t = s.tables, g = s.totals, m = t.metrics, last = m.latest || {};
  const batches = m.batches || [];
  set("processed-rate", last.processed_rows_per_second, 1);
  set("input-rate", last.input_rows_per_second, 1);
  set("batch-id", last.batch_id === undefined ? null : last.batch_id);
  set("batch-duration", last.batch_duration_ms);
  set("batch-rows", last.num_input_rows);
  set("add-batch", last.add_batch_ms);
  set("lag", last.kafka_lag);
  set("lag-partitions", (last.partitions || []).map(p => (p.source || "?") + "[" + p.partition + "] " + fmt(p.lag)).join(" · ") || (m.available ? "no partition lag known" : "no metrics table yet"));
  set("pending", t.deliveries.available ? t.deliveries.pending : null);
  set("acked", t.deliveries.available ? t.deliveries.acked : null);
  set("in-flight", g.up ? g.notify_in_flight : null);
  set("queued", g.up ? g.notify_queued : null);
  set("connections", g.up ? g.connections : null);
  set("logins", g.up ? g.logins : null);
  set("frames-in", g.up ? Object.values(g.frames_in).reduce((a, b) => a + b, 0) : null);
  set("ack-p50", ms(g.ack_latency_s.p50), 1);
  set("ack-p99", ms(g.ack_latency_s.p99), 1);
  set("ack-count", g.ack_latency_s.count);
  set("messages", t.messages.available ? t.messages.total : null);
  set("messages-minute", t.messages.available ? t.messages.last_minute : null);
  set("publish-rate", g.publish_per_s, 1);
  set("published", g.up ? (g.frames_in.PUBLISH || 0) : null);
  set("delivery-p50", ms(g.ack_latency_recent_s.p50), 1);
  set("delivery-p99", ms(g.ack_latency_recent_s.p99), 1);
  set("trash", t.trash.available ? t.trash.total : (t.trash.error ? "error" : "none yet"));
  set("trash-growth", s.trash_growth_per_min, 1);
  set("errors", g.up ? g.errors_total : null);
  set("error-rate", g.errors_per_s, 2);
  $("#errors-tile").classList.toggle("bad", (g.errors_per_s || 0) > 0);
  set("gateways-up", "gateways " + g.up + "/" + g.configured + " up");
  $("#tables-state").textContent = Object.entries(t).map(([k, v]) => k + (v.available ? " ✓" : " –")).join("  ");

  spark("chart-rate", batches.map(b => b.processed_rows_per_second), "#4fb3ff");
  spark("chart-duration", batches.map(b => b.batch_duration_ms), "#f5b041");
  spark("chart-lag", batches.map(b => b.kafka_lag), "#ff6b6b");
  spark("chart-pending", s.history.map(p => p.pending), "#3ecf8e");
  const lastOf = a => a.length ? a[a.length - 1] : null;
  $('[data-chart-last="rate"]').textContent = fmt(lastOf(batches.map(b => b.processed_rows_per_second)), 1);
  $('[data-chart-last="duration"]').textContent = fmt(lastOf(batches.map(b => b.batch_duration_ms)));
  $('[data-chart-last="lag"]').textContent = fmt(lastOf(batches.map(b => b.kafka_lag)));
  $('[data-chart-last="pending"]').textContent = fmt(lastOf(s.history.map(p => p.pending)));

  const deepest = Math.max(1, ...s.topics.map(r => r.pending));
  fill($("#topics"), s.topics.map(r => {
    const tr = document.createElement("tr"); tr.dataset.topic = r.topic;
    const pending = cell(fmt(r.pending), "", {"data-col": "pending"});
    const bar = document.createElement("span"); bar.className = "bar"; bar.style.width = Math.round(60 * r.pending / deepest) + "px";
    pending.append(bar);
    tr.append(cell(r.topic, "topic"), cell(fmt(r.messages), "", {"data-col": "messages"}), pending,
              cell(fmt(r.acked), "", {"data-col": "acked"}), cell(fmt(r.trash), "", {"data-col": "trash"}));
    return tr;
  }), t.messages.available ? "no topics yet" : "no messages table yet", 5);
  fill($("#gateways"), s.gateways.map(x => {
    const tr = document.createElement("tr"); tr.dataset.gateway = x.url;
    const frames = Object.entries(x.frames_in || {}).sort((a, b) => b[1] - a[1]).map(([k, v]) => k + " " + fmt(v)).join(" · ");
    tr.append(cell(x.url.replace(/^https?:\/\//, "")), cell(x.up ? "up" : "down", x.up ? "up" : "down", {"title": x.error || ""}),
              cell(fmt(x.connections), "", {"data-col": "connections"}), cell(fmt(x.notify_in_flight), "", {"data-col": "in-flight"}),
              cell(frames || "—", "", {"data-col": "frames-in"}));
    return tr;
  }), "no gateway status pages configured", 5);
  fill($("#errors"), Object.entries(g.errors).sort().map(([code, n]) => {
    const tr = document.createElement("tr"); tr.dataset.code = code;
    tr.append(cell(code), cell(fmt(n), "", {"data-col": "count"}));
    return tr;
  }), "no errors", 2);
  fill($("#batches"), batches.slice(-8).reverse().map(b => {
    const tr = document.createElement("tr"); tr.dataset.batch = b.batch_id;
    tr.append(cell(fmt(b.batch_id)), cell(b.timestamp ? new Date(b.timestamp * 1000).toISOString().slice(11, 23) : "—"),
              cell(fmt(b.num_input_rows), "", {"data-col": "num_input_rows"}),
              cell(fmt(b.input_rows_per_second, 1), "", {"data-col": "input_rows_per_second"}),
              cell(fmt(b.processed_rows_per_second, 1), "", {"data-col": "processed_rows_per_second"}),
              cell(fmt(b.batch_duration_ms), "", {"data-col": "batch_duration_ms"}),
              cell(fmt(b.add_batch_ms), "", {"data-col": "add_batch_ms"}),
              cell(fmt(b.kafka_lag), "", {"data-col": "kafka_lag"}));
    return tr;
  }), m.available ? "no micro-batch recorded yet" : "no metrics table yet (is the streaming job running?)", 8);
  $("#updated").textContent = "updated " + new Date(s.generated_at * 1000).toISOString().slice(11, 19) + " UTC";
  document.body.dataset.generatedAt = String(s.generated_at);
}
async function poll() {
  try {
    const response = await fetch("/api/status", {cache: "no-store"});
    if (!response.ok) throw new Error(response.status);
    render(await response.json());
    $("#live").className = "dot live";
  } catch (e) {
    $("#live").className = "dot stale";
    $("#updated").textContent = "no answer from the dashboard (" + e.message + ")";
  }
}
poll();
setInterval(poll, REFRESH_MS);
</script>
</body></html>
"""


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
