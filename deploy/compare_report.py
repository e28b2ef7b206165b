"""The pure half of ``deploy.compare``: statistics, memory growth, the comparison table and its JSON.

Nothing here touches a socket, a process or the clock, so the figures the
benchmark prints can be checked by unit tests: percentiles that count
undelivered messages, min/median/max over runs, RSS growth between the first
and the last minute of a soak, ratios against RabbitMQ and the issue's targets.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

SYSTEMS = ("smqp", "rabbitmq")
LABELS = {"smqp": "ours", "rabbitmq": "RabbitMQ"}


def percentile(samples: Sequence[float], q: float, missing: int = 0) -> float:
    """Nearest-rank ``q`` percentile (0 < q <= 1) of ``samples`` plus ``missing`` values that never
    arrived, which count as infinitely late: the result is ``math.inf`` when the rank falls among them."""
    ordered = sorted(samples)
    count = len(ordered) + missing
    if count == 0:
        return math.nan
    rank = max(1, math.ceil(q * count))
    return ordered[rank - 1] if rank <= len(ordered) else math.inf


def latency_summary(samples_ms: Sequence[float], sent: int) -> dict:
    """p50/p90/p99/max/mean in ms of the messages delivered, out of ``sent``; a percentile that falls
    among the undelivered ones is ``inf`` (rendered "not delivered")."""
    missing = max(0, sent - len(samples_ms))
    summary = {f"p{round(q * 100)}_ms": _round(percentile(samples_ms, q, missing)) for q in (0.5, 0.9, 0.99)}
    summary["max_ms"] = _round(max(samples_ms)) if samples_ms else math.nan
    summary["mean_ms"] = _round(statistics.fmean(samples_ms)) if samples_ms else math.nan
    summary["delivered"] = len(samples_ms)
    summary["not_delivered"] = missing
    return summary


def summarize(values: Iterable[float | None]) -> dict | None:
    """min/median/max of one figure over the runs that produced it (``None``: a run that failed)."""
    kept = sorted(v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)))
    if not kept:
        return None
    return {"min": kept[0], "median": statistics.median_low(kept) if math.inf in kept else statistics.median(kept),
            "max": kept[-1], "runs": len(kept)}


def rss_growth(samples: Sequence[tuple[float, float]], window_s: float = 60.0) -> dict | None:
    """Growth of resident memory over a soak: mean RSS (MiB) of the last ``window_s`` seconds minus
    that of the first (each window at most a third of the span, so a short soak still compares two
    separate stretches).  ``samples`` are (seconds since start, MiB)."""
    if len(samples) < 2:
        return None
    start, end = samples[0][0], samples[-1][0]
    window = min(window_s, (end - start) / 3)
    first = [mb for t, mb in samples if t <= start + window]
    last = [mb for t, mb in samples if t >= end - window]
    first_mb, last_mb = statistics.fmean(first), statistics.fmean(last)
    return {"first_mb": round(first_mb, 1), "last_mb": round(last_mb, 1), "growth_mb": round(last_mb - first_mb, 1),
            "growth_pct": round(100 * (last_mb - first_mb) / first_mb, 1) if first_mb else math.nan,
            "window_s": round(window, 1), "peak_mb": round(max(mb for _, mb in samples), 1),
            "samples": len(samples)}


def batch_stats(batches: Sequence[Mapping]) -> dict | None:
    """Where the streaming job's time went over some micro-batches (rows of its ``metrics`` table):
    batch duration percentiles and each phase's share of the summed batch time."""
    if not batches:
        return None
    durations = [b["batch_duration_ms"] or 0 for b in batches]
    total = sum(durations) or 1
    phases = ("latest_offset_ms", "get_batch_ms", "query_planning_ms", "add_batch_ms", "wal_commit_ms",
              "commit_offsets_ms")
    shares = {phase: round(100 * sum(b.get(phase) or 0 for b in batches) / total, 1) for phase in phases}
    busy = [b for b in batches if (b.get("num_input_rows") or 0) > 0]
    return {
        "batches": len(batches),
        "input_rows": sum(b.get("num_input_rows") or 0 for b in batches),
        "rows_per_busy_batch": round(statistics.fmean(b["num_input_rows"] for b in busy)) if busy else 0,
        "batch_ms_p50": percentile(durations, 0.5), "batch_ms_p90": percentile(durations, 0.9),
        "batch_ms_max": max(durations),
        "add_batch_ms_p50": percentile([b.get("add_batch_ms") or 0 for b in batches], 0.5),
        "phase_share_pct": shares,
        "other_pct": max(0.0, round(100 - sum(shares.values()), 1)),
    }


