"""The sink's appends to ``smqp.deliveries``: the gateway's own producer, on an event loop of its own.

Why not kafka-python's ``KafkaProducer``: its ``send`` costs ~49 µs of CPU per record (measured on
this box against the dev broker: 50,000 ``Deliver`` records of 539 bytes, send + flush; this: ~7), and a
fan-out of 5,000 messages to 10 subscribers makes 50,000 ``Deliver`` records (and 50,000 ``Acked``,
which the sink joins into a few ``AckedBatch`` records) — seconds of the job's CPU on the cores the
gateways share.  :class:`gateway.kafka_io.DurableLog`
appends whole record batches of its own encoding (``gateway.kafka_records``), a few µs per record,
with the same partitioning (murmur2 of the key, as Kafka's default partitioner) and acks=all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from gateway.kafka_io import Cluster, DurableLog
from schemas.config import KafkaConfig

#: Seconds a flush waits for Kafka beyond the configured delivery timeout before failing the batch.
_FLUSH_GRACE_S = 5.0


class DeliveriesLog:
    """Appends to the deliveries topic from any thread; each :meth:`send` is one future for all its
    records."""

    def __init__(self, config: KafkaConfig, client_id: str):
        self._config = config
        self._cluster = Cluster(config, client_id=client_id)
        self._log: DurableLog | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{client_id}-kafka", daemon=True)
        self._thread.start()
        try:
            self._log = self._run(self._open()).result()
        except BaseException:
            self.close()
            raise

    async def _open(self) -> DurableLog:
        topic = self._config.deliveries_topic
        return DurableLog(self._config, self._cluster, await self._cluster.partitions(topic), topic=topic)

    async def _close(self) -> None:
        if self._log is not None:
            await self._log.close()
        self._cluster.close()

    def _run(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    @property
    def partitions(self) -> list[int]:
        return self._log.partitions

    def partition_for(self, key: bytes | None) -> int:
        """The partition a record keyed ``key`` goes to (Kafka's default partitioner)."""
        return self._log.partition_for(key)

    def send(self, records: list[tuple[bytes | None, bytes, int | None]]) -> concurrent.futures.Future:
        """Append ``(key, value, partition or None)`` records in order; the future holds the errors
        of those Kafka did not take (empty when all are durable)."""
        return self._run(self._append(records))

    async def _append(self, records) -> list[BaseException]:
        appends = [self._log.append(key, value, partition=partition) for key, value, partition in records]
        results = await asyncio.gather(*appends, return_exceptions=True)
        return [result for result in results if isinstance(result, BaseException)]

    def wait(self, sends: list[concurrent.futures.Future]) -> list[BaseException]:
        """The errors of ``sends`` once all are settled (each record fails by its delivery timeout)."""
        timeout = self._config.delivery_timeout_ms / 1000 + _FLUSH_GRACE_S
        errors = []
        for send in sends:
            try:
                errors += send.result(timeout=timeout)
            except concurrent.futures.TimeoutError as error:
                errors.append(error)
        return errors

    def close(self) -> None:
        """Let what is being appended finish (a few seconds at most), then stop the loop's thread."""
        self._run(self._close()).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
