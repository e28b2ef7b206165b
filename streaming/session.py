"""The one way this project builds a SparkSession (the job and the tests share it).

Started as ``python -m streaming.job`` the process launches its own JVM, and
``[streaming] master`` plus the settings below decide everything.  Started by
``spark-submit`` (``deploy/spark-submit.sh``), the JVM already exists and holds
the operator's ``--master``, ``--conf`` and properties file: those win, and
this module only fills in what they leave unset (:func:`session_conf`).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from schemas.config import StreamingConfig

#: The lean defaults: few shuffle partitions, no UI, UTC, Arrow transfers on.
LEAN_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # 512 MiB, since the routing query's large relations are checkpointed and its batches bounded
    # (command_sink.LOCAL_RELATION_ROWS, [streaming] max_records_per_query_batch): with 1g the job's
    # peak RSS was 2,591-2,618 MiB, with 512m 2,070-2,082, throughput within the host's drift
    # (bench-results/ab-heap-512m/); a 100,000-command routing-query batch still routes (30 s).
    "spark.driver.memory": "512m",
    # The whole heap is committed (and touched) at start, as a long-running service's is: the JVM's
    # resident memory is then what it will stay at, instead of creeping up to the cap over minutes.
    # A JVM out of heap exits: the job then exits non-zero and smqp-local or systemd start it again on
    # its checkpoint.  Without it, an OutOfMemoryError while planning a batch left the JVM half alive
    # and the job up, routing nothing (bench-results/drain-oom-2026-11-29-4c3e5bf-job.log).
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -Xss4m -Xms512m -XX:+AlwaysPreTouch -XX:+ExitOnOutOfMemoryError",
    "spark.sql.streaming.metricsEnabled": "false",
    # Each trigger writes the checkpoint's offset log and commit log through Hadoop's FileContext; on a
    # local disk its default (ChecksumFs) writes a ".crc" sidecar beside each file and renames both.
    # Without it, a noop trigger's walCommit + commitOffsets went from 39 + 38 to 20 + 18 ms (p50, 50
    # triggers each, this host).  Neither fsyncs, so nothing is less durable.  Only file: paths.
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
    # The same for Hadoop's FileSystem API, which a local checkpoint is written through
    # (LOCAL_CHECKPOINT_CONF): no ".crc" sidecar to create and rename beside each log file.
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    # Micro-batches here are small and every batch is a new plan: compiling
    # generated code costs more than it saves, and so does adaptive
    # re-planning.  Measured on a 600-command batch: ~2.0 s → ~1.1 s.
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    # Spark keeps every finished query's plan and metrics for its UI (1,000 by default), even with the
    # UI off; a routing query's plan is hundreds of kilobytes, so that history alone fills the heap of
    # a long-running job (and of the test session).  Keep a few, for the event log and debugging.
    "spark.sql.ui.retainedExecutions": "20",
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    # delta-spark: SQL over Delta tables (time travel, DESCRIBE HISTORY, DML).  Its log replay would
    # otherwise run in 50 tasks for a table of a few files: 2-3 s per read here, against ~0.5 s.
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "1",
}

#: Set on the session for a checkpoint on a local disk (:func:`use_local_checkpoint_writes`): Spark
#: writes its offset and commit logs through Hadoop's FileSystem API instead of FileContext.  Without
#: Hadoop's native library (which no pip or Maven package brings), Hadoop's local file system starts a
#: child process for each permission it sets and each symbolic link it looks up: through FileContext,
#: a ``chmod`` and four ``readlink`` per file, two files a trigger; through FileSystem, one ``chmod``.
#: The write is as atomic (a temporary file, then rename(2)) and neither way fsyncs.  A noop trigger's
#: walCommit + commitOffsets p50 on this host (``python -m deploy.checkpoint_probe``): 18 + 16 ms →
#: 5 + 5; in the job, quiet, 19 + 17 → 7 + 6, and its JVM with the processes it started used 53 % of a
#: core → 40 (``bench-results/checkpoint-writes-2026-11-30/``).  A checkpoint elsewhere (HDFS, object
#: stores) keeps Spark's choice.
LOCAL_CHECKPOINT_CONF: Mapping[str, str] = {
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
}


def is_local_path(path: str) -> bool:
    """Whether ``path`` (a directory Spark writes to) is on this machine's disk: no scheme, or ``file:``."""
    scheme = urlparse(path).scheme
    return scheme in ("", "file")


def use_local_checkpoint_writes(spark: SparkSession, checkpoint_dir: str) -> None:
    """:data:`LOCAL_CHECKPOINT_CONF` on ``spark`` when ``checkpoint_dir`` is local, unless the operator
    set those properties (``--conf``, ``[streaming] spark_conf``): theirs win."""
    if not is_local_path(checkpoint_dir):
        return
    for key, value in LOCAL_CHECKPOINT_CONF.items():
        if spark.conf.get(key, None) is None:
            spark.conf.set(key, value)


#: The jar set (``deploy/spark-jars/pom.xml``) holding Spark's Kafka connector and delta-spark.
JARS = "spark-jars"


def job_jars() -> str:
    """``spark.jars``: the connector's and delta-spark's jar files, fetched into the cache on first use."""
    from deploy.jars import jar_files

    return ",".join(map(str, jar_files(JARS)))


def session_conf(config: StreamingConfig, submitted: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark properties this process sets on its session builder.

    Lean defaults, then ``config.shuffle_partitions`` and ``config.master``,
    then ``config.spark_conf``, then the job's jars (:func:`job_jars`) ahead of
    any ``spark.jars`` it names; ``submitted`` (the properties ``spark-submit``
    already gave the JVM, ``None`` when there is no spark-submit) removes every
    key it holds, so the command line always wins, as an operator expects.
    """
    conf = {
        **LEAN_CONF,
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.default.parallelism": str(config.shuffle_partitions),
        "spark.master": config.master,
        **{str(key): str(value) for key, value in config.spark_conf.items()},
    }
    if submitted is None:
        conf["spark.jars"] = ",".join(filter(None, [job_jars(), conf.get("spark.jars", "")]))
    else:  # the jars come with --jars (deploy/spark-submit.sh) or the image's jars directory
        conf = {key: value for key, value in conf.items() if key not in submitted}
    return conf


def submitted_conf() -> dict[str, str] | None:
    """The JVM's ``spark.*`` properties when spark-submit started this Python, else ``None``.

    spark-submit runs a Python application with ``PYSPARK_GATEWAY_PORT`` set
    (pyspark then connects to that JVM instead of launching one); its
    ``--master``, ``--conf`` and properties file are the JVM's system
    properties, which a fresh ``SparkConf`` loads.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def build_session(config: StreamingConfig, app_name: str) -> SparkSession:
    """A lean session (:func:`session_conf`) with the ``smqp_kafka`` source registered.

    Python workers start with this interpreter (``PYSPARK_PYTHON=sys.executable``;
    otherwise local workers may fail to connect back); under spark-submit an
    operator's ``PYSPARK_PYTHON`` (the executors' interpreter) is kept.
    """
    submitted = submitted_conf()
    if submitted is None:
        os.environ["PYSPARK_PYTHON"] = sys.executable
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    for key, value in session_conf(config, submitted).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    from streaming.kafka_source import KafkaDataSource

    session.dataSource.register(KafkaDataSource)
    return session
