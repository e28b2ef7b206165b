"""Tails: partitions of a topic read in the event loop, from their start or from given offsets.

A tail hands each fetched batch to its callback, converted record by record.  Each fetch waits at
the broker until a record is there (``fetch_min_bytes``), at most ``fetch_max_wait_ms``: Kafka
answers the moment a record is appended, so the wait costs no latency, and an idle tail asks
twice a second.  Where a partition ends is the high watermark every fetch answer carries, so
knowing that the tail has caught up costs no request of its own.  Partitions are assigned, not
joined as a consumer group: every reader here wants every record of its partitions, and keeps
its own position.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable

import kafka.errors as Errors

from kafka_edge.cluster import Cluster
from kafka_edge.connection import backoff
from kafka_edge.offsets import EARLIEST, list_offsets
from kafka_edge.records import read_batches
from kafka_edge.settings import ClientSettings
from kafka_edge.wire import fetch

log = logging.getLogger(__name__)

#: Bytes one fetch may bring back, per partition and in all: a tail catching up on a burst holds
#: no more than this (and its records) at once.  Reading 100,000 records of 250 B from offset 0
#: (deploy.kafka_clients, alternating runs): 692,000/s with 4 MiB, 597,000/s with 1 MiB.
FETCH_MAX_BYTES = 4 << 20


class Tail:
    """Reads partitions of a topic from their start (or from given offsets) in the event loop,
    handing each fetched batch to ``on_batch``: what ``convert(offset, key, value)`` made of each
    record (None drops it), in offset order per partition.  ``ready`` is set once the records
    present when it started have been read (every partition at its high watermark)."""

    def __init__(self, settings: ClientSettings, cluster: Cluster, topic: str, on_batch: Callable[[list], None],
                 convert: Callable, *, partitions: list[int] | None = None, name: str = "tail",
                 start: dict[int, int] | None = None):
        self._settings = settings
        self._cluster = cluster
        self._topic = topic
        self._topic_bytes = topic.encode()
        self._on_batch = on_batch
        self._convert = convert
        self._partitions = partitions
        self._start = start or {}
        self.name = name
        self.ready = asyncio.Event()
        self.positions: dict[int, int] = {}
        self.high_watermarks: dict[int, int] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # its owner cannot work without it
            log.error("%s stopped", self.name, exc_info=task.exception())
            asyncio.get_running_loop().stop()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def caught_up(self) -> bool:
        return bool(self.positions) and all(
            self.positions[p] >= self.high_watermarks.get(p, float("inf")) for p in self.positions)

    async def _run(self) -> None:
        partitions = self._partitions
        if partitions is None:
            partitions = await retrying(lambda: self._cluster.partitions(self._topic), self.name)
        self.positions = {p: self._start.get(p, 0) for p in partitions}
        attempt = 0
        fetching = asyncio.ensure_future(self._fetch_once())
        try:
            while True:
                try:
                    items, error = await fetching
                except Errors.KafkaError as failure:  # no leader known for any partition
                    items, error = [], failure
                if error is None:
                    attempt = 0
                    # the next fetch leaves before these records are handed on, so the broker gathers it
                    # meanwhile: a fold from offset 0 read 686,000 records/s so, 582,000 one fetch at a
                    # time (deploy.kafka_clients, alternating runs, bench-results/ab-tail-prefetch/)
                    fetching = asyncio.ensure_future(self._fetch_once())
                if items:
                    self._hand_on(items)
                if self.caught_up:
                    self.ready.set()
                if error is not None:
                    if attempt == 0:
                        log.warning("%s: %s; retrying", self.name, error)
                    if isinstance(error, Errors.InvalidMetadataError):
                        with contextlib.suppress(Errors.KafkaError):
                            await self._cluster.refresh()
                    await asyncio.sleep(backoff(attempt))
                    attempt += 1
                    fetching = asyncio.ensure_future(self._fetch_once())
        finally:
            fetching.cancel()
            if fetching.done() and not fetching.cancelled():
                fetching.exception()  # a failure nobody awaits any more: retrieved, not logged as lost

    def _hand_on(self, items: list) -> None:
        try:
            self._on_batch(items)
        except Exception:  # a bug handling some records must not stop the tail for all the others
            log.exception("%s: handling %d records failed", self.name, len(items))

    async def _fetch_once(self) -> tuple[list, Errors.KafkaError | None]:
        """One fetch from each leader of our partitions: what ``convert`` made of the records, in
        partition order, and the first leader's failure if one failed.  Positions move past what
        was read, so what the other leaders brought must be handed on whatever failed."""
        by_leader: dict[int | None, list[int]] = {}
        for partition in self.positions:
            by_leader.setdefault(await self._cluster.leader_node(self._topic, partition), []).append(partition)
        answers = await asyncio.gather(*(self._fetch(partitions) for partitions in by_leader.values()),
                                       return_exceptions=True)
        items, error = [], None
        for answer in answers:
            if isinstance(answer, Errors.KafkaError):
                error = error or answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                items += answer
        return items, error

    async def _fetch(self, partitions: list[int]) -> list:
        connection = await self._cluster.leader(self._topic, partitions[0], self.name)
        wait_ms = self._settings.fetch_max_wait_ms
        request = fetch(self._topic_bytes, {p: self.positions[p] for p in partitions}, wait_ms,
                        self._settings.fetch_min_bytes, FETCH_MAX_BYTES, FETCH_MAX_BYTES)
        error_code, answers = await connection.call(request, self._cluster.request_timeout + wait_ms / 1000)
        if error_code and not answers:
            raise Errors.for_code(error_code)(f"fetching {self._topic}")
        items = []
        for answer in answers:
            partition = answer.partition
            error = Errors.for_code(answer.error_code)
            if error is Errors.OffsetOutOfRangeError:  # deleted by retention: go on from the earliest kept
                self.positions[partition] = await self._earliest(partition)
                continue
            if error is not Errors.NoError:
                raise error(f"fetching {self._topic}/{partition}")
            self.high_watermarks[partition] = answer.high_watermark
            items += self._records(partition, answer.records)
        return items

    def _records(self, partition: int, data: bytes | None) -> list:
        """The converted records of one partition's fetched bytes, past its position; the position
        moves past every complete batch (control batches and records before it included)."""
        items, position, convert = [], self.positions[partition], self._convert
        for batch in read_batches(data or b"", f"{self._topic}/{partition}"):
            for offset, key, value in batch.records:
                if offset >= position and (item := convert(offset, key, value)) is not None:
                    items.append(item)
            position = max(position, batch.next_offset)
        self.positions[partition] = position
        return items

    async def _earliest(self, partition: int) -> int:
        [offset] = (await list_offsets(self._cluster, self._topic, [partition], EARLIEST)).values()
        log.warning("%s: %s/%d starts at %d (older records deleted)", self.name, self._topic, partition, offset)
        return offset


async def retrying(attempt_once, name: str):
    """``await attempt_once()`` until it does not fail with a Kafka error, backing off between tries."""
    attempt = 0
    while True:
        try:
            return await attempt_once()
        except Errors.KafkaError as error:
            if attempt == 0:
                log.warning("%s: %s; retrying", name, error)
            await asyncio.sleep(backoff(attempt))
            attempt += 1

