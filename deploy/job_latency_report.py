"""The figures and the report of :mod:`deploy.job_latency`: pure functions over what a run collected.

The job's log line per routed batch and the ``metrics`` table's rows become batch-time figures
(:func:`sink_figures`, :func:`spark_figures`); each phase's figures become the printed table beside
the targets (:func:`render_table`), and alternating runs their medians per source
(:func:`medians`, :func:`render_medians`).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from datetime import datetime
from typing import Iterable, Mapping, Sequence

from deploy.compare_report import percentile

#: Targets: (figure, percentile it applies to, bound in ms).
TARGETS = {"visibility_get": ("p99_ms", 2000), "visibility_delta": ("p99_ms", 2000),
           "delivery_one": ("p99_ms", 1000), "expiry_list": ("max_ms", 3000), "expiry_delta": ("max_ms", 3000)}
SMALL_BATCH, FAST_BATCH_MS = 1000, 300  # batches of ≤ 1,000 commands should take ≤ 300 ms

#: The sink's line per routed micro-batch (``CommandSink.__call__``), stamped when the batch ended.
SINK_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO streaming\.sink: batch (?P<batch>\d+): "
    r"(?P<records>\d+) records in, .*?(?P<ms>\d+) ms \(spark (?P<spark_ms>\d+), delta (?P<delta_ms>\d+)\)"
    r"(?:; routing query: plan (?P<plan_ms>\d+) ms, run (?P<run_ms>\d+) ms)?")


# -- the pure part: parsing, statistics, rendering (tests/unit/test_job_latency.py)

def parse_sink_line(line: str) -> dict | None:
    """One routed batch from the job's log: ``batch``, ``records`` (commands read, ticks included),
    ``ms`` (the sink's total), ``spark_ms``, ``delta_ms``, ``plan_ms``/``run_ms`` (the routing
    query), ``end`` (the log line's local time, as epoch seconds) and ``start`` (``end - ms``)."""
    match = SINK_LINE.match(line)
    if match is None:
        return None
    fields = match.groupdict()
    end = datetime.strptime(fields.pop("at"), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    batch = {key: int(value) for key, value in fields.items() if value is not None}
    return {**batch, "end": end, "start": end - batch["ms"] / 1000}


def spread(values: Sequence[float]) -> dict:
    """count, nearest-rank p50/p90/p99, max and mean of ``values`` (rounded to 0.1)."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    return {"n": len(values), **{f"p{round(q * 100)}": round(percentile(values, q), 1) for q in (0.5, 0.9, 0.99)},
            "max": round(max(values), 1), "mean": round(statistics.fmean(values), 1)}


def sink_figures(batches: Sequence[Mapping]) -> dict:
    """What the sink's log says about ``batches``: totals, the routing query's plan and run, the plan's
    share of each batch, where the rest went, and how many batches of ≤ 1,000 commands took ≤ 300 ms."""
    timed = [b for b in batches if "plan_ms" in b]
    small = [b for b in batches if b["records"] <= SMALL_BATCH]
    fast = [b for b in small if b["ms"] <= FAST_BATCH_MS]
    total = sum(b["ms"] for b in timed)
    return {
        "batches": len(batches),
        "records": spread([b["records"] for b in batches]),
        "total_ms": spread([b["ms"] for b in batches]),
        "plan_ms": spread([b["plan_ms"] for b in timed]),
        "run_ms": spread([b["run_ms"] for b in timed]),
        "spark_ms": spread([b["spark_ms"] for b in batches]),  # reading the batch, planning and running
        # in Spark but outside the routing query: the batch read into Arrow, the expiry candidates, …
        "other_spark_ms": spread([max(0, b["spark_ms"] - b["plan_ms"] - b["run_ms"]) for b in timed]),
        "delta_ms": spread([b["delta_ms"] for b in batches]),  # handing deliveries to Kafka, the Delta commits
        "kafka_wait_ms": spread([max(0, b["ms"] - b["spark_ms"] - b["delta_ms"]) for b in batches]),
        "plan_share_pct": spread([100 * b["plan_ms"] / b["ms"] for b in timed if b["ms"]]),
        "plan_share_of_sum_pct": round(100 * sum(b["plan_ms"] for b in timed) / total, 1) if total else None,
        "small": {"batches": len(small), "fast": len(fast),
                  "fast_pct": round(100 * len(fast) / len(small), 1) if small else None},
    }


PHASES = ("trigger_execution_ms", "latest_offset_ms", "get_batch_ms", "query_planning_ms", "add_batch_ms",
          "wal_commit_ms", "commit_offsets_ms")


def spark_figures(rows: Sequence[Mapping]) -> dict:
    """What the ``metrics`` table says about micro-batches that read something (here: the routed
    ones, those with a sink line; the job's ticks make every other batch read a row): Spark's whole
    trigger (``batch_duration_ms``; for our Python source it includes the source's read and any
    burst deferral, in ``latest_offset_ms``) and each phase, and the ≤ 1,000 / ≤ 300 ms share."""
    busy = [r for r in rows if (r.get("num_input_rows") or 0) > 0]
    small = [r for r in busy if r["num_input_rows"] <= SMALL_BATCH]
    fast = [r for r in small if (r.get("batch_duration_ms") or 0) <= FAST_BATCH_MS]
    return {
        "batches": len(busy),
        "input_rows": spread([r["num_input_rows"] for r in busy]),
        "batch_ms": spread([r.get("batch_duration_ms") or 0 for r in busy]),
        "phases_ms": {phase: spread([r.get(phase) or 0 for r in busy]) for phase in PHASES},
        "small": {"batches": len(small), "fast": len(fast),
                  "fast_pct": round(100 * len(fast) / len(small), 1) if small else None},
    }


def started_within(rows: Iterable[Mapping], start: float, end: float) -> list:
    """The batches that started between ``start`` and ``end`` (epoch seconds): under load, a batch
    that started while it ran counts even if it ends after (the job lags; its work is the load's)."""
    return [r for r in rows if start <= r["start"] <= end]


def committed_batch(lines: Iterable[str]) -> int | None:
    """The micro-batch a Delta commit (the lines of one ``_delta_log/*.json``) wrote: the version of
    its app transaction (the sink tags each commit with its batch id); None for other commits."""
    for line in lines:
        if line.strip():
            action = json.loads(line)
            if "txn" in action:
                return int(action["txn"]["version"])
    return None


def cell(summary: Mapping | None, keys=("p50_ms", "p90_ms", "p99_ms")) -> str:
    if not summary:
        return "-"
    values = [summary.get(key) for key in keys]
    text = " / ".join("-" if v is None or (isinstance(v, float) and math.isnan(v)) else
                      "never" if isinstance(v, float) and math.isinf(v) else f"{v:,.0f}" for v in values)
    if "delivered" in summary:
        count = summary["delivered"] + summary["not_delivered"]
        text += f" ({summary['delivered']})" if not summary["not_delivered"] else f" ({summary['delivered']}/{count})"
    elif "n" in summary:
        text += f" ({summary['n']})"
    return text


def _verdict(figure: str, summary: Mapping | None) -> str:
    if not summary or figure not in TARGETS:
        return ""
    key, bound = TARGETS[figure]
    value = summary.get(key)
    return "  ok" if value is not None and value <= bound else "  MISSED"


ROWS = (  # (label, where in a phase's result, target text)
    ("visibility: GET MESSAGE, ms", "visibility_get", "p99 ≤ 2,000"),
    ("visibility: messages Delta commit, ms", "visibility_delta", "p99 ≤ 2,000"),
    ("DELIVERY ONE: NOTIFY, ms", "delivery_one", "p99 ≤ 1,000"),
    ("expiry: listed in Trash, ms", "expiry_list", "max ≤ 3,000"),
    ("expiry: trash Delta commit, ms", "expiry_delta", "max ≤ 3,000"),
    ("probes' PUB -> 200, ms", "publish", ""),
)


def report_rows(run: Mapping) -> list[tuple[str, str, str]]:
    """(figure, target, value) rows of one run; values are ``p50 / p90 / p99 (count)``."""
    rows = []
    for phase in ("quiet", "load"):
        result = run.get("phases", {}).get(phase)
        if not result:
            continue
        for label, key, target in ROWS:
            summary = result.get(key)
            value = cell(summary)
            if summary and key.startswith("expiry"):
                value += f", max {summary['max_ms']:,.0f}" if _finite(summary.get("max_ms")) else ", max never"
            rows.append((f"{phase}: {label}", target, value + _verdict(key, summary)))
        sink, spark = result.get("sink") or {}, result.get("spark") or {}
        if sink.get("batches"):
            small = sink["small"]
            rows += [
                (f"{phase}: batch total (sink log), ms", "", cell(sink["total_ms"], ("p50", "p90", "p99"))),
                (f"{phase}: routing query plan, ms", "", cell(sink["plan_ms"], ("p50", "p90", "p99"))),
                (f"{phase}: plan share of batch, %", "", cell(sink["plan_share_pct"], ("p50", "p90", "p99"))
                 + f"; of summed time {sink['plan_share_of_sum_pct']} %"),
                (f"{phase}: commands per batch", "", cell(sink["records"], ("p50", "p90", "p99"))),
                (f"{phase}: p50 plan / run / other Spark / Delta / Kafka wait, ms", "",
                 " / ".join(f"{sink[key]['p50'] or 0:,.0f}" for key in
                            ("plan_ms", "run_ms", "other_spark_ms", "delta_ms", "kafka_wait_ms"))),
                (f"{phase}: ≤ 1,000-command batches ≤ 300 ms (sink)", "all",
                 f"{small['fast']}/{small['batches']}" + (f" = {small['fast_pct']} %" if small["batches"] else "")),
            ]
        if not sink.get("batches"):
            rows.append((f"{phase}: batch total (sink log), ms", "", "no routed batch started in the window"))
        if spark.get("batches"):
            small = spark["small"]
            phases = spark["phases_ms"]
            rows += [
                (f"{phase}: Spark trigger (metrics table), ms", "", cell(spark["batch_ms"], ("p50", "p90", "p99"))),
                (f"{phase}: ≤ 1,000-row triggers ≤ 300 ms (Spark)", "all",
                 f"{small['fast']}/{small['batches']}" + (f" = {small['fast_pct']} %" if small["batches"] else "")),
                (f"{phase}: p50 latestOffset / addBatch / wal+commit, ms", "",
                 f"{phases['latest_offset_ms']['p50']} / {phases['add_batch_ms']['p50']} / "
                 f"{(phases['wal_commit_ms']['p50'] or 0) + (phases['commit_offsets_ms']['p50'] or 0):.0f}"),
            ]
        if result.get("load"):
            load = result["load"]
            rows.append((f"{phase}: load offered -> achieved msg/s", "",
                         f"{load.get('rate')} -> {load.get('achieved_per_s')} ({load.get('published')} PUBs, "
                         f"{load.get('errors')} errors)"))
        if "caught_up_after_s" in result:
            caught = result["caught_up_after_s"]
            rows.append((f"{phase}: job caught up after it, s", "", "not in 300 s" if caught is None else f"{caught}"))
        rows.append((f"{phase}: load avg 1m start -> end", "", " -> ".join(f"{v:.2f}" for v in result["load_avg_1m"])))
        if result.get("steal_pct") is not None:
            rows.append((f"{phase}: host CPU stolen by the hypervisor, %", "", f"{result['steal_pct']}"))
    return rows


def render_table(runs: Sequence[Mapping]) -> str:
    """One column per run (``python#1``, ``kafka#1`` …), one row per figure."""
    columns = [f"{run['source']}#{run['index']}" for run in runs]
    table: dict[str, list[str]] = {}
    targets: dict[str, str] = {}
    order: list[str] = []
    for i, run in enumerate(runs):
        previous = -1
        for label, target, value in report_rows(run):
            if label not in table:  # a row only some runs have goes after this run's row before it
                order.insert(previous + 1, label)
                table[label], targets[label] = [""] * len(runs), target
            table[label][i] = value
            previous = order.index(label)
    header = ["figure", "target", *columns]
    body = [[label, targets[label], *table[label]] for label in order]
    widths = [max(len(row[c]) for row in [header, *body]) for c in range(len(header))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in [header, *body]]
    lines.insert(1, "-|-".join("-" * width for width in widths))
    return "\n".join(lines)


def medians(runs: Sequence[Mapping]) -> dict:
    """Per source: the median over its runs of each probe's p50 / p90 / p99 and max, and of the
    batch figures (sink total, plan, plan share p50 / p90 / p99; the ≤ 300 ms share)."""
    out: dict = {}
    for source in sorted({run["source"] for run in runs}):
        mine = [run for run in runs if run["source"] == source]
        per_phase = {}
        for phase in ("quiet", "load"):
            results = [run["phases"][phase] for run in mine if run.get("phases", {}).get(phase)]
            figures = {}
            for _, key, _ in ROWS:
                figures[key] = {stat: _median([r[key].get(stat) for r in results if r.get(key)])
                                for stat in ("p50_ms", "p90_ms", "p99_ms", "max_ms")}
            for key in ("total_ms", "plan_ms", "plan_share_pct"):
                figures[f"sink_{key}"] = {stat: _median([r["sink"][key][stat] for r in results if r.get("sink")])
                                          for stat in ("p50", "p90", "p99")}
            figures["sink_small_fast_pct"] = _median([r["sink"]["small"]["fast_pct"] for r in results
                                                      if r.get("sink")])
            figures["spark_batch_ms"] = {stat: _median([r["spark"]["batch_ms"][stat] for r in results
                                                        if r.get("spark")]) for stat in ("p50", "p90", "p99")}
            per_phase[phase] = figures
        out[source] = {"runs": len(mine), **per_phase}
    return out


def render_medians(by_source: Mapping) -> str:
    """The medians over each source's runs (:func:`medians`): p50 / p90 / p99 per figure and phase."""
    sources = sorted(by_source)
    header = ["median over runs", *(f"{source} ({by_source[source]['runs']} runs)" for source in sources)]
    body = []
    for phase in ("quiet", "load"):
        for label, key, target in ROWS:
            body.append([f"{phase}: {label}" + (f" [{target}]" if target else ""),
                         *(cell(by_source[source][phase][key]) + _max(by_source[source][phase][key], key)
                           for source in sources)])
        for label, key in (("batch total (sink log), ms", "sink_total_ms"), ("routing query plan, ms", "sink_plan_ms"),
                           ("plan share of batch, %", "sink_plan_share_pct"),
                           ("Spark trigger (metrics table), ms", "spark_batch_ms")):
            body.append([f"{phase}: {label}", *(cell(by_source[source][phase][key], ("p50", "p90", "p99"))
                                                 for source in sources)])
        body.append([f"{phase}: ≤ 1,000-command batches ≤ 300 ms (sink), %",
                     *(cell({"pct": by_source[source][phase]["sink_small_fast_pct"]}, ("pct",))
                       for source in sources)])
    widths = [max(len(row[c]) for row in [header, *body]) for c in range(len(header))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in [header, *body]]
    lines.insert(1, "-|-".join("-" * width for width in widths))
    return "\n".join(lines)


def _max(summary: Mapping, key: str) -> str:
    if not key.startswith("expiry") or summary.get("max_ms") is None:
        return ""
    return ", max never" if math.isinf(summary["max_ms"]) else f", max {summary['max_ms']:,.0f}"


def _median(values: Iterable[float | None]) -> float | None:
    kept = sorted(v for v in values if v is not None)
    if not kept:
        return None
    return statistics.median_low(kept) if math.inf in kept else statistics.median(kept)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
