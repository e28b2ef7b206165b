"""The benchmark's arithmetic: what ``python -m deploy.compare`` prints must follow from what it measured."""

import json
import math

from deploy.compare_report import (
    batch_stats,
    comparison_rows,
    jsonable,
    latency_summary,
    memory_rows,
    percentile,
    render_table,
    rss_growth,
    sink_stats,
    summarize,
)

SETTINGS = {"publishers": 8, "latency_rate": 1000, "burst_rate": 5000, "fanout_subscribers": 10, "backlog": "50,000", "soak_rate": 200}


def test_percentiles_are_nearest_rank():
    samples = [float(v) for v in range(100, 0, -1)]  # 1..100 in reverse: the order must not matter
    assert percentile(samples, 0.5) == 50
    assert percentile(samples, 0.9) == 90
    assert percentile(samples, 0.99) == 99
    assert percentile([7.0], 0.99) == 7


def test_undelivered_messages_count_as_infinitely_late():
    delivered = [10.0] * 95  # 5 of 100 never arrived
    assert percentile(delivered, 0.5, missing=5) == 10
    assert percentile(delivered, 0.99, missing=5) == math.inf
    summary = latency_summary(delivered, sent=100)
    assert summary["p50_ms"] == 10 and summary["p90_ms"] == 10 and summary["p99_ms"] == math.inf
    assert summary["delivered"] == 95 and summary["not_delivered"] == 5


def test_summary_is_min_median_max_over_the_runs_that_produced_a_figure():
    assert summarize([300, 100, 200]) == {"min": 100, "median": 200, "max": 300, "runs": 3}
    assert summarize([5, None, 1]) == {"min": 1, "median": 3, "max": 5, "runs": 2}
    assert summarize([None, None]) is None
    # a run whose p99 was never delivered: the median is a real run's value, not an average with infinity
    assert summarize([400.0, math.inf])["median"] == 400


def test_memory_growth_compares_the_first_and_the_last_minute():
    ramp = [(t, 100 + t / 10) for t in range(0, 601, 5)]  # +1 MiB every 10 s for 10 minutes
    growth = rss_growth(ramp)
    assert growth["first_mb"] == 103.0  # mean over 0..60 s
    assert growth["last_mb"] == 157.0  # mean over 540..600 s
    assert growth["growth_mb"] == 54.0 and growth["growth_pct"] == 52.4
    flat = rss_growth([(t, 250 + (3 if t % 10 else -3)) for t in range(0, 601, 5)])
    assert abs(flat["growth_mb"]) < 1


def test_a_short_soak_still_compares_two_separate_stretches():
    growth = rss_growth([(t, 100.0 if t <= 40 else 130.0) for t in range(0, 121, 5)])  # 2-minute soak
    assert growth["window_s"] == 40  # a third of the span, not a minute that would overlap
    assert growth["first_mb"] == 100 and growth["last_mb"] == 130


