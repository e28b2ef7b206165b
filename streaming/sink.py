"""The foreachBatch sink: route one micro-batch, emit to Kafka, commit to Delta.

Per batch, :class:`CommandSink` runs the pure transforms of
:mod:`streaming.routing` and then, in this order:

1. **emits** one ``Deliver`` per new delivery and one ``Acked`` per ACK to
   ``smqp.deliveries`` (key = subscriber account) — sent asynchronously,
   before the Delta commit, for latency; a replayed batch re-emits and
   gateways deduplicate by (account, smuid);
2. **commits** ``messages`` (append), ``deliveries`` (merge on account, smuid)
   and finally ``subscriptions`` (merge on account, pattern) with delta-rs.
   Every commit carries the Delta app transaction ``(f"{query}:{table}",
   batch_id)`` and a table whose recorded version is already ≥ ``batch_id``
   is skipped, so a replayed batch never duplicates a row (DESIGN Property 4).
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

import contextlib
import json
import logging
import re
import time
from collections import Counter
from datetime import datetime, timezone
from typing import Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Schema, Transaction, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (ArrayType, BooleanType, DataType, IntegerType, LongType, StringType, StructField,
                               StructType)

from kafka_edge import ThreadedLog
from schemas.config import SMQPConfig
from schemas.events import Ack, Acked, AckedBatch, Deliver, Nack, Publish, RemoveTopic, Section, Subscribe, Unsubscribe
from schemas.queue_params import TopicSettings
from schemas.spark import (DELIVERIES_TABLE, MESSAGES_TABLE, RECEIPTS_TABLE, SUBSCRIPTIONS_TABLE, TABLE_PROPERTIES,
                           TABLES, TRASH_TABLE, arrow_schema)
from streaming import dispatch, routing, simple_batch
from streaming.retention import TrashSweeper

log = logging.getLogger(__name__)


def _commit(app_id: str, batch_id: int) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app_id, batch_id)])


def _to_table(arrow: pa.Table, name: str) -> pa.Table:
    """Spark's Arrow output, cast to the table's declared Arrow schema."""
    schema = arrow_schema(TABLES[name])
    return arrow.select(schema.names).cast(schema)


def _with_columns(arrow: pa.Table, schema: pa.Schema) -> pa.Table:
    """``arrow`` plus a null column for each column of ``schema`` it lacks (a table older than that column)."""
    for field in schema:
        if field.name not in arrow.column_names:
            arrow = arrow.append_column(field, pa.nulls(arrow.num_rows, field.type))
    return arrow


#: ``Acked`` events joined into one :class:`AckedBatch` record at most: ~60 bytes each, so a
#: record of ~120 KB, well inside a fetch's 1 MiB a partition.
ACKED_PER_RECORD = 2000

#: Per commands partition: the next offset to consume and how many records this batch held.
PROGRESS = StructType([
    StructField("partition", IntegerType(), True),
    StructField("end", LongType(), True),
    StructField("records", LongType(), True),
])


#: Every output of one batch and its columns, in the order of :func:`batch_sql`'s columns.
OUTPUTS: dict[str, StructType] = {
    "progress": PROGRESS,
    "deliver": routing.KAFKA_OUT,
    "acked": routing.KAFKA_OUT,
    "expired": routing.KAFKA_OUT,
    "messages": MESSAGES_TABLE,
    "trash": TRASH_TABLE,
    "deliveries": StructType(list(DELIVERIES_TABLE.fields) + [StructField("is_new", BooleanType(), True)]),
    "subscriptions": SUBSCRIPTIONS_TABLE,
    "receipts": RECEIPTS_TABLE,
}

_UNROUTED = StructType([StructField("smuid", LongType()), StructField("topic", StringType()),
                        StructField("priority", IntegerType()), StructField("expires_at", LongType())])

#: The columns of the stored messages the Trash, the receipts and DELIVERY ONE reassignments need.
_STORED_COLUMNS = ["smuid", "topic", "cmuid", "publisher", "publisher_guid", "priority", "headers", "sections",
                   "accepted_at", "batch_id", "expires_at", "receipt", "delivery", "depth", "hops", "origin",
                   "origin_topic"]

#: :data:`_STORED_COLUMNS` as a schema.
_STORED = StructType([MESSAGES_TABLE[name] for name in _STORED_COLUMNS])

#: The smuids already answered with a receipt (``receipts`` rows).
_RECEIPTED = StructType([StructField("smuid", LongType())])


def _empty(schema: StructType) -> str:
    """SQL: a relation with ``schema``'s columns and no rows, as a CTE body (Spark folds it away)."""
    return routing.empty_sql(schema)[1:-1]


def _any_record(records: pa.Table, pattern: str) -> bool:
    """Whether the value of any of the batch's records matches the regex ``pattern``."""
    values = pc.cast(records.column("value"), pa.string())
    return bool(records.num_rows) and pc.any(pc.match_substring_regex(values, pattern)).as_py()


_ONE = re.compile(r'"delivery"\s*:\s*"one"')


def has_delivery_one(records: pa.Table) -> bool:
    """Whether a record of the batch may be a DELIVERY ONE publish (a cheap over-approximation:
    a false positive only keeps the pick-one step in the plan)."""
    return _any_record(records, _ONE.pattern)


_RECEIPT = re.compile(r'"receipt"\s*:\s*"(?i:one|all)"')


def asks_for_receipt(records: pa.Table) -> bool:
    """Whether a record of the batch may be a publish asking for a receipt (RECEIPT ONE / ALL; a cheap
    over-approximation: a false positive only keeps the receipt steps in the plan)."""
    return _any_record(records, _RECEIPT.pattern)


def _ddl(kind: DataType) -> str:
    """``kind`` as a SQL type with every nested field nullable (field names quoted)."""
    if isinstance(kind, StructType):
        return "struct<" + ",".join(f"`{f.name}`:{_ddl(f.dataType)}" for f in kind.fields) + ">"
    if isinstance(kind, ArrayType):
        return f"array<{_ddl(kind.elementType)}>"
    return kind.simpleString()


def _as_struct(kind: StructType) -> str:
    """SQL: the columns of ``kind`` (by name) as one struct of that type, every field nullable.

    Nullable, so that the outputs can share one unioned frame (an output's
    struct is null in the other outputs' rows).
    """
    fields = ", ".join(f"'{f.name}', `{f.name}`" for f in kind.fields)
    return f"CAST(named_struct({fields}) AS {_ddl(kind)})"


