"""Spark types for the Kafka records and Delta tables (streaming side only).

These describe the same objects as :mod:`schemas.events`; keep the two in
step.  Delta table schemas are written as Spark ``StructType``s; the Arrow
schema delta-rs needs is derived from them with :func:`arrow_schema`.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADERS = ArrayType(ArrayType(StringType()))


def _struct(*columns: tuple[str, object]) -> StructType:
    return StructType([StructField(name, kind, True) for name, kind in columns])


#: The columns Spark's built-in Kafka source emits, so that a cluster with
#: spark-sql-kafka can switch to ``format("kafka")`` by configuration.
KAFKA_RECORD = _struct(
    ("key", BinaryType()),
    ("value", BinaryType()),
    ("topic", StringType()),
    ("partition", IntegerType()),
    ("offset", LongType()),
    ("timestamp", TimestampType()),
    ("timestampType", IntegerType()),
)

SECTION_JSON = _struct(("headers", HEADERS), ("data", StringType()))  # data is base64

#: A message's federation fields, as on ``schemas.events.Publish`` and ``Deliver`` (spec 2.3, DEPTH,
#: the 2002 HOPS): how many more farms it may reach (0: none, -1: no limit), the domains it passed,
#: and for a message another farm forwarded its SMUID and topic there.
FEDERATION = (
    ("depth", IntegerType()),
    ("hops", ArrayType(StringType())),
    ("origin", StringType()),
    ("origin_topic", StringType()),
)

#: Union of every event on ``smqp.commands`` (see schemas.events).
COMMAND_EVENT = _struct(
    ("type", StringType()),
    ("smuid", LongType()),
    ("topic", StringType()),
    ("cmuid", StringType()),
    ("account", StringType()),
    ("guid", StringType()),
    ("pattern", StringType()),
    ("accepted_at", LongType()),
    ("priority", IntegerType()),
    ("headers", HEADERS),
    ("sections", ArrayType(SECTION_JSON)),
    ("since", LongType()),  # subscribe: microseconds, or null
    ("until", LongType()),
    ("expires_at", LongType()),  # publish: microseconds, or null for a state message
    ("at", LongType()),  # tick: the job's clock, microseconds
    ("receipt", StringType()),  # publish: "none" | "one" | "all"
    ("max_retries", IntegerType()),  # nack
    ("reason", StringType()),  # nack: "timeout" | "disconnect"
    ("delivery", StringType()),  # publish: "all" | "one"
    *FEDERATION,  # publish
)

#: Delta table ``messages``: every accepted publish, once.
MESSAGES_TABLE = _struct(
    ("smuid", LongType()),
    ("topic", StringType()),
    ("cmuid", StringType()),
    ("publisher", StringType()),
    ("publisher_guid", StringType()),
    ("priority", IntegerType()),
    ("headers", HEADERS),
    ("sections", ArrayType(SECTION_JSON)),
    ("accepted_at", TimestampType()),
    ("kafka_partition", IntegerType()),
    ("kafka_offset", LongType()),
    ("batch_id", LongType()),
    ("expires_at", TimestampType()),  # null: a state message (never expires)
    ("receipt", StringType()),  # "none" | "one" | "all" (null in rows written before receipts)
    ("delivery", StringType()),  # "all" | "one" (null: all)
    *FEDERATION,  # null in rows written before federation: depth 0, hops [], a local message
)

#: Delta table ``subscriptions``: one row per (account, pattern) ever subscribed.
#: ``since`` / ``until``: the SINCE / UNTIL bounds of the latest SUBSCRIBE (null: open).
SUBSCRIPTIONS_TABLE = _struct(
    ("account", StringType()),
    ("pattern", StringType()),
    ("guid", StringType()),
    ("active", BooleanType()),
    ("subscribed_at", TimestampType()),
    ("unsubscribed_at", TimestampType()),
    ("since", TimestampType()),
    ("until", TimestampType()),
    ("batch_id", LongType()),
)

#: Delta table ``deliveries``: one row per (account, smuid) routed.
#: ``status``: "pending" | "acked" | "sent" (not guaranteed: never acknowledged) | "expired"
#: (its message's expiry passed unacknowledged) | "trashed" (``max_retries`` NOTIFYs unacknowledged)
#: | "released" (DELIVERY ONE: NACKed, so handed to another subscriber, whose row is "pending")
#: | "cleared" (the subscriber SUBSCRIBEd again with a SINCE after the message's acceptance).
#: ``retries``: NOTIFYs of it the subscriber left unacknowledged (null: none).
#: ``receipt``: the message's RECEIPT mode, so receipts need no join with ``messages``.
#: ``expires_at``: the message's (null: a state message), so expiry needs no join.
#: Delta table ``unrouted`` has the same columns: one row of account ``''`` per message that
#: reached no subscriber and can expire, status "unrouted" until it does ("expired"), a late
#: subscriber takes it ("routed": its delivery to that subscriber expires or not from then on)
#: or its topic is removed ("trashed", reason topic_removed).  A message whose topic is removed
#: while somebody still holds it gets a row "removed" there, "trashed" (topic_removed) once ACKs
#: settle its last pending delivery.  And one per DELIVERY ONE message waiting for a subscriber
#: below its topic's ``max_in_flight`` ("waiting", then "routed" once one has room:
#: ``streaming.dispatch``).
DELIVERIES_TABLE = _struct(
    ("account", StringType()),
    ("smuid", LongType()),
    ("topic", StringType()),
    ("priority", IntegerType()),
    ("status", StringType()),
    ("routed_at", TimestampType()),
    ("routed_batch_id", LongType()),
    ("acked_at", TimestampType()),
    ("acked_guid", StringType()),
    ("expires_at", TimestampType()),
    ("retries", IntegerType()),
    ("receipt", StringType()),
    ("delivery", StringType()),  # the message's delivery mode: "one" deliveries are reassigned when NACKed
)

#: The ``trash`` columns copied from the message's ``messages`` row, as they are there.
TRASH_FROM_MESSAGE = ("publisher_guid", "priority", "accepted_at", *(name for name, _ in FEDERATION))

#: Delta table ``trash``: every dead message, once, with why and when (``trash_topic`` = ``<topic>/Trash``).
TRASH_TABLE = _struct(
    ("smuid", LongType()),
    ("topic", StringType()),
    ("trash_topic", StringType()),
    ("reason", StringType()),  # "expired" | "undeliverable" (reached no subscriber) | "max_retries" | "topic_removed"
    ("trashed_at", TimestampType()),  # the job's "now" of the batch that trashed it
    ("publisher", StringType()),
    ("cmuid", StringType()),
    ("headers", HEADERS),
    ("sections", ArrayType(SECTION_JSON)),
    ("batch_id", LongType()),
    ("account", StringType()),  # max_retries: the subscriber that never acknowledged it; else ''
    # what else LIST and GET MESSAGE show of it, copied from its ``messages`` row so that reading a
    # Trash needs no read of that table (null in rows written before: read from there)
    *((name, MESSAGES_TABLE[name].dataType) for name in TRASH_FROM_MESSAGE),
)

#: Delta table ``receipts``: one row per message whose RECEIPT (ONE / ALL) was answered.
RECEIPTS_TABLE = _struct(
    ("smuid", LongType()),  # the message the receipt is about
    ("publisher", StringType()),
    ("mode", StringType()),  # "one" | "all"
    ("acked", IntegerType()),  # X of "X/Y": subscribers that acknowledged it
    ("targeted", IntegerType()),  # Y: subscribers it was routed to
    ("receipt_smuid", LongType()),  # the receipt message on /accounts/<publisher>
    ("receipted_at", TimestampType()),
    ("batch_id", LongType()),
)

TABLES: dict[str, StructType] = {
    "messages": MESSAGES_TABLE,
    "subscriptions": SUBSCRIPTIONS_TABLE,
    "deliveries": DELIVERIES_TABLE,
    "unrouted": DELIVERIES_TABLE,
    "trash": TRASH_TABLE,
    "receipts": RECEIPTS_TABLE,
}


#: Table properties every engine table carries.  The job commits with delta-rs, the gateways read
#: with delta-rs, and ``smqp sql`` (or an operator's own session) reads and may write with
#: delta-spark: pinned here, a delta-spark session whose defaults turn on deletion vectors, column
#: mapping or the change feed cannot give a table a feature the others would misread.
TABLE_PROPERTIES: dict[str, str] = {
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
    "delta.enableChangeDataFeed": "false",
}


def arrow_schema(schema: StructType):
    """The Arrow schema delta-rs writes for a Spark ``StructType`` (UTC timestamps)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
