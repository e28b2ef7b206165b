"""The job-latency benchmark's arithmetic: what ``python -m deploy.job_latency`` prints must follow
from the job's log lines, its Delta commits and the samples it took."""

import json
import math
from datetime import datetime

import pytest

from deploy.job_latency import Sample, env_settings, latencies, result_path, run_order
from deploy.job_latency_report import (committed_batch, medians, parse_sink_line, render_table, sink_figures,
                                       spark_figures, spread, started_within)

LINE = ("2026-11-27 22:13:20,438 INFO streaming.sink: batch 9: 3248 records in, 0 deliveries, 0 acks, 0 expired, "
        "0 trashed, 0 receipts, 3890 ms (spark 3804, delta 85); routing query: plan 2007 ms, run 1298 ms")


def batch(n, records, ms, plan, spark=None, delta=0):
    return {"batch": n, "records": records, "ms": ms, "spark_ms": spark if spark is not None else ms, "delta_ms": delta,
            "plan_ms": plan, "run_ms": 0, "start": float(n), "end": n + ms / 1000}


def test_the_sink_line_gives_the_batch_its_split_and_when_it_ran():
    parsed = parse_sink_line(LINE)
    end = datetime(2026, 11, 27, 22, 13, 20, 438000).timestamp()  # the log's local time
    assert parsed == {"batch": 9, "records": 3248, "ms": 3890, "spark_ms": 3804, "delta_ms": 85,
                      "plan_ms": 2007, "run_ms": 1298, "end": end, "start": pytest.approx(end - 3.890)}


def test_other_lines_and_older_sink_lines_without_the_query_split():
    assert parse_sink_line("2026-11-27 22:13:20,438 INFO streaming.sink: batch 3: already committed, skipped") is None
    assert parse_sink_line("2026-11-27 22:13:20,438 INFO streaming.job: Spark master local[2]") is None
    older = parse_sink_line(LINE.split("; routing")[0])
    assert older["ms"] == 3890 and "plan_ms" not in older


def test_spread_is_nearest_rank():
    figures = spread([float(v) for v in range(100, 0, -1)])
    assert figures == {"n": 100, "p50": 50, "p90": 90, "p99": 99, "max": 100, "mean": 50.5}
    assert spread([])["p99"] is None


def test_planning_share_and_the_small_fast_batches():
    batches = [batch(0, 500, 200, 100), batch(1, 1000, 400, 300), batch(2, 5000, 250, 50), batch(3, 10, 300, 150)]
    figures = sink_figures(batches)
    assert figures["batches"] == 4
    assert figures["plan_share_pct"]["p50"] == 50  # 50, 75, 20, 50 % per batch
    assert figures["plan_share_of_sum_pct"] == round(100 * 600 / 1150, 1)
    # ≤ 1,000 commands: batches 0, 1 and 3; of those 0 and 3 took ≤ 300 ms; batch 2 is too big to count
    assert figures["small"] == {"batches": 3, "fast": 2, "fast_pct": 66.7}


def test_where_the_rest_of_a_batch_went():
    figures = sink_figures([{**batch(0, 10, 1000, 600, spark=800, delta=150), "run_ms": 120}])
    assert figures["kafka_wait_ms"]["p50"] == 50 and figures["delta_ms"]["p50"] == 150
    assert figures["other_spark_ms"]["p50"] == 80  # Spark's 800 ms: 600 planning, 120 running, 80 besides


def test_spark_figures_count_batches_that_read_rows():
    rows = [{"batch_id": 1, "num_input_rows": 900, "batch_duration_ms": 280, "add_batch_ms": 200},
            {"batch_id": 2, "num_input_rows": 3000, "batch_duration_ms": 900, "add_batch_ms": 700},
            {"batch_id": 3, "num_input_rows": 0, "batch_duration_ms": 5}]
    figures = spark_figures(rows)
    assert figures["batches"] == 2 and figures["small"] == {"batches": 1, "fast": 1, "fast_pct": 100.0}
    assert figures["phases_ms"]["add_batch_ms"]["max"] == 700


def test_batches_count_for_the_window_they_started_in():
    rows = [{"start": 9.0, "end": 10.5}, {"start": 10.0, "end": 12.0}, {"start": 19.5, "end": 23.0}, {"start": 21, "end": 22}]
    assert started_within(rows, 10, 20) == rows[1:3]


