"""All routing logic, as pure ``DataFrame -> DataFrame`` transforms.

Nothing here reads a source, writes a sink or touches the session: every
function takes frames (and plain values) and returns a frame, so the tests run
them unchanged on literal rows.  The sink (:mod:`streaming.sink`) wires them
together once per micro-batch::

    records ──parse_commands──▶ events ──┬─ subscription_intervals(current subscriptions)
                                         │        │
                                         ├────────┴─ route ──▶ deliveries ──▶ deliver_records
                                         ├─ extract_acks ──▶ acks ──▶ acked_records
                                         └─ message_rows ──▶ messages
    intervals ──subscription_state──▶ subscriptions (merge)
    deliveries + acks ──delivery_updates──▶ deliveries (merge)

Ordering: every command carries ``seq = struct(timestamp, partition, offset)``
of its Kafka record.  With one commands partition (the default) that is the
log order; across partitions it falls back to Kafka timestamp order.  A
publish is routed to a subscription iff ``from_seq < seq < to_seq`` where a
null bound is open (``from_seq`` null: subscribed before this batch;
``to_seq`` null: still subscribed at the end of the batch).
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from schemas.spark import COMMAND_EVENT, HEADERS, SECTION_JSON

#: Total order of commands within a batch (and across batches on one partition).
SEQ = StructType([
    StructField("timestamp", TimestampType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
])

#: Output of :func:`parse_commands`: every COMMAND_EVENT field plus its position.
EVENTS = StructType(list(COMMAND_EVENT.fields) + [
    StructField("seq", SEQ, True),
    StructField("kafka_partition", IntegerType(), True),
    StructField("kafka_offset", LongType(), True),
])

#: Output of :func:`subscription_intervals`.
INTERVALS = StructType([
    StructField("account", StringType(), True),
    StructField("pattern", StringType(), True),
    StructField("guid", StringType(), True),
    StructField("subscribed_at", TimestampType(), True),
    StructField("from_seq", SEQ, True),
    StructField("to_seq", SEQ, True),
    StructField("unsubscribed_at", TimestampType(), True),
])

#: Output of :func:`route`: one row per (subscriber account, smuid), with what a Deliver carries.
DELIVERIES = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("topic", StringType(), True),
    StructField("cmuid", StringType(), True),
    StructField("publisher", StringType(), True),
    StructField("publisher_guid", StringType(), True),
    StructField("accepted_at", LongType(), True),  # microseconds, as in the event
    StructField("priority", IntegerType(), True),
    StructField("headers", HEADERS, True),
    StructField("sections", ArrayType(SECTION_JSON), True),
    StructField("seq", SEQ, True),
])

#: Output of :func:`extract_acks` (``seq``: where the ACK was in the commands log).
ACKS = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("acked_at", TimestampType(), True),
    StructField("acked_guid", StringType(), True),
    StructField("seq", SEQ, True),
])

#: Output of :func:`deliver_records` / :func:`acked_records`: a Kafka record to produce,
#: and the position of the command it answers (produce in that order).
KAFKA_OUT = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", StringType(), True),
    StructField("seq", SEQ, True),
])

COMMAND_TYPES = ("publish", "subscribe", "unsubscribe", "ack")


def _micros_to_ts(column: str | Column) -> Column:
    return F.timestamp_micros(F.col(column) if isinstance(column, str) else column)


def parse_commands(records: DataFrame) -> DataFrame:
    """Kafka records (``KAFKA_RECORD`` columns) → command events (:data:`EVENTS`).

    ``value`` is parsed with ``from_json`` against ``COMMAND_EVENT``.  Records
    that are not JSON, have an unknown ``type`` or lack the fields their type
    needs are dropped here (they must never stop the job); the sink still counts
    their offsets as consumed.
    """
    parsed = records.select(
        F.from_json(F.col("value").cast("string"), COMMAND_EVENT).alias("e"),
        F.struct(
            F.col("timestamp").alias("timestamp"),
            F.col("partition").alias("partition"),
            F.col("offset").alias("offset"),
        ).alias("seq"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
    ).select("e.*", "seq", "kafka_partition", "kafka_offset")
    kind = F.col("type")
    has_account = F.col("account").isNotNull()
    valid = (
        ((kind == "publish") & has_account & F.col("smuid").isNotNull() & F.col("topic").isNotNull())
        | (kind.isin("subscribe", "unsubscribe") & has_account & F.col("pattern").isNotNull())
        | ((kind == "ack") & has_account & F.col("smuid").isNotNull())
    )
    return parsed.where(F.coalesce(valid, F.lit(False)))


def _covers(unsubscribed: Column, pattern: Column) -> Column:
    """True when UNSUBSCRIBE ``unsubscribed`` ends subscription ``pattern``.

    Equal patterns, or ``unsubscribed`` is a wildcard ``/a/*`` whose prefix
    ``/a/`` starts ``pattern`` (``/a/x``, ``/a/x/*``, ``/a/*`` …).
    """
    prefix = unsubscribed.substr(F.lit(1), F.length(unsubscribed) - 1)
    return (unsubscribed == pattern) | (unsubscribed.endswith("/*") & pattern.startswith(prefix))


def subscription_intervals(current: DataFrame, events: DataFrame) -> DataFrame:
    """Current subscriptions + this batch's (un)subscribes → :data:`INTERVALS`.

    ``current`` has the ``SUBSCRIPTIONS_TABLE`` columns; only ``active`` rows
    count, and they open at ``from_seq = null`` (before this batch).  Each
    SUBSCRIBE opens an interval at its ``seq``.  An interval ends at the first
    later UNSUBSCRIBE of the same account whose pattern covers it (see
    :func:`_covers`); ``to_seq`` stays null when none does.  A SUBSCRIBE while
    already subscribed to the same pattern does not open a second interval (the
    earlier one, with its guid and ``subscribed_at``, is kept); a SUBSCRIBE
    after an UNSUBSCRIBE opens a new one.
    """
    no_seq = F.lit(None).cast(SEQ)
    opens = current.where(F.col("active")).select(
        "account", "pattern", "guid", "subscribed_at", no_seq.alias("from_seq"),
    ).unionByName(
        events.where(F.col("type") == "subscribe").select(
            "account", "pattern", "guid",
            _micros_to_ts("accepted_at").alias("subscribed_at"),
            F.col("seq").alias("from_seq"),
        )
    )
    closes = events.where(F.col("type") == "unsubscribe").select(
        F.col("account").alias("c_account"),
        F.col("pattern").alias("c_pattern"),
        F.col("seq").alias("c_seq"),
        _micros_to_ts("accepted_at").alias("c_at"),
    )
    ended = opens.join(
        closes,
        (F.col("account") == F.col("c_account"))
        & _covers(F.col("c_pattern"), F.col("pattern"))
        & (F.col("from_seq").isNull() | (F.col("c_seq") > F.col("from_seq"))),
        "left",
    ).groupBy("account", "pattern", "guid", "subscribed_at", "from_seq").agg(
        F.min("c_seq").alias("to_seq"),
        F.min_by("c_at", "c_seq").alias("unsubscribed_at"),
    )
    # Opens that end at the same place are one interval: keep the earliest.
    first = Window.partitionBy("account", "pattern", "to_seq").orderBy(F.col("from_seq").asc_nulls_first())
    return (
        ended.withColumn("_n", F.row_number().over(first))
        .where(F.col("_n") == 1)
        .select(*INTERVALS.fieldNames())
    )


def candidate_patterns(topic: Column) -> Column:
    """Every subscription pattern that matches the canonical ``topic``.

    ``/a/b/c`` → ``["/a/b/c", "/a/*", "/a/b/*"]``: the topic itself and the
    wildcard of each proper ancestor.  Matching then is an equi-join on the
    pattern, the same relation as ``schemas.topics.TopicPattern.matches`` (a
    wildcard ``/a/b/*`` covers topics starting with ``/a/b/``, so ``/a/*``
    never matches ``/ab/x`` and ``/a/b/*`` does not match ``/a/b`` itself).
    """
    levels = F.split(topic.substr(F.lit(2), F.length(topic)), "/")
    depth = F.size(levels)
    ancestors = F.transform(
        F.sequence(F.lit(1), depth - 1),
        lambda i: F.concat(F.lit("/"), F.array_join(F.slice(levels, F.lit(1), i), "/"), F.lit("/*")),
    )
    return F.when(depth > 1, F.concat(F.array(topic), ancestors)).otherwise(F.array(topic))


def route(events: DataFrame, intervals: DataFrame) -> DataFrame:
    """Publishes × subscription intervals → :data:`DELIVERIES`.

    A publish reaches an interval whose pattern matches its topic (see
    :func:`candidate_patterns`) when ``from_seq < seq < to_seq`` (null bounds
    open).  A publish repeated within the batch (same ``smuid``) counts once, at
    its first position.  One row per (subscriber account, smuid), however many
    of that account's patterns matched.
    """
    first = Window.partitionBy("smuid").orderBy("seq")
    publishes = (
        events.where(F.col("type") == "publish")
        .withColumn("_n", F.row_number().over(first))
        .where(F.col("_n") == 1)
        .select(
            "smuid", "topic", "cmuid",
            F.col("account").alias("publisher"),
            F.col("guid").alias("publisher_guid"),
            "accepted_at", "priority", "headers", "sections", "seq",
            F.explode(candidate_patterns(F.col("topic"))).alias("_pattern"),
        )
    )
    subscribers = intervals.select(
        F.col("account"), F.col("pattern").alias("_pattern"), "from_seq", "to_seq",
    )
    open_at_seq = (
        (F.col("from_seq").isNull() | (F.col("from_seq") < F.col("seq")))
        & (F.col("to_seq").isNull() | (F.col("seq") < F.col("to_seq")))
    )
    return (
        publishes.join(subscribers, "_pattern")
        .where(open_at_seq)
        .select(*DELIVERIES.fieldNames())
        .dropDuplicates(["account", "smuid"])
    )


def subscription_state(intervals: DataFrame, batch_id: int) -> DataFrame:
    """Intervals → rows for the ``subscriptions`` merge (``SUBSCRIPTIONS_TABLE`` columns).

    Only (account, pattern) pairs this batch touched appear (an interval with a
    non-null bound).  Each takes its last interval: ``active`` when it is still
    open, with that interval's guid, ``subscribed_at`` and ``unsubscribed_at``.
    """
    last = Window.partitionBy("account", "pattern").orderBy(F.col("from_seq").desc_nulls_last())
    return (
        intervals.where(F.col("from_seq").isNotNull() | F.col("to_seq").isNotNull())
        .withColumn("_n", F.row_number().over(last))
        .where(F.col("_n") == 1)
        .select(
            "account", "pattern", "guid",
            F.col("to_seq").isNull().alias("active"),
            "subscribed_at", "unsubscribed_at",
            F.lit(batch_id).cast(LongType()).alias("batch_id"),
        )
    )


def extract_acks(events: DataFrame) -> DataFrame:
    """ACK events → :data:`ACKS`, one per (account, smuid): the first one in the batch."""
    first = Window.partitionBy("account", "smuid").orderBy("seq")
    return (
        events.where(F.col("type") == "ack")
        .withColumn("_n", F.row_number().over(first))
        .where(F.col("_n") == 1)
        .select("account", "smuid", _micros_to_ts("accepted_at").alias("acked_at"),
                F.col("guid").alias("acked_guid"), "seq")
    )


def message_rows(events: DataFrame, batch_id: int) -> DataFrame:
    """Publishes → ``MESSAGES_TABLE`` rows (one per smuid in the batch; data stays base64)."""
    first = Window.partitionBy("smuid").orderBy("seq")
    return (
        events.where(F.col("type") == "publish")
        .withColumn("_n", F.row_number().over(first))
        .where(F.col("_n") == 1)
        .select(
            "smuid", "topic", "cmuid",
            F.col("account").alias("publisher"),
            F.col("guid").alias("publisher_guid"),
            "priority", "headers", "sections",
            _micros_to_ts("accepted_at").alias("accepted_at"),
            "kafka_partition", "kafka_offset",
            F.lit(batch_id).cast(LongType()).alias("batch_id"),
        )
    )


def delivery_updates(deliveries: DataFrame, acks: DataFrame, batch_id: int,
                     routed_at: datetime) -> DataFrame:
    """New deliveries and acks → the source of the ``deliveries`` merge.

    ``DELIVERIES_TABLE`` columns plus ``is_new``: new deliveries are
    ``is_new`` rows, already ``acked`` when this batch also holds their ACK;
    ACKs for deliveries of earlier batches are ``is_new = false`` rows with
    status ``acked`` (they update a matching row and are never inserted).  One
    row per (account, smuid).
    """
    acks = acks.select("account", "smuid", "acked_at", "acked_guid")
    new = deliveries.join(acks, ["account", "smuid"], "left").select(
        "account", "smuid", "topic", "priority",
        F.when(F.col("acked_at").isNotNull() | F.col("acked_guid").isNotNull(), F.lit("acked"))
        .otherwise(F.lit("pending")).alias("status"),
        F.lit(routed_at).cast(TimestampType()).alias("routed_at"),
        F.lit(batch_id).cast(LongType()).alias("routed_batch_id"),
        "acked_at", "acked_guid",
        F.lit(True).alias("is_new"),
    )
    old = acks.join(deliveries.select("account", "smuid"), ["account", "smuid"], "left_anti").select(
        "account", "smuid",
        F.lit(None).cast(StringType()).alias("topic"),
        F.lit(None).cast(IntegerType()).alias("priority"),
        F.lit("acked").alias("status"),
        F.lit(None).cast(TimestampType()).alias("routed_at"),
        F.lit(None).cast(LongType()).alias("routed_batch_id"),
        "acked_at", "acked_guid",
        F.lit(False).alias("is_new"),
    )
    return new.unionByName(old)


def deliver_records(deliveries: DataFrame) -> DataFrame:
    """Deliveries → ``smqp.deliveries`` records: key = account, value = Deliver JSON.

    Field names and nesting are those of ``schemas.events.Deliver.to_bytes()``
    so ``schemas.events.decode`` returns an equal ``Deliver``.  ``seq`` is the
    publish's position: produce in that order (acceptance order).
    """
    value = F.to_json(F.struct(
        F.lit("deliver").alias("type"),
        "account", "smuid", "topic", "cmuid", "publisher", "publisher_guid", "accepted_at",
        F.coalesce(F.col("priority"), F.lit(0)).alias("priority"),
        F.coalesce(F.col("headers"), F.array().cast(HEADERS)).alias("headers"),
        F.coalesce(F.col("sections"), F.array().cast(ArrayType(SECTION_JSON))).alias("sections"),
    ))
    return deliveries.select(F.col("account").cast(BinaryType()).alias("key"), value.alias("value"), "seq")


def acked_records(acks: DataFrame) -> DataFrame:
    """ACKs (:data:`ACKS` plus their ``seq``) → ``smqp.deliveries`` records: key = account, value = Acked JSON."""
    value = F.to_json(F.struct(F.lit("acked").alias("type"), "account", "smuid"))
    return acks.select(F.col("account").cast(BinaryType()).alias("key"), value.alias("value"), "seq")
