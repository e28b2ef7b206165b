"""``smqp_kafka``: a Spark Python streaming data source reading one Kafka topic.

It reads with kafka-python and emits the columns of Spark's own Kafka source
(``schemas.spark.KAFKA_RECORD``: key, value, topic, partition, offset,
timestamp, timestampType), so ``[streaming] source = "kafka"`` switches to
``format("kafka")`` where spark-sql-kafka's jars are on the cluster.

It is a :class:`~pyspark.sql.datasource.SimpleDataSourceStreamReader`: Spark
calls :meth:`KafkaStreamReader.read` on the driver (in one long-lived Python
planner process per query), which keeps **one** consumer alive across
micro-batches, so a batch costs one ``poll`` instead of a connection.

- Offsets are ``{"<partition>": next_offset}``, kept in Spark's checkpoint
  (manual ``assign`` + ``seek``, no consumer group, as Spark's own source).
- :meth:`~KafkaStreamReader.readBetweenOffsets` re-reads an exact range when
  Spark replays a batch after a restart; it runs on an executor with a fresh
  consumer and fails with a clear error if the range cannot be read in time.
- ``Trigger.AvailableNow`` is supported: the target is each partition's end
  when the query starts.
- ``deferWhileBusyMs``: a read that finds a burst of commands goes on reading
  while it lasts, up to that long, so a batch starts once the burst is over
  (:meth:`KafkaStreamReader._while_busy`).  A burst is commands coming at
  ``busyRate`` a second or faster: by their Kafka timestamps, over the last
  ``busyGapMs`` of what the read found, and then in each poll a ``busyGapMs``
  later (ticks do not count).  The gateways NOTIFY DELIVERY ALL
  messages without the job, so a burst's deliveries get the host's cores; the
  job then routes the burst in one batch, whose fixed cost (Delta commits) is
  paid once instead of every second or so.  Slower traffic is read and routed
  at once: what waits on the job (DELIVERY ONE, expiry, receipts) does not lag.

Options: ``bootstrap`` (required), ``topic`` (required),
``maxRecordsPerBatch`` (100000), ``pollTimeoutMs`` (50), ``catchUpTimeoutMs``
(2000: how long a read keeps polling while the broker is known to hold more
data than it has returned), ``replayTimeoutMs`` (60000), ``metadataTimeoutMs``
(10000: how long to wait for the topic to exist), ``deferWhileBusyMs`` (0: never),
``busyGapMs`` (200), ``busyRate`` (commands a second; 0: any command is a burst),
``maxRecordsPerQueryBatch`` (0: no bound; a batch holding a command the routing query must route
ends this many records in: :meth:`KafkaStreamReader._query_batch_end`).
"""

from __future__ import annotations

import logging
import time
from itertools import islice
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from schemas.config import StreamingConfig
from schemas.events import Tick
from schemas.spark import KAFKA_RECORD, arrow_schema
from streaming.simple_batch import NOT_SIMPLE_HEADS

log = logging.getLogger(__name__)

Offsets = dict[str, int]

#: The most one fetch brings back of a partition: 20,000 records of ~600 bytes (a batch takes more fetches).
MAX_PARTITION_FETCH_BYTES = 16 << 20


class _QueryCommandScan:
    """Where the first command the routing query must route stands in one read's ``kept``.

    ``kept`` only grows while a burst is deferred, and the reader asks after every poll: each
    call scans only the records added since the last (a full scan was ~15 ms per 100,000
    records, asked up to ~15 times a burst)."""

    def __init__(self) -> None:
        self.scanned = 0
        self.first: int | None = None

    def first_in(self, kept: list) -> int | None:
        """The index of the first record of ``kept`` that starts with a ``NOT_SIMPLE_HEADS``."""
        if self.first is None:
            self.first = next((n for n in range(self.scanned, len(kept))
                               if kept[n].value is not None and kept[n].value.startswith(NOT_SIMPLE_HEADS)),
                              None)
            self.scanned = len(kept)
        return self.first


class KafkaSourceError(RuntimeError):
    """The topic cannot be read as asked (missing topic, replay range unavailable …)."""


class KafkaDataSource(DataSource):
    """``spark.readStream.format("smqp_kafka").option("bootstrap", …).option("topic", …)``."""

    @classmethod
    def name(cls) -> str:
        return "smqp_kafka"

    def schema(self) -> StructType:
        return KAFKA_RECORD

    def simpleStreamReader(self, schema: StructType) -> KafkaStreamReader:
        options = {k.lower(): v for k, v in self.options.items()}
        missing = [name for name in ("bootstrap", "topic") if not options.get(name)]
        if missing:
            raise KafkaSourceError(f"smqp_kafka needs option(s) {missing}")
        given = {name: int(options[option]) for option, name in _NUMERIC_OPTIONS.items() if options.get(option)}
        return KafkaStreamReader(bootstrap=options["bootstrap"], topic=options["topic"], **given)


