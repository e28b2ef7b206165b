"""The SMQP routing job: Spark Structured Streaming over Kafka, committing to Delta.

- :mod:`streaming.routing` — pure ``DataFrame -> DataFrame`` transforms (all routing logic).
- :mod:`streaming.kafka_source` — the ``smqp_kafka`` Python data source (kafka-python).
- :mod:`streaming.sink` — the foreachBatch sink: Kafka emission and idempotent Delta commits.
- :mod:`streaming.session` / :mod:`streaming.job` — the Spark session and the runnable query.
"""

#: ``smqp-router``'s exit status when it refuses to start on what it found (a checkpoint that did not
#: write its tables): starting it again would not help, so neither smqp-local nor systemd does.
EXIT_REFUSED = 2
