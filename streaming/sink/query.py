"""The batch's routing query: every transform of :mod:`streaming.routing` as one ``WITH … SELECT``,
each output a struct column of its :data:`OUTPUTS` type, and what the batch cannot need left out;
run in three parts (:func:`stages`), its most-read CTEs first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Mapping

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from schemas.spark import DELIVERIES_TABLE, MESSAGES_TABLE, RECEIPTS_TABLE, SUBSCRIPTIONS_TABLE, TRASH_TABLE
from streaming.routing.clearing import cleared_sql, withheld_sql
from streaming.routing.commands import extract_acks_sql, message_rows_sql, settled_sql, valid_events_sql
from streaming.routing.delivery_updates import delivery_updates_sql
from streaming.routing.expiry import dead_messages_sql, expiring_sql, live_sql, trash_sql
from streaming.routing.federation import NO_PEERS
from streaming.routing.frames import (
    CLEARED,
    DELIVERIES,
    EXPIRING,
    KAFKA_OUT,
    NOBODY_UPDATES,
    PENDING,
    RECEIPTS_DUE,
    RECEIPT_MESSAGES,
    RELEASED,
    RETRIED,
    RETRYING,
)
from streaming.routing.late import late_sql
from streaming.routing.receipts import (
    receipt_message_rows_sql,
    receipt_messages_sql,
    receipt_rows_sql,
    receipts_due_sql,
)
from streaming.routing.records import acked_records_sql, deliver_records_sql, expired_records_sql, unacknowledged_sql
from streaming.routing.retries import reassigned_sql, released_sql, retried_sql
from streaming.routing.route import route_all_sql, unrouted_of_sql
from streaming.routing.sql import empty_sql
from streaming.routing.subscriptions import subscription_intervals_sql, subscription_state_sql
from streaming.sink.decoding import EVENT_KINDS


#: Per commands partition: the next offset to consume and how many records this batch held.
PROGRESS = StructType([
    StructField("partition", IntegerType(), True),
    StructField("end", LongType(), True),
    StructField("records", LongType(), True),
])


#: Every output of one batch and its columns, in the order of :func:`batch_sql`'s columns.
OUTPUTS: dict[str, StructType] = {
    "progress": PROGRESS,
    "deliver": KAFKA_OUT,
    "acked": KAFKA_OUT,
    "expired": KAFKA_OUT,
    "messages": MESSAGES_TABLE,
    "trash": TRASH_TABLE,
    "deliveries": StructType(list(DELIVERIES_TABLE.fields) + [StructField("is_new", BooleanType(), True)]),
    "subscriptions": SUBSCRIPTIONS_TABLE,
    "receipts": RECEIPTS_TABLE,
}

_UNROUTED = StructType([StructField("smuid", LongType()), StructField("topic", StringType()),
                        StructField("priority", IntegerType()), StructField("expires_at", LongType())])

#: The columns of the stored messages the Trash, the receipts and DELIVERY ONE reassignments need.
STORED_COLUMNS = ["smuid", "topic", "cmuid", "publisher", "publisher_guid", "priority", "headers", "sections",
                   "accepted_at", "batch_id", "expires_at", "receipt", "delivery", "depth", "hops", "origin",
                   "origin_topic"]

#: :data:`STORED_COLUMNS` as a schema.
STORED = StructType([MESSAGES_TABLE[name] for name in STORED_COLUMNS])

#: The smuids already answered with a receipt (``receipts`` rows).
RECEIPTED = StructType([StructField("smuid", LongType())])


def _empty(schema: StructType) -> str:
    """SQL: a relation with ``schema``'s columns and no rows, as a CTE body (Spark folds it away)."""
    return empty_sql(schema)[1:-1]


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
              peers: Mapping[str, str] = NO_PEERS) -> tuple[str, ...]:
    """The whole batch but its progress as a few queries (:func:`stages`: the :data:`SHARED` parts first)
    over the relations ``{decoded_publish}``,
    ``{decoded_subscription}``, ``{decoded_ack}`` and ``{decoded_nack}`` (the batch's records,
    :func:`decode_records`, by kind: :func:`events_by_kind`), ``{current}``, ``{pending}``
    (stored deliveries that may expire, :data:`streaming.routing.PENDING`), ``{retrying}`` (the stored
    deliveries the batch's NACKs name, :data:`streaming.routing.RETRYING`) and ``{stored}`` (the stored
    messages of both, ``MESSAGES_TABLE`` columns :data:`STORED_COLUMNS`), ``{receipt_state}`` (the
    stored deliveries of messages acknowledged or expiring in this batch that asked for a receipt,
    :data:`streaming.routing.RECEIPT_STATE`) and ``{receipted}`` (which of those were answered already).

    Each routing transform is a CTE of its own SQL (``streaming.routing.*.*_sql``, the text
    the public transforms run); every output is a struct column of its
    :data:`OUTPUTS` type, null except in the rows of its ``kind``.  ``now`` is
    the batch's clock (:func:`batch_now`).  ``expiry`` says whether a delivery
    routed in this batch, and whether a stored one, can expire (:func:`may_expire`);
    what cannot is left out of the plan (the whole of expiry would cost every
    micro-batch about twice as many shuffles); so is the retry count when the batch holds
    no NACK (``retries``), handing DELIVERY ONE messages on when no NACK names a stored
    delivery (``releases``), receipts when no message concerned asked for one (``receipts``),
    and picking one subscriber when no publish is DELIVERY ONE (``one``).  ``late``: the batch
    holds a SUBSCRIBE, so earlier messages may reach it (:func:`streaming.routing.late`, over the relations
    ``{late_stored}`` and ``{late_held}``, :meth:`CommandSink.late_candidates`; only when there are
    stored candidates or a publish of the batch may precede the SUBSCRIBE); ``clearing``: one
    of them has SINCE, which clears what is pending before it (:func:`streaming.routing.cleared`, over the
    relation ``{clearable}``, :meth:`CommandSink.clearable`), and what the batch routed to that
    subscriber before it (:func:`streaming.routing.withheld`); ``removing``: a REMOVE TOPIC left
    messages nobody holds (``{orphaned}``, :meth:`CommandSink.orphaned` and
    :func:`published_before_removal`; those the batch routes to somebody stay).  A smaller plan is
    what matters: analysing and optimising the query is most of a micro-batch.  ``peers``: the
    ``[federation] peers``, which get a message only as its Depth and Hops allow
    (:func:`streaming.routing.federation.may_receive_sql`).
    """
    new, stored = expiry
    source = ", ".join(STORED_COLUMNS)
    routed = "SELECT * FROM routed_all WHERE account <> ''" + (" UNION ALL SELECT * FROM late" if late else "")
    ctes = {
        **{f"events_{kind}": valid_events_sql(f"{{decoded_{kind}}}") for kind in EVENT_KINDS},
        "intervals": subscription_intervals_sql("{current}", "events_subscription"),
        "routed_all": route_all_sql("events_publish", "intervals", one, peers),
        "late": (late_sql("events_publish", "intervals", "{late_stored}", "{late_held}", "routed_all", now,
                                  peers) if late else _empty(DELIVERIES)),
        "routed": (withheld_sql("events_subscription", f"({routed})", cleared=False) if clearing else routed),
        "withheld": (withheld_sql("events_subscription", f"({routed})") if clearing
                     else _empty(DELIVERIES)),
        "acks": extract_acks_sql("events_ack"),
        "unrouted": (f"SELECT * FROM ({unrouted_of_sql('routed_all')}) "
                     "WHERE smuid NOT IN (SELECT smuid FROM late)" if late else unrouted_of_sql("routed_all")),
        "expiring": (expiring_sql("routed" if new else empty_sql(DELIVERIES),
                                          "unrouted" if new else empty_sql(_UNROUTED), "acks",
                                          "{pending}" if stored else empty_sql(PENDING), now)
                     if new or stored else empty_sql(EXPIRING)[1:-1]),
        # the stored deliveries the NACKs name, and this batch's DELIVERY ALL ones: a gateway routing early
        # may have notified one and seen its retry timeout pass before the job routed it (a replayed
        # publish's delivery is stored already: its stored row, with the retries so far, counts)
        "retrying": ("SELECT * FROM {retrying} UNION ALL SELECT account, smuid, 'pending' AS status, "
                     "CAST(NULL AS INT) AS retries, delivery FROM routed n WHERE delivery = 'all' AND NOT EXISTS "
                     "(SELECT 1 FROM {retrying} s WHERE s.account = n.account AND s.smuid = n.smuid)") if retries
                    else _empty(RETRYING),
        "new_messages": message_rows_sql("events_publish", batch_id),
        "all_messages": f"SELECT {source} FROM new_messages UNION ALL SELECT {source} FROM {{stored}}",
        "released": (released_sql("events_nack", "{retrying}", "acks", "expiring", "intervals", "all_messages",
                                          peers) if releases else _empty(RELEASED)),
        "reassigned": reassigned_sql("released", "all_messages") if releases else _empty(DELIVERIES),
        "retried": (retried_sql("events_nack", "retrying", "acks", "expiring", "released") if retries
                    else _empty(RETRIED)),
        "cleared": (cleared_sql("intervals", "{clearable}", "acks", "expiring", "retried", "released")
                    if clearing else _empty(CLEARED)),
        "dead": dead_messages_sql("expiring", "retried", "{orphaned}" if removing else None,
                                          "routed" if removing else None),
        "nobody": ("SELECT DISTINCT smuid, 'routed' AS status FROM late" if late
                   else _empty(NOBODY_UPDATES))
                  + (" UNION ALL SELECT smuid, 'trashed' AS status FROM dead WHERE reason = 'topic_removed'"
                     if removing else ""),
        "live": live_sql("routed", "expiring") if new else "SELECT * FROM routed",
        "settled": settled_sql("acks", "live"),
        "out_acked": acked_records_sql("settled"),
        "out_expired": expired_records_sql("expiring", "retried", "released", "cleared"),
        # this batch's deliveries as first routed (``routed``, with late subscribers' and SINCE's withholding,
        # trips Catalyst here: "key not found: smuid"): a withheld one counts as a cleared stored one does
        "receipts_due": (receipts_due_sql("{receipt_state}", "acks", "expiring", "{receipted}", "all_messages",
                                                  "routed_all")
                         if receipts
                         else _empty(RECEIPTS_DUE)),
        "receipt_messages": (receipt_messages_sql("receipts_due", "all_messages", now) if receipts
                             else _empty(RECEIPT_MESSAGES)),
        "receipt_deliveries": f"SELECT {', '.join(DELIVERIES.fieldNames())} FROM receipt_messages",
        "new_deliveries": ("SELECT * FROM routed UNION ALL SELECT * FROM receipt_deliveries "
                           "UNION ALL SELECT * FROM reassigned"),
        "out_deliver": deliver_records_sql(f"({unacknowledged_sql('live', 'acks')} UNION ALL SELECT * "
                                                   "FROM receipt_deliveries UNION ALL SELECT * FROM reassigned)"),
        "out_messages": ("SELECT * FROM new_messages UNION ALL "
                         + receipt_message_rows_sql("receipt_messages", batch_id)),
        "out_receipts": receipt_rows_sql("receipt_messages", batch_id),
        "out_trash": trash_sql("dead", "all_messages", now, batch_id),
        "out_deliveries": delivery_updates_sql("new_deliveries", "acks", batch_id, routed_at, now,
                                                       # a publish of the batch trashed at once keeps no row
                                                       "(SELECT * FROM unrouted WHERE smuid NOT IN (SELECT smuid "
                                                       "FROM dead WHERE reason = 'topic_removed'))" if removing
                                                       else "unrouted", "expiring", "retried", "released", "nobody",
                                                       "cleared", "withheld" if clearing else None),
        "out_subscriptions": subscription_state_sql("intervals", batch_id),
    }
    parts = [
        f"SELECT '{kind}' AS kind, "
        + ", ".join(f"{_as_struct(OUTPUTS[other])} AS {other}" if other == kind else f"NULL AS {other}"
                    for other in OUTPUTS)
        + f" FROM out_{kind}"
        for kind in OUTPUTS if kind != "progress"  # counted from the records themselves: :func:`progress_rows`
    ]
    return stages(ctes, "\nUNION ALL\n".join(parts))


