"""The Kafka edge: durable appends and tails on asyncio.  It knows nothing of SMQP.

The gateway and the streaming job both reach Kafka through it, neither through the other.
All I/O runs in an asyncio event loop, with frames of our own (:mod:`kafka_edge.connection`),
the produce and fetch requests and their answers written and read by hand (:mod:`kafka_edge.wire`),
every other request by kafka-python's request and response classes, and record batches of our
own encoding (:mod:`kafka_edge.records`): no client threads.  kafka-python's own ``KafkaProducer`` and
``KafkaConsumer`` run a sender or poll thread each; in a gateway with two producers and two
consumers those threads and the loop took turns holding the GIL, and each append paid for the
hand-over (measured on this machine: ~74 µs of CPU per record for ``KafkaProducer`` on its own,
against ~11 µs for the same records framed here).

- :class:`~kafka_edge.append.DurableLog`: appends, batched per partition, acks=all.
- :class:`~kafka_edge.tail.Tail`: reads partitions from given offsets, handing on batches.
- :class:`~kafka_edge.threaded.ThreadedLog`: a ``DurableLog`` for threads without a loop.
- :class:`~kafka_edge.cluster.Cluster`: leaders and connections, shared by the above.

When Kafka is unreachable, appends fail after ``delivery_timeout_ms`` and tails keep retrying;
connections are retried every second at most, so a client goes on by itself once Kafka is back.
"""

from kafka_edge.append import Appended, DurableLog
from kafka_edge.cluster import Cluster
from kafka_edge.connection import KafkaUnavailable
from kafka_edge.settings import ClientSettings
from kafka_edge.tail import Tail
from kafka_edge.threaded import ThreadedLog

__all__ = ["Appended", "ClientSettings", "Cluster", "DurableLog", "KafkaUnavailable", "Tail", "ThreadedLog"]
