"""Shared fixtures: one real Apache Kafka node and one lean Spark session for the whole run."""

from __future__ import annotations

import os
import sys
import uuid

import pytest
from hypothesis import settings

from deploy.broker import KafkaBroker, create_topics
from schemas.config import KafkaConfig


# A property test failing in CI prints ``@reproduce_failure(...)``: its exact example, replayed on any
# machine.  The seed it prints alone did not reproduce a CI failure here (stop 55).  A test's own
# ``@settings`` keeps this for every field it does not set.
settings.register_profile("smqp", print_blob=True)
settings.load_profile("smqp")


def kafka_config(bootstrap: str, **kafka) -> KafkaConfig:
    """A Kafka configuration whose commands and deliveries topics are new ones of its own, created."""
    name = uuid.uuid4().hex[:8]
    config = KafkaConfig(bootstrap=bootstrap, commands_topic=f"cmd-{name}", deliveries_topic=f"dlv-{name}", **kafka)
    create_topics(config)
    return config


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """One Kafka node (a JVM) for the whole run; tests isolate themselves by topic names."""
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as running:
        yield running


@pytest.fixture(scope="session")
def spark():
    """A local[2] session: few shuffle partitions, no UI, UTC.  Its heap is 2g, not the job's 1g:
    one session serves ~1,000 tests, each with its own tables, queries and plans, and once ran out
    of 1g near the end of the suite (the job's own heap stays flat over a 10-minute soak)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from streaming.session import build_session
    from schemas.config import StreamingConfig

    session = build_session(StreamingConfig(spark_conf={"spark.driver.memory": "2g"}), app_name="smqp-tests")
    yield session
    session.stop()
