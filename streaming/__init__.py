"""The SMQP routing job: Spark Structured Streaming over Kafka, committing to Delta.

- :mod:`streaming.routing` — pure ``DataFrame -> DataFrame`` transforms (all routing logic).
- :mod:`streaming.kafka_source` — the ``smqp_kafka`` Python data source (kafka-python).
- :mod:`streaming.sink` — the foreachBatch sink: Kafka emission and idempotent Delta commits.
- :mod:`streaming.session` / :mod:`streaming.job` — the Spark session and the runnable query.
"""
