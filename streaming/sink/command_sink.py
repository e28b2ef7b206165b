"""The foreachBatch sink: route one micro-batch, emit to Kafka, commit to Delta.

Per batch, :class:`CommandSink` runs the pure transforms of
:mod:`streaming.routing` and then, in this order:

1. **emits** one ``Deliver`` per new delivery and one ``Acked`` per ACK to
   ``smqp.deliveries`` (key = subscriber account) — sent asynchronously,
   before the Delta commit, for latency; a replayed batch re-emits and
   gateways deduplicate by (account, smuid);
2. **commits** ``trash`` (append, or merge when a key may be stored) then ``deliveries`` (the new
   rows of the batch's own publishes appended, the rest merged on account, smuid), ``messages``
   (append) beside them; then ``unrouted`` (as ``deliveries``) beside ``receipts``, and
   finally ``subscriptions`` (merge on account, pattern), with delta-rs
   (:meth:`DeltaCommits.commit_outputs`).
   Every commit carries the Delta app transaction ``(f"{query}:{table}",
   batch_id)`` and a table whose recorded version is already ≥ ``batch_id``
   is skipped, so a replayed batch never duplicates a row (DESIGN Property 4).  The append before a
   merge carries none: the first batch after a start or a failure removes what such an append of
   its own left (:meth:`DeltaCommits.undo_fresh_deliveries`).
   ``subscriptions`` goes last and is read at the start of each batch: when it
   already holds this batch, every table does and the batch is skipped whole;
   otherwise it still holds the state *before* this batch, so a replay routes
   exactly as the first attempt did;
3. **announces** ``Progress`` (commands partition → next offset) to every
   deliveries partition, *after* the commit, so it always means "committed";
4. waits for Kafka to take every record sent (:class:`kafka_edge.ThreadedLog`) and fails the batch if one failed.

ACKs for deliveries this job never routed are ignored in Delta (no row is
created) but still answered with ``Acked``: the ACK itself is durable in
``smqp.commands``, and there is nothing left to redeliver.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone
from operator import methodcaller
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from kafka_edge import ThreadedLog
from schemas.config import SMQPConfig
from schemas.events import Acked, AckedBatch
from schemas.queue_params import TopicSettings
from schemas.spark import arrow_schema
from streaming import simple_batch
from streaming.compaction import TableCompactor
from streaming.retention import TrashSweeper
from streaming.routing.frames import CLEARABLE, EVENTS, HELD, KAFKA_OUT, ORPHANED, PENDING, RECEIPT_STATE, RETRYING
from streaming.routing.sql import empty_sql, run_sql
from streaming.sink.commits import DeltaCommits
from streaming.sink.decoding import decode_records, decoded_events, events_by_kind, in_log_order
from streaming.sink.holders import InFlightLimit
from streaming.sink.query import OUTPUTS, PROGRESS, RECEIPTED, STORED, batch_sql
from streaming.sink.reads import EXPIRING, StoredReads
from streaming.sink.recent import RecentMessages
from streaming.sink.records import (
    acked_smuids,
    acks_its_own_receipt_publish,
    asks_for_receipt,
    batch_now,
    has_delivery_one,
    may_expire,
    nacked_keys,
    nothing_to_route,
    progress_rows,
    publish_before_subscribe,
    published_before_removal,
    published_smuids,
    removed_topics,
    starting,
    subscribes,
)
from streaming.sink.tables import DeltaTables


#: Named for the package, not this module: ``deploy.compare`` and ``deploy.job_latency`` read the
#: batch lines of the job's log by this name.
log = logging.getLogger("streaming.sink")


#: ``Acked`` events joined into one :class:`AckedBatch` record at most: ~60 bytes each, so a
#: record of ~120 KB, well inside a fetch's 1 MiB a partition.
ACKED_PER_RECORD = 2000

#: A relation of the routing query above either bound goes to Spark as a local checkpoint (rows kept by
#: its block manager, memory then disk), not as a LocalRelation.  Why: the optimiser copies a
#: LocalRelation's rows for every Filter and Project over it (``ConvertToLocalRelation``), and the query
#: reads its publishes in many places.  A SUBSCRIBE and 100,000 publishes of 200 bytes ran out of the
#: job's 1 GiB heap while planning; checkpointed, it routed in 21 s (warm), and 20,000 in 4-6 s against
#: 8-10 (``bench-results/routing-query-backlog/``).  Below them, planning cost the same either way
#: (1,000-3,000 rows), and a checkpoint is one more Spark job for a batch that latency waits on.
LOCAL_RELATION_ROWS = 1_000
LOCAL_RELATION_BYTES = 4 << 20


def _by_seq(records: pa.Table) -> pa.Table:
    """Kafka records in the order of the commands they answer."""
    seq = records.column("seq").combine_chunks() if records.num_rows else None
    if seq is None:
        return records
    keys = pa.table({name: seq.field(name) for name in ("timestamp", "partition", "offset")})
    order = pc.sort_indices(keys, sort_keys=[("timestamp", "ascending"), ("partition", "ascending"),
                                             ("offset", "ascending")])
    return records.take(order)


def _withheld_records(deliveries: pa.Table) -> pa.Table:
    """``Acked`` records (:data:`streaming.routing.KAFKA_OUT`) of the batch's deliveries a SINCE later in the batch
    withheld (new rows ``cleared``): the job never sent them, but a gateway routing early may have.
    Made here rather than in the query, whose plan each reference to ``withheld`` would grow."""
    withheld = deliveries.filter(pc.and_(deliveries.column("is_new"), pc.equal(deliveries.column("status"), "cleared")))
    accounts, smuids = withheld.column("account").to_pylist(), withheld.column("smuid").to_pylist()
    return pa.table({
        "key": pa.array([account.encode() for account in accounts], pa.binary()),
        "value": [Acked(account, smuid, "cleared").to_bytes().decode() for account, smuid in zip(accounts, smuids)],
        "seq": pa.nulls(len(accounts)),
    }).cast(arrow_schema(KAFKA_OUT))


def _expiries(deliveries: pa.Table) -> list[int]:
    """When the batch's new deliveries that may expire do (µs, distinct): pending, unrouted or waiting
    ones of a message with a timeout."""
    new = deliveries.filter(pc.fill_null(pc.and_(deliveries.column("is_new"), pc.is_in(
        deliveries.column("status"), pa.array(EXPIRING))), False))
    return pc.unique(new.column("expires_at").cast(pa.int64()).drop_null()).to_pylist()


class CommandSink(DeltaTables, StoredReads, InFlightLimit, DeltaCommits):
    """``foreachBatch`` callable: ``sink(batch_df, batch_id)``. Holds one producer (:class:`kafka_edge.ThreadedLog`).

    ``close()`` lets it finish and closes it; call it after the query stops.  The batch's flow and its Kafka
    records are here; its Delta tables, reads, DELIVERY ONE holders and commits are the mixins'.
    """

    def __init__(self, config: SMQPConfig):
        self.config = config
        self.query_name = config.streaming.query_name
        self._producer = None
        self._commit_pool = None  # :meth:`commit_pool`
        self.sweep_trash = TrashSweeper(config, lambda: self._existing("trash"))
        self.compact = TableCompactor(config, self._existing)
        self.topic_settings = TopicSettings(config.topics)
        # whether DELIVERY ONE messages may be waiting for a subscriber with room (None: not read yet)
        self._waiting: bool | None = None
        self._removed_held: set[int] | None = None  # see :meth:`removed_held`
        self._active: tuple[int, pa.Table] | None = None  # the active subscriptions at a table version
        self._expiry_floor: int | None = None  # no stored delivery expires before (µs; :meth:`expiry_candidates`)
        self._tables: dict[str, DeltaTable] = {}  # the Delta tables, open (:meth:`_table`)
        self._versions: dict[str, int | None] = {}  # the batch each table last committed (:meth:`committed_version`)
        self._recovering = True  # the next batch follows a start or a failure (:meth:`undo_fresh_deliveries`)
        self.recent = RecentMessages()  # committed messages that expire soon (:meth:`stored_messages`)
        self._log_floors: dict[int, int] = {}  # per commands partition, its last record's time (:func:`in_log_order`)
        # the last batch's routing query: ms planning it (parse, analyse, optimise, physical plan), running it
        self.query_ms = {"plan": 0.0, "run": 0.0}
        # told, after each commit, when the deliveries it routed expire (µs): the job's ticker
        # (:meth:`streaming.ticker.Ticker.wake_at`) ticks then, so they expire without waiting for its next tick
        self.expiry_alarm: Callable[[list[int]], None] | None = None

    def producer(self) -> ThreadedLog:
        """The long-lived producer to the deliveries topic (acks=all), created on first use."""
        if self._producer is None:
            self._producer = ThreadedLog(self.config.job_kafka, self.config.kafka.deliveries_topic,
                                         client_id=f"{self.query_name}-sink")
        return self._producer

    def close(self) -> None:
        self.close_commit_pool()
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def _relation(self, spark: SparkSession, arrow: pa.Table, schema: StructType) -> DataFrame | str:
        """``arrow`` as a Spark frame, or, when it is empty, the SQL text of an empty relation
        (no py4j round trips for the common case: nothing expires); a large one checkpointed
        (:data:`LOCAL_RELATION_ROWS`).  Spark's ContextCleaner drops the checkpoint's blocks once
        the frame is gone."""
        if not arrow.num_rows:
            return empty_sql(schema)
        frame = spark.createDataFrame(arrow, schema=schema)
        if arrow.num_rows > LOCAL_RELATION_ROWS or arrow.nbytes > LOCAL_RELATION_BYTES:
            return frame.localCheckpoint()
        return frame

    def outputs(self, batch_df: DataFrame, batch_id: int, routed_at: datetime,
                records: pa.Table | None = None) -> dict[str, pa.Table]:
        """Every output of one batch: a simple batch (:func:`simple_batch.is_simple`) routed on the
        driver (:func:`simple_batch.route`), any other by the routing transforms in three Spark jobs.

        Spark pays a fixed cost per job and per stage that dwarfs the work of a
        micro-batch, so the outputs are one query (:func:`batch_sql`, the
        transforms' SQL as CTEs, unioned with one struct column per output,
        tagged by ``kind``), collected once as Arrow and split here; shared
        sub-plans run once (exchange reuse).  Only the CTEs the rest reads most
        are run before it, as two checkpointed parts: as one query, Spark's
        analysis check copied them ~1,700 times (:data:`streaming.sink.query.SHARED`).
        """
        spark = batch_df.sparkSession
        arrow_records = batch_df.toArrow() if records is None else records
        now = batch_now(arrow_records)
        deliveries = self._table("deliveries")  # opened once for the batch's three reads of it
        pending = self.expiry_candidates(now, deliveries)
        nacked = nacked_keys(arrow_records)
        retrying = self.retry_candidates(deliveries, nacked)
        state = self.receipt_state(deliveries,
                                   sorted(set(acked_smuids(arrow_records)) | set(pending.column("smuid").to_pylist())))
        nobody = pc.equal(pending.column("account"), "")
        unreached = set(pending.filter(nobody).column("smuid").to_pylist())  # 0/0 receipts, if they asked
        concerned = sorted(set(state.column("smuid").to_pylist()))
        receipted = self.receipted(sorted(set(concerned) | unreached))
        removed = removed_topics(arrow_records)
        orphaned = self.orphaned(deliveries, removed, now)
        # and those held at their removal whose last pending delivery this batch's ACKs settle
        orphaned = pa.concat_tables([orphaned, pa.table({"smuid": pa.array(self.removed_settled(
            deliveries, arrow_records), pa.int64())}).cast(orphaned.schema)])
        markers = self.removal_markers(deliveries, removed, now, batch_id)
        stored = self.stored_messages(sorted(set(pending.column("smuid").to_pylist())
                                             | set(retrying.column("smuid").to_pylist()) | set(concerned)
                                             | set(orphaned.column("smuid").to_pylist())))
        # and this batch's own publishes before the removal (the query keeps those somebody got)
        orphaned = pa.concat_tables([orphaned, pa.table({"smuid": pa.array(published_before_removal(arrow_records),
                                                                           pa.int64())}).cast(orphaned.schema)])
        subscribed = subscribes(arrow_records)
        late_stored, late_held = self.late_candidates(
            deliveries, starting(arrow_records, subscribed, self.active_subscriptions()), now)
        sinced = [a for a, _, since in subscribed if since]
        clearable = self.clearable(deliveries, sinced)
        expiry = may_expire(arrow_records, now, pending)
        late = late_stored.num_rows > 0 or publish_before_subscribe(arrow_records)
        # a publish of the batch may be owed its receipt now: 0/0 or X/Y when it is already expired, or
        # acknowledged in the same batch (a gateway routed it early)
        owed_now = (expiry[0] and asks_for_receipt(arrow_records)) or acks_its_own_receipt_publish(arrow_records)
        receipts = state.num_rows > 0 or bool(unreached) or owed_now
        one = has_delivery_one(arrow_records)
        clearing = clearable.num_rows > 0 or (bool(sinced) and late)  # SINCE may withhold this batch's too
        shape = simple_batch.Shape(removals=bool(removed) or orphaned.num_rows > 0)
        simple = self.config.streaming.simple_batches and simple_batch.is_simple(shape)
        # The records decoded once, here (every branch of the query would otherwise re-read the source): as
        # dicts for a batch routed in Python (no Arrow round trip), as an Arrow table for the routing query.
        decoded = decoded_events(arrow_records) if simple else decode_records(arrow_records)
        started = time.monotonic()
        if simple:
            rows = simple_batch.route(decoded, self.active_subscriptions(), pending, stored, batch_id, routed_at, now,
                                      new_may_expire=expiry[0], one=one, peers=self.config.federation.peers,
                                      late_stored=late_stored, late_held=late_held, receipt_state=state,
                                      receipted=set(receipted.column("smuid").to_pylist()), retrying=retrying,
                                      clearable=clearable)
            out = {kind: pa.Table.from_pylist(rows[kind], schema=arrow_schema(OUTPUTS[kind])) for kind in rows}
            self.query_ms = {"plan": 0.0, "run": (time.monotonic() - started) * 1000}
        else:
            sql = batch_sql(batch_id, routed_at, now, expiry, bool(nacked), receipts, one, late, clearing,
                            orphaned.num_rows > 0, releases=retrying.num_rows > 0,
                            peers=self.config.federation.peers)
            # each kind of event a relation of its own (:func:`events_by_kind`)
            relations = {f"decoded_{kind}": (rows, EVENTS) for kind, rows in events_by_kind(decoded).items()}
            relations.update(pending=(pending, PENDING), retrying=(retrying, RETRYING),
                             late_stored=(late_stored, STORED), late_held=(late_held, HELD),
                             clearable=(clearable, CLEARABLE), orphaned=(orphaned, ORPHANED),
                             receipt_state=(state, RECEIPT_STATE), receipted=(receipted, RECEIPTED),
                             stored=(stored, STORED))
            out = self._routing_query(spark, sql, relations)
        out["progress"] = pa.Table.from_pylist(progress_rows(arrow_records), schema=arrow_schema(PROGRESS))
        out["expired"] = pa.concat_tables([out["expired"], _withheld_records(out["deliveries"])])
        if markers.num_rows:
            rows = out["deliveries"]
            taken = rows.filter(pc.equal(rows.column("account"), "")).column("smuid")  # one row per key
            markers = markers.filter(pc.invert(pc.is_in(markers.column("smuid"), taken)))
            out["deliveries"] = pa.concat_tables([rows, markers.cast(rows.schema)])
        return out

    def _routing_query(self, spark: SparkSession, sql: tuple[str, ...],
                       relations: dict[str, tuple[pa.Table, StructType]]) -> dict[str, pa.Table]:
        """The outputs but ``progress`` of the routing query ``sql`` (:func:`batch_sql`: its shared parts,
        then the rest) over ``relations`` (name → rows and their type); ``query_ms`` says how long it took.

        Each shared part is run and checkpointed (a Spark job each), so the later ones read it as one
        relation and not as the plans behind it (:data:`streaming.sink.query.SHARED` says why)."""
        frames = {"current": self.current_subscriptions(spark)}
        for name, (arrow, schema) in relations.items():
            relation = self._relation(spark, arrow, schema)
            if isinstance(relation, str):
                sql = tuple(text.replace("{" + name + "}", relation) for text in sql)
            else:
                frames[name] = relation
        self.query_ms = {"plan": 0.0, "run": 0.0}
        *shared, rest = sql
        for index, text in enumerate(shared):
            frames[f"shared_{index}"] = self._timed(lambda: run_sql(text, frames), methodcaller("localCheckpoint"))
        arrow = self._timed(lambda: run_sql(rest, frames), methodcaller("toArrow"))
        out = {}
        for kind in OUTPUTS:
            if kind == "progress":
                continue
            column = arrow.column(kind).filter(pc.equal(arrow.column("kind"), kind))  # that column only: cheaper
            out[kind] = pa.Table.from_batches(
                [pa.RecordBatch.from_struct_array(chunk) for chunk in column.chunks],
                schema=pa.schema(list(column.type)))
        return out

    def _timed(self, build, run):
        """``run`` on the query ``build()`` returns, its planning and its running added to ``query_ms``
        apart (the log tells them apart).  A checkpoint's blocks are dropped by Spark's ContextCleaner
        once the frame is gone."""
        started = time.monotonic()
        query = build()  # parsed and analysed here
        query._jdf.queryExecution().executedPlan()
        planned = time.monotonic()
        result = run(query)
        self.query_ms["plan"] += (planned - started) * 1000
        self.query_ms["run"] += (time.monotonic() - planned) * 1000
        return result

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        try:
            if self._done("subscriptions", batch_id):
                log.info("batch %d: already committed, skipped", batch_id)
                return
            records, floors = in_log_order(batch_df.toArrow(), self._log_floors)
            if self._recovering:  # the batch may be a replay of one that failed between two commits
                self.undo_fresh_deliveries(batch_id, published_smuids(records))
                self._recovering = False
            now = batch_now(records)
            self.sweep_trash(now)  # retention, here: the one thread that writes the trash table
            self._route(batch_df, batch_id, records, now, started)
            self._log_floors = floors
            self.compact(now)  # here for the same reason, once the batch's records are out
        except BaseException:
            self._recovering = True
            self.forget_versions()  # its replay asks the tables what it committed
            self.forget_expiry_floor()
            raise

    def _route(self, batch_df: DataFrame, batch_id: int, records: pa.Table, now: int | None, started: float) -> None:
        """Route one batch (its ``records`` in log order, its clock ``now``), emit, commit, announce."""
        if nothing_to_route(records) and not self.expiry_candidates(now).num_rows:
            # Nothing to route and nothing expires: no Spark job, no commit; just the progress.
            self._flush(self._announce_progress({str(r["partition"]): r["end"] for r in progress_rows(records)}))
            return
        routed_at = datetime.now(timezone.utc)
        out = self.outputs(batch_df, batch_id, routed_at, records)
        self.limit_in_flight(out, records, batch_id, routed_at)
        computed = time.monotonic()
        progress = out["progress"].to_pylist()
        if not progress:
            return
        futures = self._emit(_by_seq(out["deliver"])) + self._emit_acked(_by_seq(out["acked"]))
        if out["expired"].num_rows or subscribes(records):
            # Expiry, and what late subscribers get, are decided from the deliveries table: once its
            # commit holds them, a replay would not announce them again, so they must be out before.
            futures += self._emit_acked(out["expired"])
            self._flush(futures)
            futures = []
        self.commit_outputs(out, batch_id)
        if self.expiry_alarm is not None:
            self.expiry_alarm(_expiries(out["deliveries"]))
        committed = time.monotonic()
        futures += self._announce_progress({str(r["partition"]): r["end"] for r in progress})
        self._flush(futures)
        done = time.monotonic()
        log.info("batch %d: %d records in, %d deliveries, %d acks, %d expired, %d trashed, %d receipts, "
                 "%d ms (spark %d, delta %d); routing query: plan %d ms, run %d ms",
                 batch_id, sum(r["records"] for r in progress), out["deliver"].num_rows,
                 out["acked"].num_rows, out["expired"].num_rows, out["trash"].num_rows, out["receipts"].num_rows,
                 (done - started) * 1000, (computed - started) * 1000, (committed - computed) * 1000,
                 self.query_ms["plan"], self.query_ms["run"])

    # -- Kafka

    def _emit(self, records: pa.Table) -> list:
        if not records.num_rows:
            return []
        values = [value.encode() for value in records.column("value").to_pylist()]
        return [self.producer().send(list(zip(records.column("key").to_pylist(), values, [None] * len(values))))]

    def _emit_acked(self, records: pa.Table) -> list:
        """``Acked`` records joined, in order, into :class:`AckedBatch` records of up to
        :data:`ACKED_PER_RECORD` per deliveries partition (each on its account's partition)."""
        if not records.num_rows:
            return []
        producer = self.producer()
        by_partition: dict[int, list[str]] = {}
        for key, value in zip(records.column("key").to_pylist(), records.column("value").to_pylist()):
            by_partition.setdefault(producer.partition_for(key), []).append(value)
        return [producer.send([(None, AckedBatch.join(values[start:start + ACKED_PER_RECORD]), partition)
                               for partition, values in by_partition.items()
                               for start in range(0, len(values), ACKED_PER_RECORD)])]

    def _announce_progress(self, offsets: dict[str, int]) -> list:
        producer = self.producer()
        value = json.dumps({"type": "progress", "commands_offsets": offsets}, separators=(",", ":")).encode()
        return [producer.send([(None, value, p) for p in producer.partitions])]

    def _flush(self, futures: list) -> None:
        failed = self.producer().wait(futures)
        if failed:
            raise RuntimeError(f"{len(failed)} record(s) to {self.config.kafka.deliveries_topic!r} "
                               f"not acknowledged: {failed[0]!r}")
