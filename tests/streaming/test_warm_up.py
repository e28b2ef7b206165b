"""The routing query warmed up before the job's stream starts (``streaming.warm_up``)."""

from __future__ import annotations

from pathlib import Path

from schemas.config import load_config
from streaming.warm_up import warm_up


def test_the_warm_up_runs_the_routing_query_and_leaves_the_jobs_data_and_kafka_alone(spark, tmp_path):
    """It must plan the routing query itself (the slow part on a cold JVM), not the driver's simple
    route; and a user's tables, checkpoint and deliveries topic must not see its made-up commands."""
    config = load_config(env={}, data_dir=str(tmp_path / "data"),
                         kafka={"bootstrap": "127.0.0.1:9"})  # nothing listens: any send would fail

    sink = warm_up(spark, config)

    assert sink.query_ms["plan"] > 0 and sink.query_ms["run"] > 0
    assert sink._producer is None
    assert not Path(config.data_dir).exists()
    assert not Path(sink.config.data_dir).exists()  # its scratch directory is gone too