def batch_sql(batch_id: int, routed_at: datetime, now: int | None = None, expiry: tuple[bool, bool] = (True, True),
              retries: bool = True, receipts: bool = True, one: bool = True, late: bool = False,
              clearing: bool = False, removing: bool = False, releases: bool = True,
              peers: Mapping[str, str] = routing.NO_PEERS) -> str:
    """The whole batch but its progress as one query over the relations ``{decoded_publish}``,
    ``{decoded_subscription}``, ``{decoded_ack}`` and ``{decoded_nack}`` (the batch's records,
    :func:`decode_records`, by kind: :func:`events_by_kind`), ``{current}``, ``{pending}``
    (stored deliveries that may expire, :data:`routing.PENDING`), ``{retrying}`` (the stored
    deliveries the batch's NACKs name, :data:`routing.RETRYING`) and ``{stored}`` (the stored
    messages of both, ``MESSAGES_TABLE`` columns :data:`_STORED_COLUMNS`), ``{receipt_state}`` (the
    stored deliveries of messages acknowledged or expiring in this batch that asked for a receipt,
    :data:`routing.RECEIPT_STATE`) and ``{receipted}`` (which of those were answered already).

    Each routing transform is a CTE of its own SQL (``routing.*_sql``, the text
    the public transforms run); every output is a struct column of its
    :data:`OUTPUTS` type, null except in the rows of its ``kind``.  ``now`` is
    the batch's clock (:func:`batch_now`).  ``expiry`` says whether a delivery
    routed in this batch, and whether a stored one, can expire (:func:`may_expire`);
    what cannot is left out of the plan (the whole of expiry would cost every
    micro-batch about twice as many shuffles); so is the retry count when the batch holds
    no NACK (``retries``), handing DELIVERY ONE messages on when no NACK names a stored
    delivery (``releases``), receipts when no message concerned asked for one (``receipts``),
    and picking one subscriber when no publish is DELIVERY ONE (``one``).  ``late``: the batch
    holds a SUBSCRIBE, so earlier messages may reach it (:func:`routing.late`, over the relations
    ``{late_stored}`` and ``{late_held}``, :meth:`CommandSink.late_candidates`; only when there are
    stored candidates or a publish of the batch may precede the SUBSCRIBE); ``clearing``: one
    of them has SINCE, which clears what is pending before it (:func:`routing.cleared`, over the
    relation ``{clearable}``, :meth:`CommandSink.clearable`), and what the batch routed to that
    subscriber before it (:func:`routing.withheld`); ``removing``: a REMOVE TOPIC left
    messages nobody holds (``{orphaned}``, :meth:`CommandSink.orphaned` and
    :func:`published_before_removal`; those the batch routes to somebody stay).  A smaller plan is
    what matters: analysing and optimising the query is most of a micro-batch.  ``peers``: the
    ``[federation] peers``, which get a message only as its Depth and Hops allow (:func:`routing.may_receive_sql`).
    """
    new, stored = expiry
    source = ", ".join(_STORED_COLUMNS)
    routed = "SELECT * FROM routed_all WHERE account <> ''" + (" UNION ALL SELECT * FROM late" if late else "")
    ctes = {
        **{f"events_{kind}": routing.valid_events_sql(f"{{decoded_{kind}}}") for kind in EVENT_KINDS},
        "intervals": routing.subscription_intervals_sql("{current}", "events_subscription"),
        "routed_all": routing.route_all_sql("events_publish", "intervals", one, peers),
        "late": (routing.late_sql("events_publish", "intervals", "{late_stored}", "{late_held}", "routed_all", now,
                                  peers) if late else _empty(routing.DELIVERIES)),
        "routed": (routing.withheld_sql("events_subscription", f"({routed})", cleared=False) if clearing else routed),
        "withheld": (routing.withheld_sql("events_subscription", f"({routed})") if clearing
                     else _empty(routing.DELIVERIES)),
        "acks": routing.extract_acks_sql("events_ack"),
        "unrouted": (f"SELECT * FROM ({routing.unrouted_of_sql('routed_all')}) "
                     "WHERE smuid NOT IN (SELECT smuid FROM late)" if late else routing.unrouted_of_sql("routed_all")),
        "expiring": (routing.expiring_sql("routed" if new else routing.empty_sql(routing.DELIVERIES),
                                          "unrouted" if new else routing.empty_sql(_UNROUTED), "acks",
                                          "{pending}" if stored else routing.empty_sql(routing.PENDING), now)
                     if new or stored else routing.empty_sql(routing.EXPIRING)[1:-1]),
        # the stored deliveries the NACKs name, and this batch's DELIVERY ALL ones: a gateway routing early
        # may have notified one and seen its retry timeout pass before the job routed it
        "retrying": ("SELECT * FROM {retrying} UNION ALL SELECT account, smuid, 'pending' AS status, "
                     "CAST(NULL AS INT) AS retries, delivery FROM routed WHERE delivery = 'all'") if retries
                    else _empty(routing.RETRYING),
        "new_messages": routing.message_rows_sql("events_publish", batch_id),
        "all_messages": f"SELECT {source} FROM new_messages UNION ALL SELECT {source} FROM {{stored}}",
        "released": (routing.released_sql("events_nack", "{retrying}", "acks", "expiring", "intervals", "all_messages",
                                          peers) if releases else _empty(routing.RELEASED)),
        "reassigned": routing.reassigned_sql("released", "all_messages") if releases else _empty(routing.DELIVERIES),
        "retried": (routing.retried_sql("events_nack", "retrying", "acks", "expiring", "released") if retries
                    else _empty(routing.RETRIED)),
        "cleared": (routing.cleared_sql("intervals", "{clearable}", "acks", "expiring", "retried", "released")
                    if clearing else _empty(routing.CLEARED)),
        "dead": routing.dead_messages_sql("expiring", "retried", "{orphaned}" if removing else None,
                                          "routed" if removing else None),
        "nobody": ("SELECT DISTINCT smuid, 'routed' AS status FROM late" if late
                   else _empty(routing.NOBODY_UPDATES))
                  + (" UNION ALL SELECT smuid, 'trashed' AS status FROM dead WHERE reason = 'topic_removed'"
                     if removing else ""),
        "live": routing.live_sql("routed", "expiring") if new else "SELECT * FROM routed",
        "settled": routing.settled_sql("acks", "live"),
        "out_acked": routing.acked_records_sql("settled"),
        "out_expired": routing.expired_records_sql("expiring", "retried", "released", "cleared"),
        # this batch's deliveries as first routed (``routed``, with late subscribers' and SINCE's withholding,
        # trips Catalyst here: "key not found: smuid"): a withheld one counts as a cleared stored one does
        "receipts_due": (routing.receipts_due_sql("{receipt_state}", "acks", "expiring", "{receipted}", "all_messages",
                                                  "routed_all")
                         if receipts
                         else _empty(routing.RECEIPTS_DUE)),
        "receipt_messages": (routing.receipt_messages_sql("receipts_due", "all_messages", now) if receipts
                             else _empty(routing.RECEIPT_MESSAGES)),
        "receipt_deliveries": f"SELECT {', '.join(routing.DELIVERIES.fieldNames())} FROM receipt_messages",
        "new_deliveries": ("SELECT * FROM routed UNION ALL SELECT * FROM receipt_deliveries "
                           "UNION ALL SELECT * FROM reassigned"),
        "out_deliver": routing.deliver_records_sql(f"({routing.unacknowledged_sql('live', 'acks')} UNION ALL SELECT * "
                                                   "FROM receipt_deliveries UNION ALL SELECT * FROM reassigned)"),
        "out_messages": ("SELECT * FROM new_messages UNION ALL "
                         + routing.receipt_message_rows_sql("receipt_messages", batch_id)),
        "out_receipts": routing.receipt_rows_sql("receipt_messages", batch_id),
        "out_trash": routing.trash_sql("dead", "all_messages", now, batch_id),
        "out_deliveries": routing.delivery_updates_sql("new_deliveries", "acks", batch_id, routed_at, now,
                                                       # a publish of the batch trashed at once keeps no row
                                                       "(SELECT * FROM unrouted WHERE smuid NOT IN (SELECT smuid "
                                                       "FROM dead WHERE reason = 'topic_removed'))" if removing
                                                       else "unrouted", "expiring", "retried", "released", "nobody",
                                                       "cleared", "withheld" if clearing else None),
        "out_subscriptions": routing.subscription_state_sql("intervals", batch_id),
    }
    parts = [
        f"SELECT '{kind}' AS kind, "
        + ", ".join(f"{_as_struct(OUTPUTS[other])} AS {other}" if other == kind else f"NULL AS {other}"
                    for other in OUTPUTS)
        + f" FROM out_{kind}"
        for kind in OUTPUTS if kind != "progress"  # counted from the records themselves: :func:`_progress`
    ]
    return ("WITH " + ",\n".join(f"{name} AS (\n{sql}\n)" for name, sql in ctes.items())
            + "\n" + "\nUNION ALL\n".join(parts))


def batch_now(records: pa.Table) -> int | None:
    """The batch's clock (microseconds): the largest tick ``at`` or ``accepted_at`` among the
    Kafka records ``records`` (their ``value`` column), None when none has one.

    Read from the records themselves, so a replayed batch gets the same "now"
    and expires the same messages (DESIGN Property 4).  The fields are found in
    the JSON text: every event is encoded with its fields at the top level, and
    nested strings are escaped, so ``"at":`` / ``"accepted_at":`` only match
    the event's own fields.
    """
    if not records.num_rows:
        return None
    values = pc.cast(records.column("value"), pa.string())
    found = []
    for pattern in (r'^\{\s*"type"\s*:\s*"tick"\s*,\s*"at"\s*:\s*(?P<n>-?\d+)', r'"accepted_at"\s*:\s*(?P<n>-?\d+)'):
        numbers = pc.struct_field(pc.extract_regex(values, pattern), [0])
        found.append(pc.max(pc.cast(numbers, pa.int64())).as_py())
    found = [n for n in found if n is not None]
    return max(found) if found else None


def may_expire(records: pa.Table, now: int | None, pending: pa.Table) -> tuple[bool, bool]:
    """Whether a delivery of this batch (a publish whose ``expires_at`` is at or before ``now``),
    and whether a stored one (``pending``, already read for ``now``), can expire in this batch.

    Only an optimisation: what this rules out is left out of the batch's plan;
    a publish it missed is stored ``pending`` and expires in a later batch.
    """
    if now is None:
        return False, False
    values = pc.cast(records.column("value"), pa.string())
    expiries = pc.struct_field(pc.extract_regex(values, r'"expires_at"\s*:\s*(?P<n>-?\d+)'), [0])
    earliest = pc.min(pc.cast(expiries, pa.int64())).as_py()
    return earliest is not None and earliest <= now, pending.num_rows > 0


def _of_type(type_: str) -> str:
    """Regex: a record value that is an event of ``type_`` (every event's JSON starts with its type)."""
    return rf'^\{{\s*"type"\s*:\s*"{type_}"'


def _is(records: pa.Table, type_: str) -> pa.ChunkedArray:
    """Which of the batch's records are events of ``type_``."""
    return pc.match_substring_regex(pc.cast(records.column("value"), pa.string()), _of_type(type_))


def _events_at(records: pa.Table, type_: str) -> list[tuple[tuple, dict]]:
    """The batch's events of ``type_``, decoded in Python (the pre-reads need only rare kinds), each
    with its position (Kafka timestamp, partition, offset: the order of ``seq``)."""
    chosen = records.filter(_is(records, type_))
    positions = zip(chosen.column("timestamp").to_pylist(), chosen.column("partition").to_pylist(),
                    chosen.column("offset").to_pylist())
    found = []
    for raw, position in zip(chosen.column("value").to_pylist(), positions):
        with contextlib.suppress(ValueError):
            event = json.loads(raw)
            if isinstance(event, dict):
                found.append((position, event))
    return found


def _events(records: pa.Table, type_: str) -> list[dict]:
    """The batch's events of ``type_``, decoded in Python: the pre-reads need only rare kinds."""
    return [event for _, event in _events_at(records, type_)]


def _fields(events: list[dict], make) -> list:
    """``make(event)`` of each event it fits, sorted and without repeats (malformed events skipped)."""
    made = set()
    for event in events:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            made.add(make(event))
    return sorted(made)


def nacked_keys(records: pa.Table) -> list[tuple[str, int]]:
    """The (account, smuid) pairs the batch's NACK records name."""
    return _fields(_events(records, "nack"), lambda e: (str(e["account"]), int(e["smuid"])))


def subscribes(records: pa.Table) -> list[tuple[str, str, bool]]:
    """The (account, pattern, with SINCE) of the batch's SUBSCRIBE records."""
    return _fields(_events(records, "subscribe"),
                   lambda e: (str(e["account"]), str(e["pattern"]), e.get("since") is not None))


