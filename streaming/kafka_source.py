"""``smqp_kafka``: a Spark Python streaming data source reading one Kafka topic.

Spark's own Kafka source (spark-sql-kafka) cannot be fetched here (no Maven),
so this source reads with kafka-python and emits the same columns
(``schemas.spark.KAFKA_RECORD``: key, value, topic, partition, offset,
timestamp, timestampType); a cluster that has spark-sql-kafka can switch to
``format("kafka")`` by configuration.

It is a :class:`~pyspark.sql.datasource.SimpleDataSourceStreamReader`: Spark
calls :meth:`KafkaStreamReader.read` on the driver (in one long-lived Python
planner process per query), which keeps **one** consumer alive across
micro-batches, so a batch costs one ``poll`` instead of a connection.

- Offsets are ``{"<partition>": next_offset}``, kept in Spark's checkpoint
  (manual ``assign`` + ``seek``; consumer groups are never used — they never
  complete on the tansu dev broker, and Spark does the same).
- The end of a partition is the fetch response's high watermark
  (``consumer.highwater``), never ListOffsets(latest), which tansu
  under-reports.
- :meth:`~KafkaStreamReader.readBetweenOffsets` re-reads an exact range when
  Spark replays a batch after a restart; it runs on an executor with a fresh
  consumer and fails with a clear error if the range cannot be read in time.
- ``Trigger.AvailableNow`` is supported: the target is each partition's high
  watermark when the query starts.
- ``ackPartition``: the commands topic's partition of ACKs.  Each of its records
  carries an ``smqp.after`` header (:data:`schemas.events.AFTER_HEADER`), the
  partition-0 offset its publish lies below; a batch reads it only once it
  reads partition 0 that far, and leaves it and what follows it for a later
  batch otherwise — an ACK never reaches the job before its publish.

- ``deferWhileBusyMs``: a read that finds commands goes on reading while they
  keep coming (a poll every ``busyGapMs`` brings more; ticks do not count), up
  to that long, so a batch starts once the burst is over (:meth:`KafkaStreamReader._while_busy`).
  The gateways NOTIFY DELIVERY ALL messages without the job, so a burst's
  deliveries get the host's cores; the job then routes the burst in one batch,
  whose fixed cost (planning, Delta commits) is paid once instead of every
  second or so.  Meanwhile the ACKs' partition is not fetched, only its end
  asked for (ACKs still coming keep the read going); its ACKs are read in one
  go once the burst is over, the ones held for their publish among them.

Options: ``bootstrap`` (required), ``topic`` (required),
``maxRecordsPerBatch`` (100000), ``pollTimeoutMs`` (50), ``catchUpTimeoutMs``
(2000: how long a read keeps polling while the broker is known to hold more
data than it has returned), ``replayTimeoutMs`` (60000), ``metadataTimeoutMs``
(10000: how long to wait for the topic to exist), ``ackPartition`` (none),
``deferWhileBusyMs`` (0: never), ``busyGapMs`` (200).
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
from schemas.events import AFTER_HEADER, Tick
from schemas.spark import KAFKA_RECORD, arrow_schema

log = logging.getLogger(__name__)

Offsets = dict[str, int]

#: The most one fetch brings back of a partition: 20,000 records of ~600 bytes (a batch takes more fetches).
MAX_PARTITION_FETCH_BYTES = 16 << 20


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
                    "metadatatimeoutms": "metadata_timeout_ms", "ackpartition": "ack_partition",
                    "deferwhilebusyms": "defer_while_busy_ms", "busygapms": "busy_gap_ms"}


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
                 metadata_timeout_ms: int = 10000, ack_partition: int | None = None,
                 defer_while_busy_ms: int = 0, busy_gap_ms: int = StreamingConfig.busy_gap_ms):
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_records = max_records
        self.poll_timeout_ms = poll_timeout_ms
        self.catch_up_timeout_ms = catch_up_timeout_ms
        self.replay_timeout_ms = replay_timeout_ms
        self.metadata_timeout_ms = metadata_timeout_ms
        self.ack_partition = ack_partition
        self.defer_while_busy_ms = defer_while_busy_ms
        self.busy_gap_ms = busy_gap_ms
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
            # kafka-python's default (1 MiB a partition) cut each fetch of a two-partition topic to
            # ~1,600 publishes from the dev broker, which answers a one-partition fetch with ~5 MB:
            # batches of the commands topic, ACKs' partition beside it, shrank to a fifth
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
        """Record each partition's high watermark now; reads never go past it."""
        probe = self._new_consumer()
        try:
            partitions = self._partitions(probe)
            tps = [self._tp(p) for p in partitions]
            probe.assign(tps)
            # ListOffsets(latest) may under-report on tansu; a fetch from there returns
            # the true high watermark.
            for tp, offset in probe.end_offsets(tps).items():
                probe.seek(tp, offset)
            deadline = time.monotonic() + self.replay_timeout_ms / 1000
            while any(probe.highwater(tp) is None for tp in tps):
                if time.monotonic() > deadline:
                    raise KafkaSourceError(f"no high watermark for {self.topic!r} from {self.bootstrap}")
                probe.poll(timeout_ms=self.poll_timeout_ms, max_records=1, update_offsets=False)
            self._target = {tp.partition: probe.highwater(tp) for tp in tps}
        finally:
            probe.close()

    def read(self, start: Offsets) -> tuple[Iterator[pa.RecordBatch], Offsets]:
        """Everything available after ``start``, at most ``maxRecordsPerBatch`` records
        (:meth:`_poll`), without the ACKs whose publish it does not read (``ackPartition``).

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
        reading = _Reading(self.ack_partition, begin.get(0, 0))
        if limit > 0:
            self._poll(consumer, partitions, limit, reading)
            self._while_busy(consumer, partitions, limit, reading)
        kept = reading.kept
        if reading.held is not None:  # read again from there by a later batch
            consumer.seek(self._tp(self.ack_partition), reading.held)
        end = dict(begin)
        for record in kept:
            end[record.partition] = max(end[record.partition], record.offset + 1)
        for p in partitions:  # where the consumer really stands (past ``end`` if it ran over a target)
            self._positions[p] = consumer.position(self._tp(p))
        offsets = {str(p): end[p] for p in partitions}
        if not kept:
            return iter([]), offsets
        return iter([_records_to_batch(kept, _ARROW_SCHEMA)]), offsets

    def _while_busy(self, consumer, partitions: list[int], limit: int, reading: _Reading) -> None:
        """Go on adding to ``reading`` while commands keep coming (``deferWhileBusyMs``).

        A read that found commands polls again every ``busyGapMs``, keeping what it gets, until a
        poll brings nothing new (the burst is over), the batch is full, or ``deferWhileBusyMs``
        has passed.  Ticks are not traffic: a tick interval under ``busyGapMs`` would otherwise
        defer every batch, and the expiry the ticks drive with it.  One poll per gap, not one per
        call of Spark's: the dev broker walks the partition for every fetch (a ListOffsets probe at
        each call doubled its CPU at idle).

        The ACKs' partition is left out of those polls, and only its end is asked for: in a
        fan-out it holds ten ACKs per publish, whose fetching and parsing (the broker's and
        kafka-python's CPU) took cores the burst's NOTIFYs needed.  They are read in one go
        once the burst is over."""
        if not _any_command(reading.kept) or self.defer_while_busy_ms <= 0 or self._target is not None:
            return
        deadline = time.monotonic() + self.defer_while_busy_ms / 1000
        commands = [p for p in partitions if p != self.ack_partition]
        acks = self._set_acks_aside(consumer, commands) if commands != partitions else None
        try:
            while len(reading.kept) < limit and (left := deadline - time.monotonic()) > 0:
                time.sleep(min(self.busy_gap_ms / 1000, left))
                before = len(reading.kept)
                self._poll(consumer, commands, limit, reading)
                acked = acks is not None and acks.moved(consumer)
                if not acked and not _any_command(islice(reading.kept, before, None)):
                    break
        finally:
            if acks is not None:
                self._assign(consumer, partitions)
                consumer.seek(acks.tp, acks.resume_from(reading))
        if acks is not None and len(reading.kept) < limit:
            self._poll(consumer, partitions, limit, reading)

    def _set_acks_aside(self, consumer, commands: list[int]) -> _AcksAside:
        """Fetch only the ``commands`` partitions for a while (see :meth:`_while_busy`)."""
        tp = self._tp(self.ack_partition)
        aside = _AcksAside(tp, consumer.position(tp), self.catch_up_timeout_ms)
        aside.moved(consumer)  # where its end stands now
        self._assign(consumer, commands)
        return aside

    def _poll(self, consumer, partitions: list[int], limit: int, reading: _Reading) -> None:
        """Add to ``reading`` the records this batch reads (:meth:`_Reading.add`).

        Polls again, up to ``catchUpTimeoutMs``, while the broker holds more and there is nothing
        to read, or a partition behind has given nothing yet (the dev broker may answer one
        partition of a fetch and not another, lacking time), or an ACK waits for partition 0 (what
        comes of the ACKs' partition meanwhile is dropped: :meth:`read` seeks it back).  Never
        ``pause``: a partition paused with records buffered, sought and resumed was not fetched
        again by kafka-python while another partition kept it busy."""
        deadline = time.monotonic() + self.catch_up_timeout_ms / 1000
        answered: set[int] = set()
        while True:
            polled = consumer.poll(timeout_ms=self.poll_timeout_ms, max_records=limit - len(reading.kept))
            answered.update(tp.partition for tp, batch in polled.items() if batch)
            behind = [p for p in partitions if self._behind(consumer, [p])]
            starved = [p for p in behind if p not in answered]
            reading.add([r for batch in polled.values() for r in batch
                         if self._target is None or r.offset < self._target.get(r.partition, 0)])
            if reading.held is not None:  # reading the ACKs further gains nothing until partition 0 moves
                more = [p for p in behind if p != self.ack_partition]
            else:
                more = starved if reading.kept else behind
            if not more or time.monotonic() > deadline or len(reading.kept) >= limit:
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


class _Reading:
    """What one read keeps: its records, the offset of the first ACK it must leave (None while it
    leaves none; the ACKs' partition is read again from there), and where its partition-0 records
    end (an ACK whose publish may lie beyond that is left, and every ACK after it)."""

    __slots__ = ("ack_partition", "kept", "held", "zero_end")

    def __init__(self, ack_partition: int | None, zero_begin: int):
        self.ack_partition = ack_partition
        self.kept: list = []
        self.held: int | None = None
        self.zero_end = zero_begin

    def add(self, records: list) -> None:
        """Keep ``records`` (each partition's in offset order, following what was kept before) but the
        ACKs a batch that reads them may not read yet.  Only these are vetted: partition 0's end only
        grows, so what was kept before stays readable (a poll of a burst's read re-vetting all of it
        made the read quadratic)."""
        if self.ack_partition is None:
            self.kept.extend(records)
            return
        for record in records:
            if record.partition == 0:
                self.zero_end = max(self.zero_end, record.offset + 1)
        for record in records:
            if record.partition == self.ack_partition:
                if self.held is not None:
                    continue
                if _after(record) > self.zero_end:
                    self.held = record.offset
                    continue
            self.kept.append(record)


class _AcksAside:
    """The ACKs' partition while a read defers without fetching it: where it stood, and its end
    as last asked (ListOffsets, which tansu under-reports by a batch: it only has to move)."""

    __slots__ = ("tp", "position", "timeout_ms", "end")

    def __init__(self, tp, position: int, timeout_ms: int):
        self.tp, self.position, self.timeout_ms, self.end = tp, position, timeout_ms, None

    def moved(self, consumer) -> bool:
        """Whether ACKs were appended since the last call (when it cannot be asked: no, so a
        failing broker does not prolong the deferral)."""
        from kafka.errors import KafkaError

        try:
            end = consumer.end_offsets([self.tp], timeout_ms=self.timeout_ms).get(self.tp)
        except KafkaError as error:
            log.warning("could not ask where %s ends, so ending the deferral: %s", self.tp, error)
            return False
        moved, self.end = end != self.end, end
        return moved

    def resume_from(self, reading: _Reading) -> int:
        """Where to fetch the partition again: where it stood, or the first ACK ``reading`` left for
        want of its publish (partition 0 has been read further since, so it may now be read)."""
        position = self.position if reading.held is None else reading.held
        reading.held = None
        return position


def _any_command(records) -> bool:
    """Whether ``records`` hold anything but the job's own :class:`~schemas.events.Tick`."""
    return any(not Tick.encodes(record.value) for record in records)


def _after(record) -> int:
    """The partition-0 offset an ACK record must follow (its :data:`AFTER_HEADER`; 0 without one)."""
    for key, value in record.headers or ():
        if key == AFTER_HEADER:
            return int(value)
    return 0


_ARROW_SCHEMA = arrow_schema(KAFKA_RECORD)
