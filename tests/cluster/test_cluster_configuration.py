"""What the job asks of Spark on a cluster, checked without a cluster:
the reader options of both commands sources, and which Spark properties the session sets
itself versus leaves to spark-submit."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, TimestampType

from schemas.config import load_config
from schemas.spark import KAFKA_RECORD
from streaming.job import source_options
from streaming.kafka_source import KafkaDataSource
from streaming.session import LEAN_CONF, session_conf

KAFKA = {"bootstrap": "k1:9092,k2:9092", "commands_topic": "prod.commands"}


def test_the_default_source_is_ours_over_kafka_python():
    config = load_config(env={}, kafka=KAFKA,
                         streaming={"max_records_per_batch": 5000, "poll_timeout_ms": 20, "defer_while_busy_s": 1.5,
                                    "max_records_per_query_batch": 700})
    assert source_options(config) == ("smqp_kafka", {
        "bootstrap": "k1:9092,k2:9092", "topic": "prod.commands", "maxRecordsPerBatch": "5000",
        "maxRecordsPerQueryBatch": "700", "pollTimeoutMs": "20", "deferWhileBusyMs": "1500", "busyGapMs": "200",
        "busyRate": "5000"})


def test_source_kafka_maps_the_configuration_to_sparks_kafka_source_options():
    config = load_config(env={"SMQP_STREAMING_SOURCE": "kafka"}, kafka=KAFKA,
                         streaming={"max_records_per_batch": 5000})
    assert source_options(config) == ("kafka", {
        "kafka.bootstrap.servers": "k1:9092,k2:9092",
        "subscribe": "prod.commands",
        "startingOffsets": "earliest",  # a new checkpoint routes the whole log, as smqp_kafka does
        "maxOffsetsPerTrigger": "5000",
        "failOnDataLoss": "true",  # never skip commands that retention deleted
        "includeHeaders": "false",  # no headers column: the same columns as smqp_kafka
        # the executor's consumer prefetches past each batch; Kafka's 500 ms default held the next
        # batch's fetch behind that wait (a quiet batch 220 ms to reach the driver, 35 with 5: deploy.kafka_source_probe)
        "kafka.fetch.max.wait.ms": "5",
    })


def test_both_sources_emit_the_columns_of_sparks_kafka_source():
    """Spark's Kafka source always emits these seven columns (Structured Streaming + Kafka
    Integration Guide, "Reading Data from Kafka"); ours declares the same names and types, and
    the job selects exactly them from either source."""
    spark_kafka = [("key", BinaryType()), ("value", BinaryType()), ("topic", StringType()),
                   ("partition", IntegerType()), ("offset", LongType()), ("timestamp", TimestampType()),
                   ("timestampType", IntegerType())]
    assert [(f.name, f.dataType) for f in KAFKA_RECORD.fields] == spark_kafka
    assert KafkaDataSource(options={}).schema() == KAFKA_RECORD


def test_an_unknown_source_is_refused_with_the_choices():
    with pytest.raises(ValueError, match='source must be "python" or "kafka"'):
        load_config(env={"SMQP_STREAMING_SOURCE": "kinesis"})


def test_the_session_sets_master_lean_defaults_and_configured_properties(tmp_path):
    path = tmp_path / "smqp.toml"
    path.write_text('[streaming]\nmaster = "spark://10.0.0.5:7077"\nshuffle_partitions = 4\n'
                    '[streaming.spark_conf]\n"spark.executor.memory" = "2g"\n"spark.ui.enabled" = "true"\n')
    conf = session_conf(load_config(path, env={}).streaming)
    assert conf["spark.master"] == "spark://10.0.0.5:7077"
    assert conf["spark.executor.memory"] == "2g"
    assert conf["spark.ui.enabled"] == "true"  # the configuration wins over a lean default
    assert conf["spark.sql.shuffle.partitions"] == "4"
    assert conf["spark.sql.codegen.wholeStage"] == LEAN_CONF["spark.sql.codegen.wholeStage"]


def test_the_session_loads_the_connector_and_delta_jars_ahead_of_the_operators_own(tmp_path):
    config = load_config(env={}, streaming={"spark_conf": {"spark.jars": "/opt/extra/udfs.jar"}})
    jars = session_conf(config.streaming)["spark.jars"].split(",")
    names = [jar.rsplit("/", 1)[-1] for jar in jars]
    assert "spark-sql-kafka-0-10_2.13-4.2.0.jar" in names and "delta-spark_2.13-4.4.0.jar" in names
    assert jars[-1] == "/opt/extra/udfs.jar"


def test_under_spark_submit_its_master_and_conf_win():
    config = load_config(env={}, streaming={"spark_conf": {"spark.executor.memory": "2g", "spark.cores.max": "8"}})
    submitted = {"spark.master": "spark://127.0.0.1:7077", "spark.executor.memory": "512m",
                 "spark.ui.enabled": "true", "spark.app.name": "job.py"}
    conf = session_conf(config.streaming, submitted)
    assert not set(conf) & set(submitted)  # the session sets none of what spark-submit already set
    assert conf["spark.cores.max"] == "8"
    assert conf["spark.sql.session.timeZone"] == "UTC"