def sink_stats(batches: Sequence[Mapping]) -> dict | None:
    """How the job's foreachBatch sink (Spark's ``addBatch``) split its time, from its per-batch log
    lines: ``ms`` in all; ``spark_ms`` reading the batch and computing the routing outputs;
    ``delta_ms`` handing the deliveries to the Kafka producer and committing the Delta tables; the
    rest is waiting for Kafka to acknowledge them.  Of ``spark_ms``, ``plan_ms`` went to planning the
    routing query (parse, analyse, optimise, physical plan) and ``run_ms`` to running it (older logs
    lack both: ``plan_pct`` is then None)."""
    if not batches:
        return None
    total = sum(b["ms"] for b in batches) or 1
    spark, delta = (sum(b[key] for b in batches) for key in ("spark_ms", "delta_ms"))
    return {"batches": len(batches), "records": sum(b["records"] for b in batches),
            "sink_ms_p50": percentile([b["ms"] for b in batches], 0.5),
            "spark_pct": round(100 * spark / total, 1), "delta_pct": round(100 * delta / total, 1),
            "kafka_wait_pct": max(0.0, round(100 * (total - spark - delta) / total, 1)),
            **_query_split(batches)}


def _query_split(batches: Sequence[Mapping]) -> dict:
    """``plan_pct`` / ``run_pct`` of the sink's time, over the batches whose log line has them."""
    timed = [b for b in batches if "plan_ms" in b]
    if not timed:
        return {"plan_pct": None, "run_pct": None}
    total = sum(b["ms"] for b in timed) or 1
    return {key.replace("_ms", "_pct"): round(100 * sum(b[key] for b in timed) / total, 1)
            for key in ("plan_ms", "run_ms")}


@dataclass(frozen=True)
class Figure:
    """One row of the comparison: ``key`` of each run's result of ``workload``."""

    workload: str
    key: str
    label: str  # formatted with the run's settings
    unit: str
    higher_is_better: bool
    ratio_at_least: float | None = None  # target: ours / RabbitMQ (medians) at least this
    at_most: float | None = None  # target: our median at most this
    at_least: float | None = None  # target: our median at least this

    @property
    def target(self) -> str:
        if self.ratio_at_least is not None:
            return f">= {self.ratio_at_least:g}x RabbitMQ"
        if self.at_most is not None:
            return f"<= {_number(self.at_most)} {self.unit}"
        if self.at_least is not None:
            return f">= {_number(self.at_least)} {self.unit}"
        return ""


#: Issue 35's targets: ours / RabbitMQ for throughput, our own latency, and peak memory.
THROUGHPUT_RATIO = 1.5
MEMORY_RATIO = 2.0

FIGURES = (
    Figure("ingest", "msgs_per_s", "ingest: {publishers} publishers, acknowledged publishes", "msg/s", True,
           ratio_at_least=THROUGHPUT_RATIO),
    Figure("latency", "p50_ms", "publish -> delivery p50 at {latency_rate:g} msg/s", "ms", False, at_most=5),
    Figure("latency", "p90_ms", "publish -> delivery p90 at {latency_rate:g} msg/s", "ms", False),
    Figure("latency", "p99_ms", "publish -> delivery p99 at {latency_rate:g} msg/s", "ms", False, at_most=20),
    Figure("latency", "offered_per_s", "  offered rate achieved (target {latency_rate:g})", "msg/s", True),
    Figure("latency", "delivered_per_s", "  delivered rate", "msg/s", True),
    Figure("burst", "p50_ms", "publish -> delivery p50 at {burst_rate:g} msg/s offered", "ms", False),
    Figure("burst", "p99_ms", "publish -> delivery p99 at {burst_rate:g} msg/s offered", "ms", False, at_most=100),
    Figure("burst", "offered_per_s", "  offered rate achieved (target {burst_rate:g})", "msg/s", True),
    Figure("burst", "not_delivered", "  not delivered (dropped)", "messages", False, at_most=0),
    Figure("fanout", "deliveries_per_s", "fan-out: 1 topic -> {fanout_subscribers} subscribers, acked deliveries",
           "deliveries/s", True, ratio_at_least=THROUGHPUT_RATIO),
    Figure("drain", "msgs_per_s", "backlog drain: {backlog} queued -> 1 reconnecting subscriber", "msg/s", True,
           ratio_at_least=THROUGHPUT_RATIO),
    # a soak whose subscriber falls behind grows a backlog: its memory growth is not only a leak
    Figure("soak", "delivered_pct", "soak at {soak_rate:g} msg/s: its messages delivered by its end (+30 s)", "%",
           True, at_least=100),
)


