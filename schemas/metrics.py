"""The ``metrics`` Delta table: one row per micro-batch of a streaming query.

Written by :class:`streaming.metrics.MetricsRecorder` from Spark's
``StreamingQueryProgress`` (what ``StreamingQueryListener.onQueryProgress``
receives); read by ``smqp-sql``, the ops notebook and the dashboard.

A batch that Spark replays after a restart is recorded again under the new
``run_id``: the table is a log of observations, keyed by
``(run_id, batch_id)``, not by ``batch_id`` alone.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


def _struct(*columns: tuple[str, object]) -> StructType:
    return StructType([StructField(name, kind, True) for name, kind in columns])


#: One partition of one source, as of the end of the batch.
#: ``latest_offset`` is the end of the Kafka log (the partition's high
#: watermark) when the batch was recorded; ``lag = latest_offset - end_offset``
#: records not yet consumed. Both are null when neither the source nor the
#: recorder's probe could tell.
SOURCE_PARTITION = _struct(
    ("source", StringType()),  # the Kafka topic (or the source's description when unknown)
    ("partition", IntegerType()),
    ("start_offset", LongType()),
    ("end_offset", LongType()),
    ("latest_offset", LongType()),
    ("lag", LongType()),
)

#: Spark's ``durationMs`` phases that get a column of their own; every phase
#: (these and any other Spark adds) is also kept in the ``durations_ms`` map.
DURATION_PHASES: dict[str, str] = {
    "triggerExecution": "trigger_execution_ms",
    "latestOffset": "latest_offset_ms",
    "getBatch": "get_batch_ms",
    "queryPlanning": "query_planning_ms",
    "addBatch": "add_batch_ms",  # the foreachBatch sink: routing, Kafka emission, Delta commits
    "walCommit": "wal_commit_ms",
    "commitOffsets": "commit_offsets_ms",
}

#: Delta table ``metrics``.
METRICS_TABLE = _struct(
    ("query_name", StringType()),
    ("query_id", StringType()),  # stable across restarts of one checkpoint
    ("run_id", StringType()),  # new at every start
    ("batch_id", LongType()),
    ("timestamp", TimestampType()),  # when the batch's trigger started (Spark's progress.timestamp)
    ("num_input_rows", LongType()),
    ("input_rows_per_second", DoubleType()),  # arrival rate since the previous batch
    ("processed_rows_per_second", DoubleType()),  # rows / this batch's duration
    ("batch_duration_ms", LongType()),
    *((column, LongType()) for column in DURATION_PHASES.values()),
    ("durations_ms", MapType(StringType(), LongType())),
    ("state_rows_total", LongType()),  # summed over stateful operators; null when there are none
    ("state_rows_updated", LongType()),
    ("state_memory_bytes", LongType()),
    ("kafka_lag", LongType()),  # sum of ``partitions.lag``; null when no partition's lag is known
    ("partitions", ArrayType(SOURCE_PARTITION)),
    ("recorded_at", TimestampType()),  # when the recorder received the progress event
)
