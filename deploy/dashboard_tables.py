"""The dashboard's figures from the job's Delta tables: each table opened once, updated
incrementally, and summarised per data file so a refresh reads only what changed.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from deploy.dashboard_gateways import RECENT_S
from schemas.config import SMQPConfig
from schemas.metrics import DURATION_PHASES

log = logging.getLogger("smqp.dashboard")


BATCH_COLUMNS = ("query_name", "run_id", "batch_id", "timestamp", "num_input_rows", "input_rows_per_second",
                 "processed_rows_per_second", "batch_duration_ms", *DURATION_PHASES.values(), "kafka_lag",
                 "state_rows_total", "partitions")


def finite(value: Any) -> Any:
    """JSON has no NaN/Infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
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
