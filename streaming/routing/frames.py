"""The types of the routing's intermediate frames: what each transform takes and returns.

One module for all of them, because the transforms read each other's outputs and the sink
(:mod:`streaming.sink`) builds its relations with them: every other module of the package imports
this one, and this one imports none of them.
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
    StructField("since", TimestampType(), True),  # SINCE / UNTIL of the SUBSCRIBE that opened it
    StructField("until", TimestampType(), True),
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
    StructField("expires_at", LongType(), True),  # microseconds, as in the event; null: a state message
    StructField("receipt", StringType(), True),  # the message's RECEIPT mode
    StructField("delivery", StringType(), True),  # "all" | "one"
    StructField("depth", IntegerType(), True),  # the message's federation fields (``schemas.spark.FEDERATION``)
    StructField("hops", ArrayType(StringType()), True),
    StructField("origin", StringType(), True),
    StructField("origin_topic", StringType(), True),
])

#: Output of :func:`extract_acks` (``seq``: where the ACK was in the commands log).
ACKS = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("acked_at", TimestampType(), True),
    StructField("acked_guid", StringType(), True),
    StructField("seq", SEQ, True),
])

#: The stored deliveries expiry looks at (``deliveries`` rows with status pending, ``unrouted`` rows with
#: status unrouted or waiting).
PENDING = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("status", StringType(), True),
    StructField("expires_at", TimestampType(), True),
])

#: The stored deliveries of the messages this batch's NACKs name (``deliveries`` Delta rows, every
#: account's): how many retries they had, and who held a DELIVERY ONE message before.
RETRYING = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("status", StringType(), True),
    StructField("retries", IntegerType(), True),
    StructField("delivery", StringType(), True),
])

#: New statuses of stored ``unrouted`` rows (account ``''``): ``routed`` (a late subscriber took the
#: message) or ``trashed`` (its topic was removed).
NOBODY_UPDATES = StructType([
    StructField("smuid", LongType(), True),
    StructField("status", StringType(), True),
])

#: Output of :func:`released`: DELIVERY ONE deliveries NACKed away from ``account`` to ``to``.
RELEASED = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("to", StringType(), True),
    StructField("seq", SEQ, True),
])

#: Output of :func:`retried`: the new retry count of each NACKed pending delivery; ``dead`` once
#: it passed the topic's ``max_retries`` (it goes to the Trash).
RETRIED = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("retries", IntegerType(), True),
    StructField("dead", BooleanType(), True),
    StructField("seq", SEQ, True),
])

#: Output of :func:`dead_messages`: what goes to the Trash, one row per (smuid, account):
#: ``account`` '' for a whole message (expired, undeliverable), the subscriber for max_retries.
DEAD = StructType([
    StructField("smuid", LongType(), True),
    StructField("account", StringType(), True),
    StructField("reason", StringType(), True),
])

#: Output of :func:`expiring`: the deliveries whose message expired in this batch, unacknowledged.
#: ``account`` is ``''`` for a message that reached no subscriber; ``is_new``: routed in this batch.
EXPIRING = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("is_new", BooleanType(), True),
])

#: Output of :func:`deliver_records` / :func:`acked_records`: a Kafka record to produce,
#: and the position of the command it answers (produce in that order).
KAFKA_OUT = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", StringType(), True),
    StructField("seq", SEQ, True),
])


SEQ_DDL = SEQ.simpleString()


#: The stored deliveries a batch's new subscribers already have among the :func:`late` candidates.
HELD = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
])


#: Stored pending deliveries of the accounts that SUBSCRIBE with SINCE in a batch, with their
#: message's acceptance time (``deliveries`` rows joined with ``messages``).
CLEARABLE = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("topic", StringType(), True),
    StructField("accepted_at", TimestampType(), True),
])

#: Output of :func:`cleared`: pending deliveries a new SINCE cleared (``seq``: that SUBSCRIBE's).
CLEARED = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("seq", SEQ, True),
])


#: The stored messages of removed topics that nobody holds any more (``smuid``s; the sink reads them).
ORPHANED = StructType([StructField("smuid", LongType(), True)])


#: The stored deliveries of messages that asked for a receipt (``deliveries`` rows, receipt one/all).
RECEIPT_STATE = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
    StructField("status", StringType(), True),
    StructField("receipt", StringType(), True),
])

#: Output of :func:`receipts_due`: the messages whose receipt goes out in this batch.
RECEIPTS_DUE = StructType([
    StructField("smuid", LongType(), True),
    StructField("mode", StringType(), True),
    StructField("acked", IntegerType(), True),  # X
    StructField("targeted", IntegerType(), True),  # Y
])

#: Output of :func:`receipt_messages`: a receipt as a delivery to its publisher, plus what it is about.
RECEIPT_MESSAGES = StructType(list(DELIVERIES.fields) + [
    StructField("receipt_for", LongType(), True),
    StructField("mode", StringType(), True),
    StructField("acked", IntegerType(), True),
    StructField("targeted", IntegerType(), True),
])