#: The numeric options (lower-cased) and the reader's parameters they set; one not given keeps the
#: parameter's default, so the defaults are written once, in :class:`KafkaStreamReader`.
_NUMERIC_OPTIONS = {"maxrecordsperbatch": "max_records", "polltimeoutms": "poll_timeout_ms",
                    "catchuptimeoutms": "catch_up_timeout_ms", "replaytimeoutms": "replay_timeout_ms",
                    "metadatatimeoutms": "metadata_timeout_ms",
                    "deferwhilebusyms": "defer_while_busy_ms", "busygapms": "busy_gap_ms",
                    "busyrate": "busy_rate", "maxrecordsperquerybatch": "max_records_per_query_batch"}


def _records_to_batch(records: list, schema: pa.Schema) -> pa.RecordBatch:
    """kafka-python ``ConsumerRecord``s → one Arrow batch with the KAFKA_RECORD columns."""
    return pa.RecordBatch.from_arrays([
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp * 1000 if r.timestamp is not None and r.timestamp >= 0 else None
                  for r in records], schema.field("timestamp").type),
        pa.array([r.timestamp_type for r in records], pa.int32()),
    ], schema=schema)


class KafkaStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver-side reader keeping one kafka-python consumer across micro-batches."""

    def __init__(self, bootstrap: str, topic: str, max_records: int = StreamingConfig.max_records_per_batch,
                 poll_timeout_ms: int = StreamingConfig.poll_timeout_ms,
                 catch_up_timeout_ms: int = 2000, replay_timeout_ms: int = 60000,
                 metadata_timeout_ms: int = 10000,
                 defer_while_busy_ms: int = 0, busy_gap_ms: int = StreamingConfig.busy_gap_ms,
                 busy_rate: int = 0, max_records_per_query_batch: int = 0):
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_records = max_records
        self.poll_timeout_ms = poll_timeout_ms
        self.catch_up_timeout_ms = catch_up_timeout_ms
        self.replay_timeout_ms = replay_timeout_ms
        self.metadata_timeout_ms = metadata_timeout_ms
        self.defer_while_busy_ms = defer_while_busy_ms
        self.busy_gap_ms = busy_gap_ms
        self.busy_rate = busy_rate
        self.max_records_per_query_batch = max_records_per_query_batch
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow end offsets
        self._consumer = None  # created lazily, never pickled
        self._positions: dict[int, int] = {}  # where the live consumer stands, per partition

    # -- pickling: the reader travels to executors for replays; clients do not

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_consumer"] = None
        state["_positions"] = {}
        return state

    # -- kafka-python plumbing

    def _new_consumer(self):
        from kafka import KafkaConsumer

        return KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=max(10, self.poll_timeout_ms),
            max_poll_records=self.max_records,
            client_id="smqp-streaming-source",
            # kafka-python's default (1 MiB a partition) brings ~1,600 publishes per fetch: a burst's
            # batch of 100,000 commands would take 60 round trips
            max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
        )

    def _client(self):
        if self._consumer is None:
            self._consumer = self._new_consumer()
            self._positions = {}
        return self._consumer

    def _partitions(self, consumer) -> list[int]:
        timeout_s = self.metadata_timeout_ms / 1000
        deadline = time.monotonic() + timeout_s
        while True:
            partitions = consumer.partitions_for_topic(self.topic)
            if partitions:
                return sorted(partitions)
            if time.monotonic() > deadline:
                raise KafkaSourceError(
                    f"Kafka topic {self.topic!r} not found on {self.bootstrap} after {timeout_s:.0f}s; "
                    "create it first (deploy.broker.create_topics)")
            time.sleep(0.1)

    def _tp(self, partition: int):
        from kafka import TopicPartition

        return TopicPartition(self.topic, partition)

    def _assign(self, consumer, partitions: list[int]) -> None:
        wanted = {self._tp(p) for p in partitions}
        if set(consumer.assignment()) != wanted:
            consumer.assign(sorted(wanted, key=lambda tp: tp.partition))
            self._positions = {}

    # -- the SimpleDataSourceStreamReader contract

    def initialOffset(self) -> Offsets:
        """Earliest: the beginning offset of every partition."""
        consumer = self._client()
        partitions = self._partitions(consumer)
        beginning = consumer.beginning_offsets([self._tp(p) for p in partitions])
        return {str(p): int(beginning.get(self._tp(p)) or 0) for p in partitions}

    def prepareForTriggerAvailableNow(self) -> None:
        """Record each partition's end now (ListOffsets); reads never go past it."""
        probe = self._new_consumer()
        try:
            tps = [self._tp(p) for p in self._partitions(probe)]
            self._target = {tp.partition: int(offset) for tp, offset in probe.end_offsets(tps).items()}
        finally:
            probe.close()

    def read(self, start: Offsets) -> tuple[Iterator[pa.RecordBatch], Offsets]:
        """Everything available after ``start``, at most ``maxRecordsPerBatch`` records (:meth:`_poll`).

        "Nothing new" really means nothing new: while a poll returns nothing but the broker is
        known to hold more (high watermark unknown yet or beyond our position), it polls again.
        """
        consumer = self._client()
        partitions = self._partitions(consumer)
        self._assign(consumer, partitions)
        begin = {p: int(start.get(str(p), 0)) for p in partitions}
        for p, offset in begin.items():
            if self._positions.get(p) != offset:
                consumer.seek(self._tp(p), offset)
                self._positions[p] = offset
        limit = self.max_records
        if self._target is not None:
            limit = min(limit, sum(max(0, self._target.get(p, 0) - begin[p]) for p in partitions))
        kept: list = []
        if limit > 0:
            scan = _QueryCommandScan()
            self._poll(consumer, partitions, limit, kept)
            self._while_busy(consumer, partitions, limit, kept, scan)
            del kept[self._query_batch_end(kept, scan):]
        end = dict(begin)
        for record in kept:
            end[record.partition] = max(end[record.partition], record.offset + 1)
        for p in partitions:  # where the consumer really stands (past ``end`` if it ran over a target)
            self._positions[p] = consumer.position(self._tp(p))
        offsets = {str(p): end[p] for p in partitions}
        if not kept:
            return iter([]), offsets
        return iter([_records_to_batch(kept, _ARROW_SCHEMA)]), offsets

    def _while_busy(self, consumer, partitions: list[int], limit: int, kept: list,
                    scan: _QueryCommandScan) -> None:
        """Go on adding to ``kept`` while a burst of commands lasts (``deferWhileBusyMs``).

        A read whose commands came at ``busyRate`` a second or faster (:meth:`_burst`) polls again
        every ``busyGapMs``, keeping what it gets, until a poll brings fewer than a gap's worth of
        commands at that rate (the burst is over), the batch is full, or ``deferWhileBusyMs`` has
        passed.  Slower traffic is not deferred: it is what DELIVERY ONE, expiry and receipts
        wait on, and the job keeps up with it.  Ticks are not traffic: a tick interval under
        ``busyGapMs`` would otherwise defer every batch, and the expiry the ticks drive with it."""
        if self.defer_while_busy_ms <= 0 or self._target is not None or not self._burst(kept):
            return
        deadline = time.monotonic() + self.defer_while_busy_ms / 1000
        while len(kept) < limit and self._query_batch_end(kept, scan) == len(kept) \
                and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(self.busy_gap_ms / 1000, left))
            before = len(kept)
            self._poll(consumer, partitions, limit, kept)
            if _commands(islice(kept, before, None)) < self._gap_worth():
                break

    def _query_batch_end(self, kept: list, scan: _QueryCommandScan) -> int:
        """How many of ``kept`` this batch keeps: all, unless a command the routing query must route
        (:data:`streaming.simple_batch.NOT_SIMPLE_HEADS`) is among them and they are more than
        ``maxRecordsPerQueryBatch``.  Then the batch ends that many records in, or just before that
        command when it comes later; the next batches read the rest again.

        Why: the query's time grows with its rows (~2 s at 1,000, 4-6 s at 20,000, and 100,000 once
        ran the driver's heap out), while a simple batch is routed on the driver.  A SUBSCRIBE that
        came with a backlog held the whole backlog's routing up, 54 s in the drain benchmark."""
        bound = self.max_records_per_query_batch
        if bound <= 0 or len(kept) <= bound:
            return len(kept)
        first = scan.first_in(kept)
        if first is None:
            return len(kept)
        return first if first >= bound else bound

    def _gap_worth(self) -> int:
        """The commands a ``busyGapMs`` brings at ``busyRate`` (at least one)."""
        return max(1, self.busy_rate * self.busy_gap_ms // 1000)

    def _burst(self, records: list) -> bool:
        """Whether ``records`` end in a burst: commands at ``busyRate`` a second or faster over the last
        ``busyGapMs`` before the newest, by their Kafka timestamps (the appenders' clocks, never the
        job's: a gateway whose clock is behind only makes a burst look slower).  Traffic that began
        less than a gap ago is judged over the time it has run, but at least a tenth of a gap, so a
        read that comes just after a burst began defers it whole, and two lone commands a moment
        apart are no burst."""
        stamps = [r.timestamp for r in records if not Tick.encodes(r.value)]
        if not stamps:
            return False
        newest = max(stamps)
        recent = [stamp for stamp in stamps if stamp >= newest - self.busy_gap_ms]
        span_ms = max(newest - min(recent), self.busy_gap_ms / 10, 1)
        return len(recent) * 1000 / span_ms >= max(self.busy_rate, 1)

    def _poll(self, consumer, partitions: list[int], limit: int, kept: list) -> None:
        """Add to ``kept`` the records this batch reads (none past the AvailableNow target).

        Polls again, up to ``catchUpTimeoutMs``, while the broker holds more and there is nothing
        to read, or a partition behind has given nothing yet (a fetch filled by one partition
        brings nothing of another).  Never ``pause``: a partition paused with records buffered,
        sought and resumed was not fetched again by kafka-python while another partition kept it
        busy."""
        deadline = time.monotonic() + self.catch_up_timeout_ms / 1000
        answered: set[int] = set()
        while True:
            polled = consumer.poll(timeout_ms=self.poll_timeout_ms, max_records=limit - len(kept))
            answered.update(tp.partition for tp, batch in polled.items() if batch)
            behind = [p for p in partitions if self._behind(consumer, [p])]
            starved = [p for p in behind if p not in answered]
            kept.extend(r for batch in polled.values() for r in batch
                        if self._target is None or r.offset < self._target.get(r.partition, 0))
            more = starved if kept else behind
            if not more or time.monotonic() > deadline or len(kept) >= limit:
                return

    def _behind(self, consumer, partitions: list[int]) -> bool:
        """True while some partition's known end (high watermark, capped by the target) is ahead of us."""
        for p in partitions:
            tp = self._tp(p)
            highwater = consumer.highwater(tp)
            goal = highwater
            if self._target is not None:
                goal = self._target.get(p, 0) if highwater is None else min(self._target.get(p, 0), highwater)
            if goal is None or goal > consumer.position(tp):
                return True
        return False

    def readBetweenOffsets(self, start: Offsets, end: Offsets) -> Iterator[pa.RecordBatch]:
        """Exactly the records in ``[start, end)`` of every partition (a replayed batch)."""
        wanted = {int(p): (int(start.get(p, 0)), int(stop)) for p, stop in end.items()
                  if int(stop) > int(start.get(p, 0))}
        if not wanted:
            return iter([])
        consumer = self._new_consumer()
        try:
            tps = {p: self._tp(p) for p in wanted}
            consumer.assign(list(tps.values()))
            for p, (first, _) in wanted.items():
                consumer.seek(tps[p], first)
            records = []
            remaining = dict(wanted)
            deadline = time.monotonic() + self.replay_timeout_ms / 1000
            while remaining:
                if time.monotonic() > deadline:
                    missing = {p: f"{consumer.position(tps[p])}..{stop}" for p, (_, stop) in remaining.items()}
                    raise KafkaSourceError(
                        f"replay of {self.topic!r} offsets {start} → {end} incomplete after "
                        f"{self.replay_timeout_ms} ms; still missing {missing} (deleted by retention, "
                        "or a different broker?)")
                polled = consumer.poll(timeout_ms=max(self.poll_timeout_ms, 100))
                for batch in polled.values():
                    for record in batch:
                        stop = wanted[record.partition][1]
                        if record.offset < stop:
                            records.append(record)
                for p in list(remaining):
                    if consumer.position(tps[p]) >= remaining[p][1]:
                        del remaining[p]
                        consumer.pause(tps[p])
        finally:
            consumer.close()
        records.sort(key=lambda r: (r.partition, r.offset))
        return iter([_records_to_batch(records, _ARROW_SCHEMA)]) if records else iter([])

    def commit(self, end: Offsets) -> None:
        """Offsets live in Spark's checkpoint; nothing to commit to Kafka."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _commands(records) -> int:
    """How many of ``records`` are anything but the job's own :class:`~schemas.events.Tick`."""
    return sum(1 for record in records if not Tick.encodes(record.value))


_ARROW_SCHEMA = arrow_schema(KAFKA_RECORD)