def test_a_delta_commit_names_its_micro_batch_through_its_app_transaction():
    commit = [json.dumps({"add": {"path": "part-0.parquet"}}),
              json.dumps({"txn": {"appId": "smqp-router:messages", "version": 42}}),
              json.dumps({"commitInfo": {"timestamp": 1764281600000}}), ""]
    assert committed_batch(commit) == 42
    assert committed_batch([json.dumps({"commitInfo": {"operation": "CREATE TABLE"}})]) is None


def test_latency_is_from_the_200_and_unseen_samples_are_infinitely_late():
    samples = [Sample(1, 0.0, 1.0, seen=1.5), Sample(2, 0.0, 2.0, seen=2.25), Sample(3, 0.0, 3.0)]
    summary = latencies(samples, "seen")
    assert summary["p50_ms"] == 500 and summary["p99_ms"] == math.inf
    assert summary["delivered"] == 2 and summary["not_delivered"] == 1


def test_alternating_runs_start_with_python():
    assert run_order("kafka", 2, alternate=True) == ["python", "kafka", "python", "kafka"]
    assert run_order("kafka", 2, alternate=False) == ["kafka", "kafka"]


def test_settings_become_the_stacks_environment():
    assert env_settings(["streaming.defer_while_busy_s=0", "kafka.linger_ms=5"]) == {
        "SMQP_STREAMING_DEFER_WHILE_BUSY_S": "0", "SMQP_KAFKA_LINGER_MS": "5"}
    with pytest.raises(ValueError):
        env_settings(["defer=0"])


def test_results_never_overwrite_an_earlier_file(tmp_path):
    first = result_path(tmp_path, "2026-11-27", "python")
    assert first.name == "job-latency-2026-11-27-python.json"
    first.write_text("{}")
    assert result_path(tmp_path, "2026-11-27", "python").name == "job-latency-2026-11-27-python-2.json"


def _phase(p99, fast_pct):
    summary = {"p50_ms": p99 / 2, "p90_ms": p99, "p99_ms": p99, "max_ms": p99, "mean_ms": 1.0, "delivered": 10,
               "not_delivered": 0}
    sink = sink_figures([batch(0, 100, 200 if fast_pct else 400, 100)])
    return {"visibility_get": summary, "visibility_delta": summary, "delivery_one": summary, "expiry_list": summary,
            "expiry_delta": summary, "publish": summary, "sink": sink, "spark": spark_figures([]),
            "load_avg_1m": [1.0, 2.0], "steal_pct": 31.0 if fast_pct else 2.5}


def test_the_table_says_how_much_cpu_the_host_stole_in_each_phase():
    table = render_table([{"source": "python", "index": 1, "phases": {"quiet": _phase(900, True)}},
                          {"source": "python", "index": 2, "phases": {"quiet": _phase(900, False)}}])
    line = next(row for row in table.splitlines() if row.startswith("quiet: host CPU stolen"))
    assert "31.0" in line and "2.5" in line


def test_the_table_puts_each_figure_beside_its_target_and_medians_are_per_source():
    runs = [{"source": "python", "index": 1, "phases": {"quiet": _phase(2500, True)}},
            {"source": "kafka", "index": 1, "phases": {"quiet": _phase(900, False)}},
            {"source": "python", "index": 2, "phases": {"quiet": _phase(1500, True)}}]
    table = render_table(runs)
    line = next(row for row in table.splitlines() if row.startswith("quiet: DELIVERY ONE"))
    assert "p99 ≤ 1,000" in line and "MISSED" in line and "ok" in line  # python#1 missed it, kafka#1 met it
    assert "python#1" in table and "kafka#1" in table and "python#2" in table
    by_source = medians(runs)
    assert by_source["python"]["runs"] == 2 and by_source["python"]["quiet"]["delivery_one"]["p99_ms"] == 2000
    assert by_source["kafka"]["quiet"]["sink_small_fast_pct"] == 0


def test_medians_print_per_source():
    from deploy.job_latency import render_medians

    runs = [{"source": "python", "index": i, "phases": {"quiet": _phase(p99, True), "load": _phase(p99, False)}}
            for i, p99 in ((1, 1000), (2, 3000))]
    text = render_medians(medians(runs))
    assert "python (2 runs)" in text
    line = next(row for row in text.splitlines() if row.startswith("load: DELIVERY ONE"))
    assert "1,000 / 2,000 / 2,000" in line  # medians of p50 (500, 1500), p90 and p99 (1000, 3000)