def comparison_rows(results: Mapping[str, Mapping[str, Sequence[Mapping]]], settings: Mapping) -> list[dict]:
    """One row per figure whose workload ran: each system's min/median/max over its runs, the ratio of
    the medians (ours / RabbitMQ) and whether the issue's target is met (``None``: cannot tell)."""
    rows = []
    for figure in FIGURES:
        runs = results.get(figure.workload)
        if not runs:
            continue
        per_system = {system: summarize(run.get(figure.key) for run in runs.get(system, ()) if "error" not in run)
                      for system in SYSTEMS}
        ours, theirs = (per_system[s]["median"] if per_system[s] else None for s in SYSTEMS)
        ratio = ours / theirs if _finite(ours) and _finite(theirs) and theirs else None
        met = None
        if figure.ratio_at_least is not None and ratio is not None:
            met = ratio >= figure.ratio_at_least
        elif figure.at_most is not None and ours is not None:
            met = ours <= figure.at_most
        elif figure.at_least is not None and ours is not None:
            met = ours >= figure.at_least
        failed = {system: sum("error" in run for run in runs.get(system, ())) for system in SYSTEMS}
        rows.append({"figure": figure.label.format(**settings), "unit": figure.unit,
                     "higher_is_better": figure.higher_is_better, **per_system,
                     "ratio": round(ratio, 3) if ratio is not None else None, "target": figure.target, "met": met,
                     "failed_runs": {system: n for system, n in failed.items() if n}})
    return rows


def memory_rows(peaks: Mapping[str, Mapping[str, float]], soak: Mapping[str, Mapping[str, dict]],
                flat_pct: float) -> list[dict]:
    """Peak RSS per server process (and their sum per system), then each process's RSS growth over
    the soak; a growth within ``flat_pct`` % of the first minute counts as flat (shrinking too)."""
    rows = []
    totals = {system: sum(processes.values()) for system, processes in peaks.items() if processes}
    for system, processes in peaks.items():
        for process, mb in processes.items():
            rows.append(_single(f"peak RSS: {process}", "MiB", system, mb))
    if totals:
        ours, theirs = totals.get("smqp"), totals.get("rabbitmq")
        row = _single("peak RSS: all server processes", "MiB", None, None)
        row.update({s: _one(v) for s, v in (("smqp", ours), ("rabbitmq", theirs))})
        row["ratio"] = round(ours / theirs, 3) if ours and theirs else None
        row.update(target=f"<= {MEMORY_RATIO:g}x RabbitMQ",
                   met=row["ratio"] <= MEMORY_RATIO if row["ratio"] is not None else None)
        rows.append(row)
    for system, processes in soak.items():
        for process, growth in processes.items():
            if growth is None:
                continue
            row = _single(f"RSS growth over the soak: {process} (first -> last minute)", "MiB", system,
                          growth["growth_mb"])
            row.update(target=f"flat (<= {flat_pct:g} %)",
                       met=growth["growth_pct"] <= flat_pct if _finite(growth["growth_pct"]) else None,
                       detail=(f"{growth['first_mb']:.0f} -> {growth['last_mb']:.0f} MiB "
                               f"({growth['growth_pct']:+.1f} %)"))
            rows.append(row)
    return rows


def render_table(rows: Sequence[Mapping]) -> str:
    """The rows as a Markdown table: median (min-max) per system and how many of its runs failed,
    ratio, target, met."""
    lines = ["| figure | ours | RabbitMQ | ours / RabbitMQ | target | met |", "|---|---|---|---|---|---|"]
    for row in rows:
        cells = [f"{row['figure']} ({row['unit']})"]
        for system in SYSTEMS:
            cell = _spread(row.get(system))
            if row.get("detail") and row.get(system):
                cell += f" [{row['detail']}]"
            if failed := row.get("failed_runs", {}).get(system):
                cell += f" ({failed} run{'s' * (failed > 1)} failed)"
            cells.append(cell)
        cells.append(f"{row['ratio']:.2f}x" if row.get("ratio") is not None else "-")
        cells.append(row.get("target") or "")
        cells.append({True: "yes", False: "NO", None: ""}[row.get("met")])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def jsonable(value):
    """``value`` with every non-finite float replaced by ``None`` (JSON has no Infinity); an
    infinite latency percentile means the message was not delivered within the grace period."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def _single(label: str, unit: str, system: str | None, value: float | None) -> dict:
    row = {"figure": label, "unit": unit, "higher_is_better": False, "smqp": None, "rabbitmq": None,
           "ratio": None, "target": "", "met": None}
    if system is not None:
        row[system] = _one(value)
    return row


def _one(value: float | None) -> dict | None:
    return None if value is None else {"min": value, "median": value, "max": value, "runs": 1}


def _spread(summary: Mapping | None) -> str:
    if not summary:
        return "-"
    median = _number(summary["median"])
    if summary["runs"] > 1 and summary["min"] != summary["max"]:
        return f"{median} ({_number(summary['min'])}-{_number(summary['max'])})"
    return median


def _number(value: float) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "not delivered"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _round(value: float) -> float:
    return round(value, 1) if math.isfinite(value) else value