def publish_before_subscribe(records: pa.Table) -> bool:
    """Whether a publish of the batch may precede one of its SUBSCRIBEs (by Kafka timestamp, an
    over-approximation of ``seq`` order): only then can a late subscriber take a message of the
    batch itself."""
    stamps = records.column("timestamp")
    last_subscribe = pc.max(stamps.filter(_is(records, "subscribe"))).as_py()
    first_publish = pc.min(stamps.filter(_is(records, "publish"))).as_py()
    return last_subscribe is not None and first_publish is not None and first_publish <= last_subscribe


def _sql_string(text: str) -> str:
    """``text`` as a SQL string literal (for the delta-rs queries)."""
    return "'" + text.replace("'", "''") + "'"


def removed_topics(records: pa.Table) -> list[str]:
    """The topics the batch's REMOVE TOPIC records name."""
    return _fields(_events(records, "remove_topic"), lambda e: str(e["topic"]))


def published_before_removal(records: pa.Table) -> list[int]:
    """The smuids of the batch's publishes that precede (in ``seq`` order) a REMOVE TOPIC of the
    batch naming their topic or an ancestor: the removal orphans them too when nobody holds them."""
    removals = [(at, str(event["topic"]).rstrip("/")) for at, event in _events_at(records, "remove_topic")
                if "topic" in event]
    if not removals:
        return []
    found = set()
    for at, event in _events_at(records, "publish"):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            topic, smuid = str(event["topic"]), int(event["smuid"])
            if any(at < removed_at and (topic == removed or topic.startswith(removed + "/"))
                   for removed_at, removed in removals):
                found.add(smuid)
    return sorted(found)


#: Regex: an event's ``smuid`` field (a top-level one: quotes nested in strings are escaped).
_SMUID_FIELD = r'"smuid"\s*:\s*(?P<n>\d+)'


def acked_smuids(records: pa.Table) -> list[int]:
    """The smuids the batch's ACK records name (common: read by regex, not decoded)."""
    values = pc.cast(records.column("value"), pa.string()).filter(_is(records, "ack"))
    numbers = pc.struct_field(pc.extract_regex(values, _SMUID_FIELD), [0])
    return sorted(set(pc.cast(numbers, pa.int64()).drop_null().to_pylist()))


def acks_its_own_receipt_publish(records: pa.Table) -> bool:
    """Whether an ACK of the batch names a publish of the same batch that asked for a receipt (a
    gateway routed it early): its receipt may be due now.  Only the receipt-asking publishes are
    read, by regex, so a batch without one costs a scan."""
    values = pc.cast(records.column("value"), pa.string())
    asking = values.filter(pc.and_(_is(records, "publish"), pc.match_substring_regex(values, _RECEIPT.pattern)))
    if not len(asking):
        return False
    smuids = pc.cast(pc.struct_field(pc.extract_regex(asking, _SMUID_FIELD), [0]), pa.int64()).drop_null()
    return bool(set(smuids.to_pylist()) & set(acked_smuids(records)))


#: The event types the routing query acts on; the other control events (topic registry, logins,
#: presence) are the gateways' alone.
_ROUTED_TYPES = "|".join(sorted(cls.TYPE for cls in (Publish, Subscribe, Unsubscribe, Ack, Nack, RemoveTopic)))


def _nothing_to_route(records: pa.Table) -> bool:
    """True when no record of the batch is an event the job routes: only the clock moved (ticks), or
    only the gateways' control events came (a login's presence, a topic created …)."""
    return bool(records.num_rows) and not _any_record(records, _of_type(f"({_ROUTED_TYPES})"))


def _progress(records: pa.Table) -> list[dict]:
    """:data:`PROGRESS` rows of a batch, computed from its records in Python: how far each partition was read."""
    grouped = records.group_by("partition").aggregate([("offset", "max"), ("offset", "count")])
    return [{"partition": p, "end": m + 1, "records": n} for p, m, n in zip(
        grouped.column("partition").to_pylist(), grouped.column("offset_max").to_pylist(),
        grouped.column("offset_count").to_pylist())]


_EVENTS_ARROW = arrow_schema(routing.EVENTS)

#: :data:`_EVENTS_ARROW` but a record's position (its last three columns), and that position's struct.
_COMMAND_ARROW = pa.schema(list(_EVENTS_ARROW)[:-3])
_SEQ_ARROW = _EVENTS_ARROW.field("seq").type