def test_rows_carry_ratio_of_medians_and_the_issue_targets():
    results = {
        "ingest": {"smqp": [{"msgs_per_s": 4000}, {"msgs_per_s": 5000}, {"msgs_per_s": 4500}],
                   "rabbitmq": [{"msgs_per_s": 9000}, {"error": "ConnectionError"}, {"msgs_per_s": 9000}]},
        "latency": {"smqp": [{"p50_ms": 4.5, "p90_ms": 600.0, "p99_ms": math.inf}],
                    "rabbitmq": [{"p50_ms": 0.6, "p90_ms": 1.0, "p99_ms": 1.9}]},
        "burst": {"smqp": [{"p99_ms": 90.0, "not_delivered": 0}, {"p99_ms": 120.0, "not_delivered": 3},
                           {"p99_ms": 80.0, "not_delivered": 0}]},
        "fanout": {"smqp": [{"deliveries_per_s": 14000}], "rabbitmq": [{"deliveries_per_s": 10000}]},
        "soak": {"smqp": [{"delivered_pct": 99.9}], "rabbitmq": [{"delivered_pct": 100.0}]},
    }
    rows = {row["figure"]: row for row in comparison_rows(results, SETTINGS)}
    ingest = rows["ingest: 8 publishers, acknowledged publishes"]
    assert ingest["smqp"] == {"min": 4000, "median": 4500, "max": 5000, "runs": 3}
    assert ingest["rabbitmq"]["runs"] == 2  # the failed run is left out, not counted as zero
    assert ingest["ratio"] == 0.5 and ingest["met"] is False
    p50 = rows["publish -> delivery p50 at 1000 msg/s"]
    assert p50["met"] is True  # 4.5 ms against "at most 5 ms", whatever RabbitMQ did
    p99 = rows["publish -> delivery p99 at 1000 msg/s"]
    assert p99["met"] is False and p99["ratio"] is None
    burst = rows["publish -> delivery p99 at 5000 msg/s offered"]
    assert burst["smqp"]["median"] == 90 and burst["met"] is True and burst["target"] == "<= 100 ms"
    assert rows["  not delivered (dropped)"]["met"] is True  # the median run dropped none
    fanout = rows["fan-out: 1 topic -> 10 subscribers, acked deliveries"]
    assert fanout["ratio"] == 1.4 and fanout["met"] is False and fanout["target"] == ">= 1.5x RabbitMQ"
    assert rows["soak at 200 msg/s: its messages delivered by its end (+30 s)"]["met"] is False  # 99.9 of 100 %
    assert not any("drain" in figure for figure in rows)  # a workload that did not run has no row


def test_one_sided_run_has_rows_without_ratio():
    rows = comparison_rows({"drain": {"smqp": [{"msgs_per_s": 800}]}}, SETTINGS)
    assert rows[0]["rabbitmq"] is None and rows[0]["ratio"] is None and rows[0]["met"] is None


def test_memory_rows_sum_each_systems_processes_and_judge_flatness():
    peaks = {"smqp": {"gateway": 150.0, "Spark driver + JVM": 1850.0}, "rabbitmq": {"RabbitMQ beam.smp": 200.0}}
    soak = {"smqp": {"gateway": {"first_mb": 100, "last_mb": 112, "growth_mb": 12.0, "growth_pct": 12.0}},
            "rabbitmq": {"RabbitMQ beam.smp": {"first_mb": 200, "last_mb": 180, "growth_mb": -20.0,
                                                "growth_pct": -10.0}}}
    rows = {row["figure"]: row for row in memory_rows(peaks, soak, flat_pct=5)}
    total = rows["peak RSS: all server processes"]
    assert total["smqp"]["median"] == 2000 and total["rabbitmq"]["median"] == 200 and total["ratio"] == 10
    assert total["target"] == "<= 2x RabbitMQ" and total["met"] is False
    assert rows["RSS growth over the soak: gateway (first -> last minute)"]["met"] is False
    assert rows["RSS growth over the soak: RabbitMQ beam.smp (first -> last minute)"]["met"] is True  # shrank


def test_table_shows_median_spread_ratio_and_verdict():
    rows = comparison_rows({"fanout": {"smqp": [{"deliveries_per_s": 2700}, {"deliveries_per_s": 3000},
                                                {"deliveries_per_s": 2000}],
                                       "rabbitmq": [{"deliveries_per_s": 13500}]},
                            "latency": {"smqp": [{"p99_ms": math.inf}], "rabbitmq": [{"p99_ms": 1.9}]}}, SETTINGS)
    table = render_table(rows)
    assert "| fan-out: 1 topic -> 10 subscribers, acked deliveries (deliveries/s) | 2,700 (2,000-3,000) | 13,500 " \
           "| 0.20x | >= 1.5x RabbitMQ | NO |" in table
    assert "| not delivered | 1.9 |" in table
    failed = comparison_rows({"drain": {"smqp": [{"error": "SMQPError: 503"}, {"msgs_per_s": 20}],
                                        "rabbitmq": [{"msgs_per_s": 2700}]}}, SETTINGS)
    assert "| 20 (1 run failed) | 2,700 |" in render_table(failed)