#: The CTEs the rest of the routing query reads many times over, directly and through one another,
#: in the groups they are computed in.  Spark's analysis check inlines every CTE at every reference
#: (``CheckAnalysis`` runs ``InlineCTE`` with ``alwaysInline``), whatever the optimiser would do after,
#: so in one query these were copied ~1,700 times: a batch with late subscribers and a receipt due
#: took 15 s to analyse, 21 s to optimise, and ran the job's 512 MiB heap out
#: (``bench-results/routing-query-oom-2026-11-29``).  Each group is computed by a query of its own and
#: read back by the later ones as one checkpointed relation.
SHARED = (("intervals", "routed_all", "late"), ("routed", "withheld", "acks", "unrouted", "expiring"))


def _with(ctes: Mapping[str, str], select: str) -> str:
    return "WITH " + ",\n".join(f"{name} AS (\n{sql}\n)" for name, sql in ctes.items()) + "\n" + select


def _tagged(group: tuple[str, ...]) -> str:
    """SQL: the rows of every CTE of ``group``, each as one struct column, tagged by ``kind``."""
    return "\nUNION ALL\n".join(
        f"SELECT '{name}' AS kind, "
        + ", ".join(f"struct(*) AS {name}" if other == name else f"NULL AS {other}" for other in group)
        + f" FROM {name}" for name in group)


def stages(ctes: Mapping[str, str], select: str) -> tuple[str, ...]:
    """``WITH ctes select`` as one query per group of :data:`SHARED` and one for the rest.  The query
    of group ``i`` reads the CTEs of the groups before it from the relation ``{shared_<j>}`` (the
    result of group ``j``'s query); so does the last query.  The batch's events are cheap to read
    again, so every query defines them."""
    names = list(ctes)
    done: dict[str, str] = {name: ctes[name] for name in names if name.startswith("events_")}
    queries = []
    for index, group in enumerate(SHARED):
        cut = max(names.index(name) for name in group) + 1
        own = {name: ctes[name] for name in names[:cut] if name not in done}
        assert set(own) == set(group), f"{sorted(set(own) - set(group))} come before {names[cut - 1]}"
        queries.append(_with({**done, **own}, _tagged(group)))
        done.update({name: f"SELECT {name}.* FROM {{shared_{index}}} WHERE kind = '{name}'" for name in group})
    return (*queries, _with({**done, **{name: ctes[name] for name in names if name not in done}}, select))
