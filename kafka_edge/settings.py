"""What the Kafka edge reads of a configuration.

The edge takes any object with these attributes; the project passes its one configuration
object's ``[kafka]`` section (``schemas.config.KafkaConfig``), which documents each default.
"""

from __future__ import annotations

from typing import Protocol


class ClientSettings(Protocol):
    #: ``host:port[,host:port…]``: where to find the cluster
    bootstrap: str
    #: an append Kafka has not acknowledged by then fails (and each request waits at most 5 s of it)
    delivery_timeout_ms: int
    #: how long an append that may share its request waits for others (Kafka's ``linger.ms``) …
    linger_ms: int
    #: … until this many bytes wait (Kafka's ``batch.size``)
    batch_bytes: int
    #: the longest a fetch waits at the broker for records (Kafka's ``fetch.max.wait.ms``)
    fetch_max_wait_ms: int
    #: a fetch is answered once this many bytes are there (Kafka's ``fetch.min.bytes``)
    fetch_min_bytes: int