def _command_fields(value: bytes | None) -> dict:
    """A record's value as the JSON object it should be, else ``{}`` (every field null, as from_json gives)."""
    try:
        decoded = json.loads(value)
    except (ValueError, TypeError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def in_log_order(records: pa.Table, floors: dict[int, int]) -> tuple[pa.Table, dict[int, int]]:
    """``records`` with each partition's timestamps made non-decreasing in offset order, from
    ``floors`` (the last timestamp, in µs, of each partition's previous batch); and the new floors.

    Why: the routing orders commands by ``seq`` (timestamp, partition, offset), so that several
    commands partitions merge by time. But a record's timestamp is its gateway's clock: a PUBLISH
    one gateway appends just after another gateway's SUBSCRIBE may carry an earlier time, and was
    routed as if it came first, reaching nobody, where the gateways' fold (in offset order) routed
    it to the subscriber. Within a partition the log's order is the truth (Property 2), so a
    timestamp is raised to the latest before it there; across partitions time still merges them.
    ``tests/streaming/test_routing_parity.py`` proves the two routings equal on skewed clocks."""
    if not records.num_rows:
        return records, floors
    column = records.column("timestamp").combine_chunks()
    stamps = pc.cast(column, pa.int64()).to_pylist()
    partitions, offsets = records.column("partition").to_pylist(), records.column("offset").to_pylist()
    raised, floors = list(stamps), dict(floors)
    for row in sorted(range(records.num_rows), key=lambda i: (partitions[i], offsets[i])):
        floor = floors.get(partitions[row])
        if stamps[row] is not None:
            raised[row] = stamps[row] if floor is None else max(stamps[row], floor)
            floors[partitions[row]] = raised[row]
    if raised == stamps:
        return records, floors
    index = records.schema.get_field_index("timestamp")
    return records.set_column(index, records.schema.field(index), pa.array(raised, pa.int64()).cast(column.type)), floors


def decode_records(records: pa.Table) -> pa.Table:
    """A batch's Kafka records (``KAFKA_RECORD`` columns) as :data:`routing.EVENTS` rows, one per record:
    the sink's own :func:`routing.decoded_records_sql`.

    JSON is decoded here, in Python, not by ``from_json`` in the routing query: the query then
    starts from flat columns, and Spark no longer parses every record once per reference to
    ``events`` while optimising (measured on this box: 20-45 % less planning CPU per batch, most for
    large batches).  Extra fields are ignored and missing ones are null, as with ``from_json``; a
    record whose fields do not fit their types is all null (``from_json`` may keep the fields that
    do), so :func:`routing.valid_events_sql` drops it, as it does non-JSON records.
    """
    commands = [_command_fields(value) for value in records.column("value").to_pylist()]
    try:
        fields = pa.Table.from_pylist(commands, schema=_COMMAND_ARROW)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        fields = pa.concat_tables([_command_row(command) for command in commands])
    # The positions straight from Arrow: through Python objects, timestamps cost more than the JSON.
    at, partition, offset = (records.column(name).combine_chunks().cast(field.type)
                             for name, field in zip(("timestamp", "partition", "offset"), _SEQ_ARROW))
    seq = pa.StructArray.from_arrays([at, partition, offset], fields=list(_SEQ_ARROW))
    return pa.Table.from_arrays(fields.columns + [seq, partition, offset], schema=_EVENTS_ARROW)


def _command_row(command: dict) -> pa.Table:
    """One record's command fields, all null when a field does not fit its type."""
    try:
        return pa.Table.from_pylist([command], schema=_COMMAND_ARROW)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.Table.from_pylist([{}], schema=_COMMAND_ARROW)


#: The batch's events by kind, each its own relation of the routing query (``{decoded_<kind>}``): the
#: types of :data:`routing._VALID` each kind holds.
EVENT_KINDS: dict[str, tuple[str, ...]] = {"publish": ("publish",), "subscription": ("subscribe", "unsubscribe"),
                                          "ack": ("ack",), "nack": ("nack",)}


def events_by_kind(decoded: pa.Table) -> dict[str, pa.Table]:
    """:func:`decode_records`'s rows split by :data:`EVENT_KINDS` (rows of no kind are no command).

    Why: Spark evaluates a small relation while optimising, once per reference to it, and every
    transform reads the events of one kind; with one relation of every event, each reference
    filtered all of them (an ACK batch's 20,000 rows by every publish transform; measured: planning
    such a batch took 1.9-2.1 s, split 0.8-0.9 s).  Split, a transform whose kind the batch lacks
    reads an empty relation, folded away without reading a row.
    """
    types = decoded.column("type")
    return {kind: decoded.filter(pc.fill_null(pc.is_in(types, pa.array(names)), False))
            for kind, names in EVENT_KINDS.items()}


def _by_seq(records: pa.Table) -> pa.Table:
    """Kafka records in the order of the commands they answer."""
    seq = records.column("seq").combine_chunks() if records.num_rows else None
    if seq is None:
        return records
    keys = pa.table({name: seq.field(name) for name in ("timestamp", "partition", "offset")})
    order = pc.sort_indices(keys, sort_keys=[("timestamp", "ascending"), ("partition", "ascending"),
                                             ("offset", "ascending")])
    return records.take(order)


_ACCOUNT_TOPIC = r"^/accounts/[^/]+$"

#: Statuses of the non-new ``deliveries`` rows that end a stored delivery in this batch.
_SETTLING = ["acked", "expired", "trashed", "released", "cleared"]


def _picked_one(deliveries: pa.Table) -> pa.Table:
    """The routing query's new, unacknowledged DELIVERY ONE deliveries (not those of account topics,
    which have one possible holder, their owner)."""
    mask = pc.and_(pc.and_(deliveries.column("is_new"), pc.equal(deliveries.column("status"), "pending")),
                   pc.and_(pc.equal(deliveries.column("delivery"), "one"),
                           pc.not_equal(deliveries.column("account"), "")))
    mask = pc.and_(mask, pc.invert(pc.match_substring_regex(deliveries.column("topic"), _ACCOUNT_TOPIC)))
    return deliveries.filter(pc.fill_null(mask, False))


def _withheld_one(deliveries: pa.Table) -> dict[int, str]:
    """smuid → account of the batch's DELIVERY ONE deliveries a SINCE later in the batch withheld
    (new rows, status ``cleared``)."""
    rows = deliveries.filter(pc.fill_null(pc.and_(
        pc.and_(deliveries.column("is_new"), pc.equal(deliveries.column("status"), "cleared")),
        pc.equal(deliveries.column("delivery"), "one")), False))
    return dict(zip(rows.column("smuid").to_pylist(), rows.column("account").to_pylist()))


def _is_settlement(deliveries: pa.Table) -> pa.ChunkedArray:
    """Which rows update a stored delivery (not ``is_new``)."""
    return pc.invert(pc.fill_null(deliveries.column("is_new"), False))


def _settlements(deliveries: pa.Table) -> dict[tuple[str, int], str]:
    """(account, smuid) → status of the stored deliveries this batch ends (ACKed, expired, …)."""
    rows = deliveries.filter(pc.and_(_is_settlement(deliveries),
                                     pc.is_in(deliveries.column("status"), pa.array(_SETTLING))))
    return {(a, s): status for a, s, status in zip(rows.column("account").to_pylist(), rows.column("smuid").to_pylist(),
                                                   rows.column("status").to_pylist())}


def _settled_nobody(deliveries: pa.Table) -> set[int]:
    """The messages of account ``''`` rows this batch expires or trashes: none of them is dispatched."""
    rows = deliveries.filter(pc.and_(pc.equal(deliveries.column("account"), ""),
                                     pc.is_in(deliveries.column("status"), pa.array(["expired", "trashed"]))))
    return set(rows.column("smuid").to_pylist())


def _withheld_records(deliveries: pa.Table) -> pa.Table:
    """``Acked`` records (:data:`routing.KAFKA_OUT`) of the batch's deliveries a SINCE later in the batch
    withheld (new rows ``cleared``): the job never sent them, but a gateway routing early may have.
    Made here rather than in the query, whose plan each reference to ``withheld`` would grow."""
    withheld = deliveries.filter(pc.and_(deliveries.column("is_new"), pc.equal(deliveries.column("status"), "cleared")))
    accounts, smuids = withheld.column("account").to_pylist(), withheld.column("smuid").to_pylist()
    return pa.table({
        "key": pa.array([account.encode() for account in accounts], pa.binary()),
        "value": [Acked(account, smuid, "cleared").to_bytes().decode() for account, smuid in zip(accounts, smuids)],
        "seq": pa.nulls(len(accounts)),
    }).cast(arrow_schema(routing.KAFKA_OUT))


def _expiries(deliveries: pa.Table) -> list[int]:
    """When the batch's new deliveries that may expire do (µs, distinct): pending, unrouted or waiting
    ones of a message with a timeout."""
    new = deliveries.filter(pc.fill_null(pc.and_(deliveries.column("is_new"), pc.is_in(
        deliveries.column("status"), pa.array(["pending", "unrouted", "waiting"]))), False))
    return pc.unique(new.column("expires_at").cast(pa.int64()).drop_null()).to_pylist()


def _micros(value: datetime | int | None) -> int | None:
    """A timestamp as microseconds since the epoch (ints pass through)."""
    if value is None or isinstance(value, int):
        return value
    return int(value.timestamp() * 1_000_000) if value.tzinfo else int(
        value.replace(tzinfo=timezone.utc).timestamp() * 1_000_000)


def _record_smuids(records: pa.Table) -> pa.Array:
    """The smuid of each Deliver/Acked record (a top-level field; nested quotes are escaped)."""
    found = pc.struct_field(pc.extract_regex(records.column("value"), _SMUID_FIELD), [0])
    return pc.cast(found, pa.int64())


def _picked_messages(deliver: pa.Table) -> dict[int, dict]:
    """smuid → the batch's DELIVERY ONE Deliver records (as JSON objects): when the message was
    accepted, its Depth and Hops."""
    ones = deliver.filter(pc.match_substring(deliver.column("value"), '"delivery":"one"'))
    return {event["smuid"]: event for event in map(json.loads, ones.column("value").to_pylist())}


def _delivery_row(message: dict, account: str, status: str, batch_id: int, routed_at: datetime,
                  is_new: bool) -> dict:
    """A ``deliveries`` output row (:data:`OUTPUTS`) of a stored DELIVERY ONE message."""
    return {"account": account, "smuid": message["smuid"], "topic": message["topic"],
            "priority": message["priority"], "status": status, "routed_at": routed_at,
            "routed_batch_id": batch_id, "acked_at": None, "acked_guid": None, "expires_at": message["expires_at"],
            "retries": None, "receipt": message["receipt"] or "none", "delivery": "one", "is_new": is_new}


def _deliver_record(message: dict, account: str) -> dict:
    """The ``smqp.deliveries`` record (:data:`routing.KAFKA_OUT`) of a stored message for ``account``."""
    event = Deliver(account=account, smuid=message["smuid"], topic=message["topic"], cmuid=message["cmuid"],
                    publisher=message["publisher"], publisher_guid=message["publisher_guid"],
                    accepted_at=_micros(message["accepted_at"]), priority=message["priority"] or 0,
                    headers=[tuple(h) for h in message["headers"] or []],
                    sections=[Section.from_json(s) for s in message["sections"] or []], delivery="one",
                    expires_at=_micros(message["expires_at"]), depth=message["depth"] or 0,
                    hops=list(message["hops"] or []), origin=message["origin"], origin_topic=message["origin_topic"])
    return {"key": account.encode(), "value": event.to_bytes().decode(), "seq": None}


def _rehold(deliveries: pa.Table, picked: pa.Table, holders: dict[int, str | None], dispatched: dict[int, dict],
            unplaced: dict[int, dict], batch_id: int, routed_at: datetime) -> tuple[pa.Table, set[int]]:
    """The batch's ``deliveries`` rows with each pick whose holder ``holders`` changed moved to it (or,
    with no holder, replaced by a ``waiting`` row of account ``''``), plus a pending row and a
    ``routed`` one for each ``dispatched`` message and a ``waiting`` one for each ``unplaced`` one
    (smuid → its message: waiting, or cleared away from its holder); and which picks changed."""
    picks = picked.to_pylist()
    changed = {row["smuid"] for row in picks if holders.get(row["smuid"], row["account"]) != row["account"]}
    waits = sorted(smuid for smuid in changed if holders[smuid] is None)
    rows = [dict(row, account=holders[row["smuid"]] or "", status="waiting" if holders[row["smuid"]] is None
                 else row["status"]) for row in picks if row["smuid"] in changed]
    for smuid, message in sorted(dispatched.items()):
        rows.append(_delivery_row(message, holders[smuid], "pending", batch_id, routed_at, True))
        rows.append(_delivery_row(message, "", "routed", batch_id, routed_at, False))
    rows += [_delivery_row(message, "", "waiting", batch_id, routed_at, True) for _, message in sorted(unplaced.items())]
    smuids, accounts = deliveries.column("smuid"), deliveries.column("account")
    moved_picks = pc.and_(pc.is_in(smuids, pa.array(sorted(changed), pa.int64())),
                          pc.and_(deliveries.column("is_new"), pc.not_equal(accounts, "")))
    redone_nobody = pc.and_(pc.equal(accounts, ""),
                            pc.is_in(smuids, pa.array(waits + sorted(dispatched), pa.int64())))
    kept = deliveries.filter(pc.invert(pc.fill_null(pc.or_(moved_picks, redone_nobody), False)))
    return pa.concat_tables([kept, pa.Table.from_pylist(rows, schema=deliveries.schema)]), changed


def _redeliver(deliver: pa.Table, holders: dict[int, str | None], changed: set[int], added: list[dict]) -> pa.Table:
    """The batch's Deliver records with each ``changed`` pick sent to its new holder (or dropped: it
    waits), plus the ``added`` ones."""
    if not changed and not added:
        return deliver
    smuids = _record_smuids(deliver)
    moving = pc.fill_null(pc.is_in(smuids, pa.array(sorted(changed), pa.int64())), False)
    moved = []
    for record in deliver.filter(moving).to_pylist():
        event = json.loads(record["value"])
        if (holder := holders[event["smuid"]]) is not None:
            event["account"] = holder
            moved.append({**record, "key": holder.encode(), "value": json.dumps(event, separators=(",", ":"))})
    return pa.concat_tables([deliver.filter(pc.invert(moving)),
                             pa.Table.from_pylist(moved + added, schema=deliver.schema)])


class CommandSink:
    """``foreachBatch`` callable: ``sink(batch_df, batch_id)``. Holds one producer (:class:`kafka_edge.ThreadedLog`).

    ``close()`` lets it finish and closes it; call it after the query stops.
    """

    def __init__(self, config: SMQPConfig):
        self.config = config
        self.query_name = config.streaming.query_name
        self._producer = None
        self.sweep_trash = TrashSweeper(config)
        self.topic_settings = TopicSettings(config.topics)
        # whether DELIVERY ONE messages may be waiting for a subscriber with room (None: not read yet)
        self._waiting: bool | None = None
        self._removed_held: set[int] | None = None  # see :meth:`removed_held`
        self._tables: dict[str, DeltaTable] = {}  # the Delta tables, open (:meth:`_table`)
        self._log_floors: dict[int, int] = {}  # per commands partition, its last record's time (:func:`in_log_order`)
        # the last batch's routing query: ms planning it (parse, analyse, optimise, physical plan), running it
        self.query_ms = {"plan": 0.0, "run": 0.0}
        # told, after each commit, when the deliveries it routed expire (µs): the job's ticker
        # (:meth:`streaming.ticker.Ticker.wake_at`) ticks then, so they expire without waiting for its next tick
        self.expiry_alarm: Callable[[list[int]], None] | None = None

    # -- helpers

    def app_id(self, table: str) -> str:
        """The Delta app-transaction id for ``table``: ``"<query name>:<table>"``."""
        return f"{self.query_name}:{table}"

    def committed_version(self, table: str) -> int | None:
        """The last batch id committed to ``table`` by this query (None: never)."""
        if not self._exists(table):
            return None
        return self._table(table).transaction_version(self.app_id(table))

    def _exists(self, name: str) -> bool:
        return name in self._tables or DeltaTable.is_deltatable(self.config.table_path(name))

    def _done(self, table: str, batch_id: int) -> bool:
        version = self.committed_version(table)
        return version is not None and version >= batch_id

    def _table(self, name: str) -> DeltaTable:
        """Table ``name`` at its latest version: opened once (:meth:`_open`), then brought up to date.

        Why kept open: a batch reads or commits a dozen times, and opening a table reads its last
        checkpoint and the log after it, where an open one reads only the commits it has not seen
        (measured with delta-rs 1.6: 12 ms against 2 ms; a commit and a fresh open 39 ms against 8)."""
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = self._open(name)
        else:
            table.update_incremental()
        return table

    def _open(self, name: str) -> DeltaTable:
        """Table ``name``, created when missing (with :data:`TABLE_PROPERTIES`), and given any column
        its schema gained and any of those properties it lacks since."""
        path = self.config.table_path(name)
        if not DeltaTable.is_deltatable(path):
            DeltaTable.create(path, schema=arrow_schema(TABLES[name]), mode="ignore", name=name,
                              configuration=TABLE_PROPERTIES)
        table = DeltaTable(path)
        configured = table.metadata().configuration
        # a table made before the pin: delta-rs cannot set the column mapping key on an existing
        # table, and absent it means "none" there, so only the other keys are set
        missing = {key: value for key, value in TABLE_PROPERTIES.items()
                   if configured.get(key) != value and key != "delta.columnMapping.mode"}
        if missing:
            table.alter.set_table_properties(missing)
            table = DeltaTable(path)
        present = {f.name for f in table.schema().fields}
        missing = [f for f in arrow_schema(TABLES[name]) if f.name not in present]
        if missing:
            # A data dir written before a column existed (e.g. subscriptions.since): the merges name every column.
            table.alter.add_columns(Schema.from_arrow(pa.schema(missing)).fields)
            table = DeltaTable(path)
        return table

    def _uncommitted(self, name: str, batch_id: int) -> DeltaTable | None:
        """Table ``name`` opened once for this commit, or None when it already holds ``batch_id``."""
        table = self._table(name)
        version = table.transaction_version(self.app_id(name))
        return None if version is not None and version >= batch_id else table

    def producer(self) -> ThreadedLog:
        """The long-lived producer to the deliveries topic (acks=all), created on first use."""
        if self._producer is None:
            self._producer = ThreadedLog(self.config.job_kafka, self.config.kafka.deliveries_topic,
                                         client_id=f"{self.query_name}-sink")
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def active_subscriptions(self) -> pa.Table:
        """Active rows of the ``subscriptions`` Delta table."""
        schema = arrow_schema(SUBSCRIPTIONS_TABLE)
        if not self._exists("subscriptions"):
            return schema.empty_table()
        arrow = self._table("subscriptions").to_pyarrow_table(filters=[("active", "=", True)])
        return _with_columns(arrow, schema).select(schema.names).cast(schema)

    def current_subscriptions(self, spark: SparkSession) -> DataFrame:
        """Active rows of the ``subscriptions`` Delta table, as a Spark frame."""
        return spark.createDataFrame(self.active_subscriptions(), schema=SUBSCRIPTIONS_TABLE)

    def expiry_candidates(self, now: int | None, deliveries: DeltaTable | None = None) -> pa.Table:
        """Stored deliveries (:data:`routing.PENDING`) still ``pending`` (``deliveries``) or ``unrouted``
        or ``waiting`` (the ``unrouted`` table) whose message expires at or before ``now``.

        Reads only those rows: delta-rs prunes files by their ``status`` and
        ``expires_at`` statistics, so rows already settled and messages that
        expire later mostly cost nothing.  ``deliveries``: the table, when the batch opened it already.
        """
        schema = arrow_schema(routing.PENDING)
        if now is None:
            return schema.empty_table()
        # delta-rs' own engine (DataFusion): merges write string_view columns, which pyarrow's
        # dataset filters cannot compare with the table's string statistics.
        columns = ", ".join(schema.names)
        where = f"WHERE status IN ('pending', 'unrouted', 'waiting') AND expires_at <= to_timestamp_micros({int(now)})"
        reader = (QueryBuilder().register("deliveries", deliveries or self._table("deliveries"))
                  .register("unrouted", self._table("unrouted"))
                  .execute(f"SELECT {columns} FROM deliveries {where} UNION ALL SELECT {columns} FROM unrouted {where}"))
        return pa.table(reader).cast(schema)

    def retry_candidates(self, deliveries: DeltaTable, keys: list[tuple[str, int]]) -> pa.Table:
        """The stored ``deliveries`` rows (:data:`routing.RETRYING`) of the messages the NACKed
        ``keys`` name, every account's (who held a DELIVERY ONE message before)."""
        schema = arrow_schema(routing.RETRYING)
        if not keys:
            return schema.empty_table()
        smuids = ", ".join(str(int(smuid)) for smuid in sorted({smuid for _, smuid in keys}))
        reader = (QueryBuilder().register("deliveries", deliveries)
                  .execute(f"SELECT account, smuid, status, retries, delivery FROM deliveries WHERE smuid IN ({smuids})"))
        return pa.table(reader).cast(schema)

    def receipt_state(self, deliveries: DeltaTable, smuids: list[int]) -> pa.Table:
        """Every stored delivery (:data:`routing.RECEIPT_STATE`) of those of ``smuids`` that asked for
        a receipt.  delta-rs prunes by the ``receipt`` statistics: files of messages that asked for
        none (most) cost nothing."""
        schema = arrow_schema(routing.RECEIPT_STATE)
        if not smuids:
            return schema.empty_table()
        # by their range, then picked here: a batch's 20,000 ACKs as an IN list of the query cost
        # ~370 ms to plan alone (measured), for the rows of the few messages that asked for a receipt
        reader = (QueryBuilder().register("deliveries", deliveries)
                  .execute("SELECT account, smuid, status, receipt FROM deliveries WHERE receipt IN ('one', 'all') "
                           f"AND smuid BETWEEN {int(min(smuids))} AND {int(max(smuids))}"))
        arrow = pa.table(reader).cast(schema)
        return arrow.filter(pc.is_in(arrow.column("smuid"), pa.array(smuids, pa.int64())))

    def receipted(self, smuids: list[int]) -> pa.Table:
        """Which of ``smuids`` were answered with a receipt already (``receipts`` rows)."""
        schema = arrow_schema(_RECEIPTED)
        if not smuids:
            return schema.empty_table()
        return self._table("receipts").to_pyarrow_table(
            columns=["smuid"], filters=[("smuid", "in", sorted(smuids))]).cast(schema)

    def stored_messages(self, smuids: list[int]) -> pa.Table:
        """The stored ``messages`` rows (columns :data:`_STORED_COLUMNS`) of ``smuids``."""
        schema = arrow_schema(_STORED)
        if not smuids:
            return schema.empty_table()
        arrow = self._table("messages").to_pyarrow_table(
            columns=_STORED_COLUMNS, filters=[("smuid", ">=", min(smuids)), ("smuid", "<=", max(smuids))])
        arrow = arrow.filter(pc.is_in(arrow.column("smuid"), pa.array(smuids, pa.int64())))
        return arrow.cast(schema)

    def late_candidates(self, deliveries: DeltaTable, subscribed: list[tuple[str, str]],
                        now: int | None) -> tuple[pa.Table, pa.Table]:
        """What late subscribers may get (:func:`routing.late`): the stored messages (columns
        :data:`_STORED_COLUMNS`) on the topics the batch's SUBSCRIBEs (``subscribed``: (account,
        pattern)) cover that are not expired at ``now`` nor in the Trash as a whole, leaving out
        DELIVERY ONE messages somebody holds or that wait for room (:meth:`limit_in_flight`); and which of them those accounts hold already
        (:data:`routing.HELD`).  Read only for a batch with a SUBSCRIBE."""
        schema = arrow_schema(_STORED)
        held_schema = arrow_schema(routing.HELD)
        if not subscribed:
            return schema.empty_table(), held_schema.empty_table()
        matches = " OR ".join(f"starts_with(topic, {_sql_string(pattern[:-1])})" if pattern.endswith("/*")
                              else f"topic = {_sql_string(pattern)}" for pattern in sorted({p for _, p in subscribed}))
        alive = "" if now is None else f"(expires_at IS NULL OR expires_at > to_timestamp_micros({int(now)})) AND "
        candidates = f"""SELECT {", ".join(_STORED_COLUMNS)} FROM messages
WHERE {alive}({matches})
  AND NOT (coalesce(delivery, 'all') = 'one' AND smuid IN (SELECT smuid FROM deliveries WHERE delivery = 'one'))
  AND smuid NOT IN (SELECT smuid FROM trash WHERE coalesce(account, '') = '')
  AND smuid NOT IN (SELECT smuid FROM unrouted WHERE status = 'waiting')"""
        accounts = ", ".join(_sql_string(account) for account in sorted({a for a, _ in subscribed}))

        def query(sql: str) -> pa.Table:
            return pa.table(QueryBuilder().register("messages", self._table("messages"))
                            .register("deliveries", deliveries).register("trash", self._table("trash"))
                            .register("unrouted", self._table("unrouted")).execute(sql))

        stored = query(candidates)
        if not stored.num_rows:
            return schema.empty_table(), held_schema.empty_table()
        held = query(f"SELECT account, smuid FROM deliveries WHERE account IN ({accounts}) "
                     f"AND smuid IN (SELECT smuid FROM ({candidates}))")
        return stored.select(schema.names).cast(schema), held.cast(held_schema)

    def clearable(self, deliveries: DeltaTable, accounts: list[str]) -> pa.Table:
        """The stored pending deliveries of ``accounts`` (those SUBSCRIBing with SINCE in the batch)
        with their message's acceptance time (:data:`routing.CLEARABLE`)."""
        schema = arrow_schema(routing.CLEARABLE)
        if not accounts:
            return schema.empty_table()
        listed = ", ".join(_sql_string(account) for account in sorted(set(accounts)))
        pending = pa.table(QueryBuilder().register("deliveries", deliveries).execute(
            f"SELECT account, smuid, topic FROM deliveries WHERE status = 'pending' AND account IN ({listed})"))
        if not pending.num_rows:
            return schema.empty_table()
        pending = pending.cast(pa.schema([("account", pa.string()), ("smuid", pa.int64()), ("topic", pa.string())]))
        messages = self.stored_messages(sorted(set(pending.column("smuid").to_pylist())))
        joined = pending.join(messages.select(["smuid", "accepted_at"]), "smuid", join_type="inner")
        return joined.select(schema.names).cast(schema)

    def orphaned(self, deliveries: DeltaTable, topics: list[str], now: int | None) -> pa.Table:
        """The stored messages (:data:`routing.ORPHANED`) of the removed ``topics`` and their
        descendants that have not expired, are not in the Trash as a whole and that nobody holds
        (no ``pending`` delivery): unrouted ones, and those kept only for late subscribers."""
        return self._removed_messages(deliveries, topics, now, held=False).select(["smuid"]).cast(
            arrow_schema(routing.ORPHANED))

    def _removed_messages(self, deliveries: DeltaTable, topics: list[str], now: int | None, held: bool) -> pa.Table:
        """The stored messages of the removed ``topics`` and their descendants that have not expired
        and are not in the Trash as a whole, that somebody holds (a ``pending`` delivery; ``held``)
        or that nobody does: smuid, topic, priority, expires_at."""
        if not topics:
            return pa.table({"smuid": pa.array([], pa.int64())})
        under = " OR ".join(f"topic = {_sql_string(t)} OR starts_with(topic, {_sql_string(t.rstrip('/') + '/')})"
                            for t in sorted(set(topics)))
        alive = "" if now is None else f"(expires_at IS NULL OR expires_at > to_timestamp_micros({int(now)})) AND "
        reader = (QueryBuilder().register("messages", self._table("messages")).register("deliveries", deliveries)
                  .register("trash", self._table("trash"))
                  .execute(f"""SELECT smuid, topic, priority, expires_at FROM messages WHERE {alive}({under})
  AND smuid {"IN" if held else "NOT IN"} (SELECT smuid FROM deliveries WHERE status = 'pending')
  AND smuid NOT IN (SELECT smuid FROM trash WHERE coalesce(account, '') = '')"""))
        return pa.table(reader)

    def removal_markers(self, deliveries: DeltaTable, topics: list[str], now: int | None,
                        batch_id: int) -> pa.Table:
        """``unrouted`` rows (account ``''``, status ``removed``, :data:`OUTPUTS` ``deliveries``
        columns) for the stored messages of the removed ``topics`` somebody still holds: once
        ACKs settle their last pending delivery they go to the Trash (:meth:`removed_settled`)."""
        schema = arrow_schema(OUTPUTS["deliveries"])
        held = self._removed_messages(deliveries, topics, now, held=True)
        if not held.num_rows:
            return schema.empty_table()
        rows = [{"account": "", "smuid": r["smuid"], "topic": r["topic"], "priority": r["priority"],
                 "status": "removed", "routed_batch_id": batch_id, "expires_at": r["expires_at"], "is_new": True}
                for r in held.to_pylist()]
        return pa.Table.from_pylist(rows, schema=schema)

    def removed_held(self) -> set[int]:
        """The messages of removed topics still held at their removal and not yet trashed (the
        ``removed`` rows of ``unrouted``): read once, then kept up to date by each commit, so that
        checking a batch's ACKs against them costs nothing."""
        if self._removed_held is None:
            reader = (QueryBuilder().register("unrouted", self._table("unrouted"))
                      .execute("SELECT smuid FROM unrouted WHERE status = 'removed'"))
            self._removed_held = set(pa.table(reader).column("smuid").to_pylist())
        return self._removed_held

    def removed_settled(self, deliveries: DeltaTable, records: pa.Table) -> list[int]:
        """The messages of removed topics (:meth:`removed_held`) whose last pending delivery this
        batch's ACKs settle: nothing holds them any more, so they go to the Trash (``topic_removed``)."""
        candidates = set(acked_smuids(records)) & self.removed_held()
        if not candidates:
            return []
        acked = set(_fields(_events(records, "ack"), lambda e: (str(e["account"]), int(e["smuid"]))))
        listed = ", ".join(str(int(smuid)) for smuid in sorted(candidates))
        pending = pa.table(QueryBuilder().register("deliveries", deliveries).execute(
            f"SELECT account, smuid FROM deliveries WHERE status = 'pending' AND smuid IN ({listed})"))
        remaining = {smuid for account, smuid in zip(pending.column("account").to_pylist(),
                                                     pending.column("smuid").to_pylist())
                     if (account, smuid) not in acked}
        return sorted(candidates - remaining)

    def _note_removed(self, out: dict[str, pa.Table]) -> None:
        """Keep :meth:`removed_held` up to date with a committed batch: its new ``removed`` rows
        in, whatever it trashed as a whole out."""
        if self._removed_held is None:
            return
        rows = out["deliveries"]
        marked = pc.and_(pc.equal(rows.column("account"), ""), pc.equal(rows.column("status"), "removed"))
        self._removed_held.update(rows.filter(marked).column("smuid").to_pylist())
        trash = out["trash"]
        whole = pc.equal(pc.fill_null(trash.column("account"), ""), "")
        self._removed_held.difference_update(trash.filter(whole).column("smuid").to_pylist())

    def _relation(self, spark: SparkSession, arrow: pa.Table, schema: StructType) -> DataFrame | str:
        """``arrow`` as a Spark frame, or, when it is empty, the SQL text of an empty relation
        (no py4j round trips for the common case: nothing expires)."""
        if not arrow.num_rows:
            return routing.empty_sql(schema)
        return spark.createDataFrame(arrow, schema=schema)

    # -- DELIVERY ONE's in-flight limit (:mod:`streaming.dispatch`)

    def limit_in_flight(self, out: dict[str, pa.Table], records: pa.Table, batch_id: int,
                        routed_at: datetime) -> None:
        """Hold each subscriber to its topics' ``max_in_flight`` unacknowledged DELIVERY ONE messages,
        rewriting ``out`` (:meth:`outputs`) in place.

        The routing query's ONE deliveries (``picked``) and the messages waiting from earlier
        batches (``unrouted`` rows with status ``waiting``) go to :func:`dispatch.assign`: a
        delivery moved to another subscriber changes account in ``deliveries`` and ``deliver``; one
        that must wait becomes a ``waiting`` row of account ``''`` and is not sent; a waiting
        message assigned now gets its delivery and Deliver, and its row becomes ``routed``.  A ONE
        message a SINCE clears away from its holder (stored, or withheld in this batch) is offered
        to the other subscribers the same way.  Nothing is read when the batch has no ONE delivery
        and nothing is known to wait.  A replayed batch
        whose deliveries were committed takes the holders from that commit, so it sends what the
        first attempt recorded.
        """
        deliveries = out["deliveries"]
        picked = _picked_one(deliveries)
        withheld = _withheld_one(deliveries)
        settled = _settlements(deliveries)
        cleared_keys = {key for key, status in settled.items() if status == "cleared"}
        if not picked.num_rows and not withheld and not cleared_keys and self._waiting is False:
            return
        table = self._table("deliveries")
        cleared = {**self._of_delivery_one(table, cleared_keys), **withheld}
        dying = _settled_nobody(deliveries)
        waiting = [smuid for smuid in self._waiting_smuids() if smuid not in dying and smuid not in cleared]
        picks = set(picked.column("smuid").to_pylist())
        if self._done("deliveries", batch_id):
            holders = self._recorded_holders(table, batch_id, picked, cleared)
            messages = self._messages(out, sorted(set(holders) - picks))
        else:
            messages = self._messages(out, waiting + sorted(cleared))  # what may be dispatched or wait
            holders = self._decide_holders(table, out, records, picked, messages, cleared, settled)
        chosen = {smuid for smuid, holder in holders.items() if holder is not None}
        self._waiting = len(holders) > len(chosen) or bool(set(waiting) - set(holders))
        dispatched = sorted(chosen - picks)
        unplaced = sorted(smuid for smuid in cleared if holders.get(smuid) is None)
        out["deliveries"], changed = _rehold(
            deliveries, picked, holders, {s: messages[s] for s in dispatched if s in messages},
            {s: messages[s] for s in unplaced if s in messages}, batch_id, routed_at)
        out["deliver"] = _redeliver(out["deliver"], holders, changed,
                                    [_deliver_record(messages[s], holders[s]) for s in dispatched if s in messages])

    def _messages(self, out: dict[str, pa.Table], smuids: list[int]) -> dict[int, dict]:
        """smuid → message row (``MESSAGES_TABLE`` columns) of ``smuids``: stored, or this batch's."""
        new = out["messages"]
        found = {row["smuid"]: row for row in new.filter(
            pc.is_in(new.column("smuid"), pa.array(sorted(set(smuids)), pa.int64()))).to_pylist()}
        stored = self.stored_messages(sorted(set(smuids) - set(found)))
        return {**{row["smuid"]: row for row in stored.to_pylist()}, **found}

    def _of_delivery_one(self, table: DeltaTable, keys: set[tuple[str, int]]) -> dict[int, str]:
        """smuid → account of those ``keys`` (deliveries a SINCE clears in this batch) that are
        DELIVERY ONE: such a message goes to another subscriber, it was meant for one of them."""
        if not keys:
            return {}
        listed = ", ".join(str(int(smuid)) for smuid in sorted({s for _, s in keys}))
        reader = QueryBuilder().register("deliveries", table).execute(
            f"SELECT account, smuid FROM deliveries WHERE delivery = 'one' AND smuid IN ({listed})")
        stored = pa.table(reader)
        ones = {(a, s) for a, s in zip(stored.column("account").to_pylist(), stored.column("smuid").to_pylist())}
        return {smuid: account for account, smuid in keys if (account, smuid) in ones}

    def _waiting_smuids(self) -> list[int]:
        """The messages waiting for a subscriber with room (``unrouted`` rows with status ``waiting``)."""
        if self._waiting is False:
            return []
        reader = QueryBuilder().register("unrouted", self._table("unrouted")).execute(
            "SELECT smuid FROM unrouted WHERE status = 'waiting'")
        return sorted(set(pa.table(reader).column("smuid").to_pylist()))

    def _recorded_holders(self, table: DeltaTable, batch_id: int, picked: pa.Table,
                          cleared: dict[int, str]) -> dict[int, str | None]:
        """A replay's holders: what this batch's committed deliveries say (a pick, or a message
        ``cleared`` away from its holder, without a row waited)."""
        reader = QueryBuilder().register("deliveries", table).execute(
            "SELECT account, smuid FROM deliveries WHERE delivery = 'one' AND status = 'pending' AND account <> '' "
            f"AND routed_batch_id = {int(batch_id)}")
        recorded = pa.table(reader)
        holders: dict[int, str | None] = {smuid: None for smuid in picked.column("smuid").to_pylist() + list(cleared)}
        holders.update(zip(recorded.column("smuid").to_pylist(), recorded.column("account").to_pylist()))
        return holders

    def _decide_holders(self, table: DeltaTable, out: dict[str, pa.Table], records: pa.Table, picked: pa.Table,
                        unpicked: dict[int, dict], cleared: dict[int, str],
                        settled: dict[tuple[str, int], str]) -> dict[int, str | None]:
        """:func:`dispatch.assign` over this batch's picks and the ``unpicked`` messages (smuid → its
        row): those waiting and those a SINCE ``cleared`` away from their holder (smuid → that
        account, which never gets it back); ``settled``: :func:`_settlements` of the batch."""
        offers = {smuid: dispatch.Offer(smuid, row["topic"], row["priority"] or 0, _micros(row["accepted_at"]),
                                        depth=row["depth"] or 0, hops=tuple(row["hops"] or ()))
                  for smuid, row in unpicked.items()}
        sent = _picked_messages(out["deliver"])
        for row in picked.to_pylist():
            message = sent.get(row["smuid"], {})
            offers[row["smuid"]] = dispatch.Offer(row["smuid"], row["topic"], row["priority"] or 0,
                                                  message.get("accepted_at", 0), picked=row["account"],
                                                  depth=message.get("depth", 0), hops=tuple(message.get("hops", ())))
        if not offers:
            return {}
        pending = pa.table(QueryBuilder().register("deliveries", table).execute(
            "SELECT account, smuid, topic FROM deliveries WHERE status = 'pending' AND delivery = 'one'"))
        in_flight = Counter((a, t) for a, s, t in zip(*(pending.column(c).to_pylist() for c in ("account", "smuid",
                                                                                                 "topic")))
                            if (a, s) not in settled)
        listed = ", ".join(str(int(smuid)) for smuid in sorted(offers))
        released = pa.table(QueryBuilder().register("deliveries", table).execute(
            f"SELECT account, smuid FROM deliveries WHERE status = 'released' AND smuid IN ({listed})"))
        handed_on = set(zip(released.column("account").to_pylist(), released.column("smuid").to_pylist()))
        handed_on |= {key for key, status in settled.items() if status == "released"}
        handed_on |= {(account, smuid) for smuid, account in cleared.items()}
        gone = frozenset(str(e.get("account")) for e in _events(records, "nack") if e.get("reason") == "disconnect")
        holdings = dispatch.Holdings(in_flight, frozenset(handed_on), gone)
        limit = self.topic_settings.resolve
        return dispatch.assign(offers.values(), self._subscribers(out["subscriptions"]), holdings,
                               lambda topic: limit(topic).max_in_flight, self.config.federation.peers)

    def _subscribers(self, changed: pa.Table) -> list[dispatch.Subscriber]:
        """The active subscriptions at the end of the batch: the stored ones, as this batch left them."""
        rows = {(r["account"], r["pattern"]): r for r in self.active_subscriptions().to_pylist()}
        rows.update({(r["account"], r["pattern"]): r for r in changed.to_pylist()})
        return [dispatch.Subscriber(r["account"], r["pattern"], _micros(r["since"]), _micros(r["until"]))
                for r in rows.values() if r["active"]]

    # -- the batch

    def outputs(self, batch_df: DataFrame, batch_id: int, routed_at: datetime,
                records: pa.Table | None = None) -> dict[str, pa.Table]:
        """Every output of one batch: a simple batch (:func:`simple_batch.is_simple`) routed on the
        driver (:func:`simple_batch.route`), any other by the routing transforms in **one** Spark job.

        Spark pays a fixed cost per job and per stage that dwarfs the work of a
        micro-batch, so the outputs are one query (:func:`batch_sql`, the
        transforms' SQL as CTEs, unioned with one struct column per output,
        tagged by ``kind``), collected once as Arrow and split here; shared
        sub-plans run once (exchange reuse).  Building it is a handful of py4j
        calls (two temporary views, one ``spark.sql``).
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
        late_stored, late_held = self.late_candidates(deliveries, [(a, p) for a, p, _ in subscribed], now)
        sinced = [a for a, _, since in subscribed if since]
        clearable = self.clearable(deliveries, sinced)
        expiry = may_expire(arrow_records, now, pending)
        late = late_stored.num_rows > 0 or publish_before_subscribe(arrow_records)
        # a publish of the batch may be owed its receipt now: 0/0 or X/Y when it is already expired, or
        # acknowledged in the same batch (a gateway routed it early)
        owed_now = (expiry[0] and asks_for_receipt(arrow_records)) or acks_its_own_receipt_publish(arrow_records)
        receipts = state.num_rows > 0 or bool(unreached) or owed_now
        one = has_delivery_one(arrow_records)
        # of the stored messages that reached nobody, only those that asked for a receipt may be owed one
        asking = set(stored.filter(pc.is_in(stored.column("receipt"), pa.array(["one", "all"]))).column("smuid")
                     .to_pylist())
        shape = simple_batch.Shape(nacks=bool(nacked), subscriptions=bool(subscribed) or _any_record(
            arrow_records, _of_type(Unsubscribe.TYPE)), removals=bool(removed) or orphaned.num_rows > 0,
            receipts=state.num_rows > 0 or bool(unreached & asking) or owed_now)
        # The records decoded once, here (every branch of the query would otherwise re-read the source).
        decoded = decode_records(arrow_records)
        started = time.monotonic()
        if self.config.streaming.simple_batches and simple_batch.is_simple(shape):
            rows = simple_batch.route(decoded, self.active_subscriptions(), pending, stored, batch_id, routed_at, now,
                                      new_may_expire=expiry[0], one=one, peers=self.config.federation.peers)
            out = {kind: pa.Table.from_pylist(rows[kind], schema=arrow_schema(OUTPUTS[kind])) for kind in rows}
            self.query_ms = {"plan": 0.0, "run": (time.monotonic() - started) * 1000}
        else:
            sql = batch_sql(batch_id, routed_at, now, expiry, bool(nacked), receipts, one, late,
                            clearable.num_rows > 0 or (bool(sinced) and late),  # SINCE may withhold this batch's too
                            orphaned.num_rows > 0, releases=retrying.num_rows > 0,
                            peers=self.config.federation.peers)
            # each kind of event a relation of its own (:func:`events_by_kind`)
            relations = {f"decoded_{kind}": (rows, routing.EVENTS) for kind, rows in events_by_kind(decoded).items()}
            relations.update(pending=(pending, routing.PENDING), retrying=(retrying, routing.RETRYING),
                             late_stored=(late_stored, _STORED), late_held=(late_held, routing.HELD),
                             clearable=(clearable, routing.CLEARABLE), orphaned=(orphaned, routing.ORPHANED),
                             receipt_state=(state, routing.RECEIPT_STATE), receipted=(receipted, _RECEIPTED),
                             stored=(stored, _STORED))
            out = self._routing_query(spark, sql, relations)
        out["progress"] = pa.Table.from_pylist(_progress(arrow_records), schema=arrow_schema(PROGRESS))
        out["expired"] = pa.concat_tables([out["expired"], _withheld_records(out["deliveries"])])
        if markers.num_rows:
            rows = out["deliveries"]
            taken = rows.filter(pc.equal(rows.column("account"), "")).column("smuid")  # one row per key
            markers = markers.filter(pc.invert(pc.is_in(markers.column("smuid"), taken)))
            out["deliveries"] = pa.concat_tables([rows, markers.cast(rows.schema)])
        return out

    def _routing_query(self, spark: SparkSession, sql: str,
                       relations: dict[str, tuple[pa.Table, StructType]]) -> dict[str, pa.Table]:
        """The outputs but ``progress`` of the routing query ``sql`` (:func:`batch_sql`) over ``relations``
        (name → rows and their type), run as one Spark job; ``query_ms`` says how long it took."""
        frames = {"current": self.current_subscriptions(spark)}
        for name, (arrow, schema) in relations.items():
            relation = self._relation(spark, arrow, schema)
            if isinstance(relation, str):
                sql = sql.replace("{" + name + "}", relation)
            else:
                frames[name] = relation
        started = time.monotonic()
        query = routing.run_sql(sql, frames)  # parsed and analysed here
        query._jdf.queryExecution().executedPlan()  # plan now, apart from running: the log tells them apart
        planned = time.monotonic()
        arrow = query.toArrow()
        self.query_ms = {"plan": (planned - started) * 1000, "run": (time.monotonic() - planned) * 1000}
        out = {}
        for kind in OUTPUTS:
            if kind == "progress":
                continue
            column = arrow.column(kind).filter(pc.equal(arrow.column("kind"), kind))  # that column only: cheaper
            out[kind] = pa.Table.from_batches(
                [pa.RecordBatch.from_struct_array(chunk) for chunk in column.chunks],
                schema=pa.schema(list(column.type)))
        return out

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        if self._done("subscriptions", batch_id):
            log.info("batch %d: already committed, skipped", batch_id)
            return
        records, floors = in_log_order(batch_df.toArrow(), self._log_floors)
        self.sweep_trash(batch_now(records))  # retention, here: the one thread that writes the trash table
        if _nothing_to_route(records) and not self.expiry_candidates(batch_now(records)).num_rows:
            # Nothing to route and nothing expires: no Spark job, no commit; just the progress.
            self._flush(self._progress({str(r["partition"]): r["end"] for r in _progress(records)}))
            self._log_floors = floors
            return
        routed_at = datetime.now(timezone.utc)
        out = self.outputs(batch_df, batch_id, routed_at, records)
        self.limit_in_flight(out, records, batch_id, routed_at)
        computed = time.monotonic()
        progress = out["progress"].to_pylist()
        if not progress:
            self._log_floors = floors
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
        futures += self._progress({str(r["partition"]): r["end"] for r in progress})
        self._flush(futures)
        self._log_floors = floors
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

    def _progress(self, offsets: dict[str, int]) -> list:
        producer = self.producer()
        value = json.dumps({"type": "progress", "commands_offsets": offsets}, separators=(",", ":")).encode()
        return [producer.send([(None, value, p) for p in producer.partitions])]

    def _flush(self, futures: list) -> None:
        failed = self.producer().wait(futures)
        if failed:
            raise RuntimeError(f"{len(failed)} record(s) to {self.config.kafka.deliveries_topic!r} "
                               f"not acknowledged: {failed[0]!r}")

    # -- Delta

    def commit_outputs(self, out: dict[str, pa.Table], batch_id: int) -> None:
        """Commit the Delta outputs of :meth:`outputs`, each table idempotently for ``batch_id``,
        ``subscriptions`` last (see the module docstring)."""
        self._commit_messages(out["messages"], batch_id)
        self._commit_trash(out["trash"], batch_id)  # before deliveries: a replay still sees what expired
        deliveries = out["deliveries"]
        nobody = pc.equal(deliveries.column("account"), "")
        self._commit_deliveries(deliveries.filter(pc.invert(nobody)), batch_id)
        # after deliveries: a replay that finds this batch's deliveries committed takes DELIVERY ONE's
        # holders from them (:meth:`limit_in_flight`) and still owes the waiting rows that go with them
        self._commit_deliveries(deliveries.filter(nobody), batch_id, "unrouted")
        self._commit_receipts(out["receipts"], batch_id)  # after deliveries: a replay makes the same receipts
        self._commit_subscriptions(out["subscriptions"], batch_id)
        self._note_removed(out)

    def _commit_messages(self, arrow: pa.Table, batch_id: int) -> None:
        rows = _to_table(arrow, "messages")
        if rows.num_rows and (table := self._uncommitted("messages", batch_id)) is not None:
            write_deltalake(table, rows, mode="append",
                            commit_properties=_commit(self.app_id("messages"), batch_id))

    def _commit_deliveries(self, arrow: pa.Table, batch_id: int, name: str = "deliveries") -> None:
        """Merge into ``deliveries`` (or ``unrouted``: the rows of account ``''``, same columns)."""
        if not arrow.num_rows or (table := self._uncommitted(name, batch_id)) is None:
            return
        source = _to_table(arrow, name).append_column("is_new", arrow.column("is_new"))
        smuids = source.column("smuid")
        low, high = pc.min(smuids).as_py(), pc.max(smuids).as_py()
        columns = DELIVERIES_TABLE.fieldNames()
        (
            table.merge(
                source,
                predicate=(f"t.account = s.account AND t.smuid = s.smuid "
                           f"AND t.smuid >= {int(low)} AND t.smuid <= {int(high)}"),
                source_alias="s", target_alias="t",
                commit_properties=_commit(self.app_id(name), batch_id),
            )
            .when_matched_update(
                updates={"status": "s.status", "acked_at": "s.acked_at", "acked_guid": "s.acked_guid"},
                predicate="s.status = 'acked' AND t.status NOT IN ('acked', 'expired', 'trashed', 'released')",
            )
            .when_matched_update(
                updates={"status": "s.status"},
                predicate="s.status = 'expired' AND t.status IN ('pending', 'unrouted', 'waiting')",
            )
            .when_matched_update(
                updates={"status": "s.status", "retries": "s.retries"},
                predicate="s.status = 'trashed' AND t.status = 'pending'",
            )
            .when_matched_update(
                updates={"retries": "s.retries"},
                predicate="s.status = 'retry' AND t.status = 'pending'",
            )
            .when_matched_update(  # handed on (DELIVERY ONE), or cleared by a new SINCE
                updates={"status": "s.status"},
                predicate="s.status IN ('released', 'cleared') AND t.status = 'pending'",
            )
            .when_matched_update(  # an ``unrouted`` row: a late subscriber took it, or its topic was removed;
                updates={"status": "s.status"},  # a ``waiting`` one: a subscriber had room for it
                predicate=("NOT s.is_new AND ((s.status IN ('routed', 'trashed') AND t.status IN ('unrouted', 'waiting')) "
                           "OR (s.status = 'trashed' AND t.status = 'removed'))"),
            )
            .when_matched_update(  # a DELIVERY ONE message handed on, and nobody has room for it now
                updates={"status": "s.status"},
                predicate="s.is_new AND s.status = 'waiting' AND t.status IN ('unrouted', 'routed')",
            )
            .when_matched_update(  # a message a late subscriber took from ``unrouted`` outlives its topic
                updates={"status": "s.status"},
                predicate="s.is_new AND s.status = 'removed' AND t.status = 'routed'",
            )
            .when_matched_update(  # a DELIVERY ONE message handed back to a subscriber that held it before
                updates={"status": "s.status", "routed_at": "s.routed_at", "routed_batch_id": "s.routed_batch_id",
                         "retries": "s.retries"},
                predicate="s.is_new AND s.status = 'pending' AND t.status = 'released'",
            )
            .when_not_matched_insert(updates={c: f"s.{c}" for c in columns}, predicate="s.is_new")
            .execute()
        )

    def _commit_trash(self, arrow: pa.Table, batch_id: int) -> None:
        """Insert the batch's Trash rows; a message already in the Trash (for the whole message,
        account '', or for one subscriber) is never added again."""
        rows = _to_table(arrow, "trash")
        if not rows.num_rows or (table := self._uncommitted("trash", batch_id)) is None:
            return
        smuids = rows.column("smuid")
        low, high = pc.min(smuids).as_py(), pc.max(smuids).as_py()
        (
            table.merge(
                rows, predicate=(f"t.smuid = s.smuid AND coalesce(t.account, '') = s.account "
                                 f"AND t.smuid >= {int(low)} AND t.smuid <= {int(high)}"),
                source_alias="s", target_alias="t",
                commit_properties=_commit(self.app_id("trash"), batch_id),
            )
            .when_not_matched_insert_all()
            .execute()
        )

    def _commit_receipts(self, arrow: pa.Table, batch_id: int) -> None:
        """Record the receipts sent: a message is answered once, ever."""
        rows = _to_table(arrow, "receipts")
        if not rows.num_rows or (table := self._uncommitted("receipts", batch_id)) is None:
            return
        (
            table.merge(rows, predicate="t.smuid = s.smuid", source_alias="s", target_alias="t",
                        commit_properties=_commit(self.app_id("receipts"), batch_id))
            .when_not_matched_insert_all()
            .execute()
        )

    def _commit_subscriptions(self, arrow: pa.Table, batch_id: int) -> None:
        rows = _to_table(arrow, "subscriptions")
        if not rows.num_rows:
            return
        (
            self._table("subscriptions").merge(
                rows, predicate="t.account = s.account AND t.pattern = s.pattern",
                source_alias="s", target_alias="t",
                commit_properties=_commit(self.app_id("subscriptions"), batch_id),
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