def test_json_has_no_infinity():
    text = json.dumps(jsonable({"p99_ms": math.inf, "runs": [{"max_ms": -math.inf, "ok": 1.5}]}))
    assert json.loads(text) == {"p99_ms": None, "runs": [{"max_ms": None, "ok": 1.5}]}


def test_batch_time_is_split_into_phase_shares():
    batches = [
        {"batch_duration_ms": 1000, "num_input_rows": 500, "add_batch_ms": 700, "query_planning_ms": 100,
         "latest_offset_ms": 50, "get_batch_ms": 50, "wal_commit_ms": 20, "commit_offsets_ms": 30},
        {"batch_duration_ms": 200, "num_input_rows": 0, "add_batch_ms": 20, "query_planning_ms": 0,
         "latest_offset_ms": 60, "get_batch_ms": 0, "wal_commit_ms": 40, "commit_offsets_ms": 40},
    ]
    stats = batch_stats(batches)
    assert stats["batches"] == 2 and stats["input_rows"] == 500 and stats["rows_per_busy_batch"] == 500
    assert stats["phase_share_pct"]["add_batch_ms"] == 60.0  # 720 of 1200 ms
    assert stats["other_pct"] == 7.5  # 90 of the 1,200 ms are in no named phase
    assert batch_stats([]) is None


def test_sink_time_is_split_into_spark_delta_and_the_kafka_wait():
    stats = sink_stats([{"records": 900, "ms": 1000, "spark_ms": 800, "delta_ms": 150},
                        {"records": 100, "ms": 600, "spark_ms": 500, "delta_ms": 50}])
    assert stats["records"] == 1000 and stats["sink_ms_p50"] == 600
    assert (stats["spark_pct"], stats["delta_pct"], stats["kafka_wait_pct"]) == (81.2, 12.5, 6.2)
    assert (stats["plan_pct"], stats["run_pct"]) == (None, None)  # log lines from before the split
    assert sink_stats([]) is None


def test_the_routing_query_splits_into_planning_and_running_over_the_batches_that_log_it():
    stats = sink_stats([{"records": 900, "ms": 1000, "spark_ms": 800, "delta_ms": 150, "plan_ms": 600, "run_ms": 150},
                        {"records": 1, "ms": 500, "spark_ms": 400, "delta_ms": 50, "plan_ms": 300, "run_ms": 60},
                        {"records": 100, "ms": 600, "spark_ms": 500, "delta_ms": 50}])
    assert (stats["plan_pct"], stats["run_pct"]) == (60.0, 14.0)  # of the 1,500 ms of the two timed batches


def test_job_time_reads_the_sink_log_lines_with_and_without_the_query_split(tmp_path):
    from datetime import datetime

    from deploy.compare import job_time

    log = tmp_path / "job.log"
    log.write_text(
        "2026-11-23 07:00:01,100 INFO streaming.sink: batch 3: 900 records in, 900 deliveries, 0 acks, 0 expired, "
        "0 trashed, 0 receipts, 1000 ms (spark 800, delta 150); routing query: plan 600 ms, run 150 ms\n"
        "2026-11-23 07:00:02,100 INFO streaming.sink: batch 4: 100 records in, 100 deliveries, 0 acks, 0 expired, "
        "0 trashed, 0 receipts, 600 ms (spark 500, delta 50)\n"
        "2026-11-23 07:00:03,100 INFO streaming.sink: something else\n")
    start = datetime(2026, 11, 23, 7, 0, 0).timestamp()
    results = {"ingest": {"smqp": [{"started": start, "wall_s": 5.0}]}}
    sink = job_time(str(tmp_path / "no-metrics-table"), str(log), results)["ingest"]["sink"]
    assert (sink["batches"], sink["records"]) == (2, 1000)
    assert (sink["plan_pct"], sink["run_pct"]) == (60.0, 15.0)  # only batch 3 logged the split
