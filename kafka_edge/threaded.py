"""Appends from threads that have no event loop: a :class:`DurableLog` on a loop of its own.

The streaming job's sink (Spark's foreachBatch, a plain thread) appends to the deliveries topic
with it.  Why not kafka-python's ``KafkaProducer``: its ``send`` costs ~49 µs of CPU per record
(measured on this machine: 50,000 records of 539 bytes, send + flush; this: ~7), and a fan-out of
5,000 messages to 10 subscribers makes 50,000 records to append, seconds of CPU on cores the
gateways share.  :class:`~kafka_edge.append.DurableLog` appends whole record batches of its own
encoding (:mod:`kafka_edge.records`), a few µs per record, with the same partitioning (murmur2 of
the key, as Kafka's default partitioner) and acks=all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from kafka_edge.append import DurableLog
from kafka_edge.cluster import Cluster
from kafka_edge.settings import ClientSettings

#: Seconds a flush waits for Kafka beyond the configured delivery timeout before failing the batch.
_FLUSH_GRACE_S = 5.0


class ThreadedLog:
    """Appends to ``topic`` from any thread; each :meth:`send` is one future for all its records."""

    def __init__(self, settings: ClientSettings, topic: str, client_id: str):
        self._settings = settings
        self._topic = topic
        self._cluster = Cluster(settings, client_id=client_id)
        self._log: DurableLog | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{client_id}-kafka", daemon=True)
        self._thread.start()
        try:
            self._log = self._run(DurableLog.open(settings, self._cluster, topic)).result()
        except BaseException:
            self.close()
            raise

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
        timeout = self._settings.delivery_timeout_ms / 1000 + _FLUSH_GRACE_S
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
