"""All routing logic, as pure ``DataFrame -> DataFrame`` transforms.

Nothing here reads a source, writes a sink or touches the session: every
function takes frames (and plain values) and returns a frame, so the tests run
them unchanged on literal rows.  The sink (:mod:`streaming.sink`) wires them
together once per micro-batch::

    records ──parse_commands──▶ events ──┬─ subscription_intervals(current subscriptions)
                                         │        │
                                         ├────────┴─ route ──▶ deliveries ──unacknowledged──▶ deliver_records
                                         ├─ extract_acks ──▶ acks ──▶ acked_records
                                         └─ message_rows ──▶ messages
    intervals ──subscription_state──▶ subscriptions (merge)
    deliveries + acks ──delivery_updates──▶ deliveries (merge)

Ordering: every command carries ``seq = struct(timestamp, partition, offset)``
of its Kafka record.  With one commands partition (the default) that is the
log order; across partitions it falls back to Kafka timestamp order.  A
publish is routed to a subscription iff ``from_seq < seq < to_seq`` where a
null bound is open (``from_seq`` null: subscribed before this batch;
``to_seq`` null: still subscribed at the end of the batch), and its
``accepted_at`` lies in the interval's SINCE/UNTIL window.  A publish to an
account topic ``/accounts/<name>`` also reaches ``<name>``, subscribed or not.

Every transform is written once, as Spark SQL text: ``<name>_sql(...)``
returns the ``SELECT`` of that transform over the relations (view or CTE
names) it is given.  The public function registers its input frames as
temporary views and runs that text; the sink composes the same texts into one
``WITH … SELECT`` per micro-batch.  A plan built from SQL text costs a few
py4j calls, where the same plan built column by column costs thousands
(~110 µs each), which dominated a micro-batch.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from types import MappingProxyType
from typing import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
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

from schemas.smuid import EPOCH_MS, JOB_NODE_ID, MAX_SEQUENCE, NODE_BITS, SEQUENCE_BITS
from schemas.spark import COMMAND_EVENT, HEADERS, MESSAGES_TABLE, SECTION_JSON

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

_SEQ_DDL = SEQ.simpleString()


def sql_literal(value: int | datetime) -> str:
    """``value`` as a typed Spark SQL literal: ``BIGINT`` for ints, ``TIMESTAMP`` for datetimes.

    A datetime converts as ``F.lit`` would (aware: its instant; naive: local time).
    """
    if isinstance(value, datetime):
        return f"timestamp_micros({int(TimestampType().toInternal(value))})"
    return f"CAST({int(value)} AS BIGINT)"


def run_sql(sql: str, frames: dict[str, DataFrame]) -> DataFrame:
    """``sql`` with each ``{name}`` replaced by a temporary view of ``frames[name]``.

    The views get unique names and are dropped again once the query is
    analysed (the returned frame holds their plans, not their names).
    """
    spark = next(iter(frames.values())).sparkSession
    views = {name: f"_routing_{name}_{uuid.uuid4().hex}" for name in frames}
    for name, frame in frames.items():
        frame.createOrReplaceTempView(views[name])
    try:
        return spark.sql(sql.format(**views))
    finally:
        for view in views.values():
            spark.catalog.dropTempView(view)


def _micros_to_ts(column: str) -> str:
    return f"timestamp_micros({column})"


def _first_per(keys: str, order: str, relation: str, where: str = "TRUE") -> str:
    """Rows of ``relation`` matching ``where``, only the first per ``keys`` by ``order`` (``_n`` = 1)."""
    return (f"(SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY {order}) AS _n "
            f"FROM {relation} WHERE {where}) WHERE _n = 1)")


# -- parse_commands

_VALID = """coalesce(
      (type = 'publish' AND account IS NOT NULL AND smuid IS NOT NULL AND topic IS NOT NULL)
      OR (type IN ('subscribe', 'unsubscribe') AND account IS NOT NULL AND pattern IS NOT NULL)
      OR (type IN ('ack', 'nack') AND account IS NOT NULL AND smuid IS NOT NULL),
      FALSE)"""


def decoded_records_sql(records: str) -> str:
    """SQL: every Kafka record of ``records`` as :data:`EVENTS` columns, all null where its value is not
    a JSON object (the job's sink decodes them in Python instead: ``streaming.sink.decode_records``)."""
    return f"""SELECT e.*, seq, kafka_partition, kafka_offset FROM (
    SELECT from_json(CAST(value AS STRING), '{COMMAND_EVENT.simpleString()}') AS e,
           named_struct('timestamp', `timestamp`, 'partition', `partition`, 'offset', `offset`) AS seq,
           `partition` AS kafka_partition, `offset` AS kafka_offset
    FROM {records})"""


def valid_events_sql(decoded: str) -> str:
    """SQL: the rows of ``decoded`` (:data:`EVENTS`) that are commands: a known ``type`` with the fields it needs."""
    return f"SELECT * FROM {decoded} WHERE {_VALID}"


def parse_commands_sql(records: str) -> str:
    """SQL of :func:`parse_commands` over the relation ``records``."""
    return valid_events_sql(f"({decoded_records_sql(records)})")


def parse_commands(records: DataFrame) -> DataFrame:
    """Kafka records (``KAFKA_RECORD`` columns) → command events (:data:`EVENTS`).

    ``value`` is parsed with ``from_json`` against ``COMMAND_EVENT``.  Records
    that are not JSON, have an unknown ``type`` or lack the fields their type
    needs are dropped here (they must never stop the job); the sink still counts
    their offsets as consumed.
    """
    return run_sql(parse_commands_sql("{records}"), {"records": records})


# -- subscription_intervals


def _covers(unsubscribed: str, pattern: str) -> str:
    """SQL: true when UNSUBSCRIBE ``unsubscribed`` ends subscription ``pattern``.

    Equal patterns, or ``unsubscribed`` is a wildcard ``/a/*`` whose prefix
    ``/a/`` starts ``pattern`` (``/a/x``, ``/a/x/*``, ``/a/*`` …).
    """
    return (f"({unsubscribed} = {pattern} OR (endswith({unsubscribed}, '/*') "
            f"AND startswith({pattern}, substr({unsubscribed}, 1, length({unsubscribed}) - 1))))")


def _opens_sql(current: str, events: str) -> str:
    """SQL: where intervals start: the active subscriptions before the batch, then each SUBSCRIBE."""
    return f"""SELECT account, pattern, guid, subscribed_at, CAST(NULL AS {_SEQ_DDL}) AS from_seq, since, until
FROM {current} WHERE active
UNION ALL
SELECT account, pattern, guid, {_micros_to_ts("accepted_at")} AS subscribed_at, seq AS from_seq,
       {_micros_to_ts("since")} AS since, {_micros_to_ts("until")} AS until
FROM {events} WHERE type = 'subscribe'"""


def _closes_sql(events: str) -> str:
    """SQL: where intervals end: each UNSUBSCRIBE, and each SUBSCRIBE (it redefines SINCE/UNTIL).

    ``c_at`` is the UNSUBSCRIBE's time; null for a SUBSCRIBE, which ends an
    interval without unsubscribing anyone.
    """
    return f"""SELECT account AS c_account, pattern AS c_pattern, type = 'unsubscribe' AS c_unsub, seq AS c_seq,
       CASE WHEN type = 'unsubscribe' THEN {_micros_to_ts("accepted_at")} END AS c_at
FROM {events} WHERE type IN ('subscribe', 'unsubscribe')"""


def _ended_sql(current: str, events: str) -> str:
    """SQL: each open with its end, the first later close of the same account that ends it.

    An UNSUBSCRIBE ends the patterns it covers (:func:`_covers`); a SUBSCRIBE
    only its own pattern.  ``_redefines``: the open is a SUBSCRIBE that ended
    the previous interval of its (account, pattern), i.e. a re-subscribe while
    subscribed.
    """
    return f"""SELECT *, coalesce(lag(to_seq) OVER (PARTITION BY account, pattern ORDER BY from_seq ASC NULLS FIRST)
                   = from_seq, FALSE) AS _redefines
FROM (
  SELECT o.account, o.pattern, o.guid, o.subscribed_at, o.from_seq, o.since, o.until,
         min(c.c_seq) AS to_seq, min_by(c.c_at, c.c_seq) AS unsubscribed_at
  FROM ({_opens_sql(current, events)}) o
  LEFT JOIN ({_closes_sql(events)}) c
  ON o.account = c.c_account AND (c.c_pattern = o.pattern OR (c.c_unsub AND {_covers("c.c_pattern", "o.pattern")}))
     AND (o.from_seq IS NULL OR c.c_seq > o.from_seq)
  GROUP BY o.account, o.pattern, o.guid, o.subscribed_at, o.from_seq, o.since, o.until)"""


def subscription_intervals_sql(current: str, events: str) -> str:
    """SQL of :func:`subscription_intervals` over the relations ``current`` and ``events``.

    ``_start`` is the open that began the subscription: the last one up to this
    open that is not a re-subscribe, whose guid and time every re-subscribe keeps.
    """
    started = ("last_value(CASE WHEN NOT _redefines THEN named_struct('guid', guid, 'at', subscribed_at) END, TRUE) "
               "OVER (PARTITION BY account, pattern ORDER BY from_seq ASC NULLS FIRST)")
    return f"""SELECT account, pattern, _start.guid AS guid, _start.at AS subscribed_at, from_seq, to_seq, unsubscribed_at,
       since, until
FROM (SELECT *, {started} AS _start FROM ({_ended_sql(current, events)}))"""


def subscription_intervals(current: DataFrame, events: DataFrame) -> DataFrame:
    """Current subscriptions + this batch's (un)subscribes → :data:`INTERVALS`.

    ``current`` has the ``SUBSCRIPTIONS_TABLE`` columns; only ``active`` rows
    count, and they open at ``from_seq = null`` (before this batch) with their
    stored SINCE/UNTIL.  Each SUBSCRIBE opens an interval at its ``seq`` with
    its own SINCE/UNTIL.  An interval ends at the first later UNSUBSCRIBE of the
    same account whose pattern covers it (see :func:`_covers`, which sets
    ``unsubscribed_at``) or the next SUBSCRIBE of the same pattern; ``to_seq``
    stays null when none does.

    A SUBSCRIBE while already subscribed to the same pattern redefines SINCE and
    UNTIL (spec 4.1.9.1) for publishes after it, so it ends the previous
    interval and opens its own; it is the same subscription, though, so it
    keeps the guid and ``subscribed_at`` of the SUBSCRIBE that started it.  A
    SUBSCRIBE after an UNSUBSCRIBE starts a new subscription.
    """
    return run_sql(subscription_intervals_sql("{current}", "{events}"),
                   {"current": current, "events": events})


# -- route


def candidate_patterns_sql(topic: str) -> str:
    """SQL: every subscription pattern that matches the canonical topic (SQL expression ``topic``).

    ``/a/b/c`` → ``["/a/b/c", "/a/*", "/a/b/*"]``: the topic itself and the
    wildcard of each proper ancestor.  Matching then is an equi-join on the
    pattern, the same relation as ``schemas.topics.TopicPattern.matches`` (a
    wildcard ``/a/b/*`` covers topics starting with ``/a/b/``, so ``/a/*``
    never matches ``/ab/x`` and ``/a/b/*`` does not match ``/a/b`` itself).
    """
    levels = f"split(substr({topic}, 2, length({topic})), '/')"
    ancestors = (f"transform(sequence(1, size({levels}) - 1), "
                 f"_i -> concat('/', array_join(slice({levels}, 1, _i), '/'), '/*'))")
    return f"CASE WHEN size({levels}) > 1 THEN concat(array({topic}), {ancestors}) ELSE array({topic}) END"


def candidate_patterns(topic: str) -> Column:
    """:func:`candidate_patterns_sql` as a Column; ``topic`` is a column name or SQL expression."""
    return F.expr(candidate_patterns_sql(topic))


def account_topic_owner_sql(topic: str) -> str:
    """SQL: the account owning ``topic`` (SQL expression) when it is ``/accounts/<name>``, else ``''``.

    The owner is ``<name>`` in lower case, the account name deliveries are keyed
    by (``schemas.topics.account_topic``); descendants of an account topic are
    nobody's.
    """
    return f"regexp_extract(lower({topic}), '^/accounts/([^/]+)$', 1)"


def pick_order_sql(smuid: str, account: str) -> str:
    """SQL: the order a DELIVERY ONE message's candidate subscribers are picked in (the first gets it):
    by the CRC-32 of ``"<smuid>/<account>"``, then by account.  Deterministic, so a replayed batch
    picks as the first attempt did, and spread evenly over the candidates; a CRC rather than
    ``xxhash64`` because the driver's routing of simple batches picks the same way with
    ``zlib.crc32`` (``streaming.simple_batch.pick_order``)."""
    return f"crc32(CAST(concat(CAST({smuid} AS STRING), '/', {account}) AS BINARY)), {account}"


#: No ``[federation] peers``: every subscriber may get every message.
NO_PEERS: Mapping[str, str] = MappingProxyType({})

_NO_HOPS = f"CAST(array() AS {ArrayType(StringType()).simpleString()})"

#: SQL: a message's federation fields (``schemas.spark.FEDERATION``) of relation ``{r}``, a null depth
#: (a record older than federation) read as 0 and null hops as none.
_FEDERATION = ("coalesce({r}depth, 0) AS depth, coalesce({r}hops, " + _NO_HOPS + ") AS hops, "
               "{r}origin AS origin, {r}origin_topic AS origin_topic")


def federation_sql(relation: str = "") -> str:
    """SQL: the message's federation columns of ``relation`` (a name, or ``""``: unqualified)."""
    return _FEDERATION.format(r=f"{relation}." if relation else "")


def _string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def forwards_sql(peer_domain: str, depth: str, hops: str) -> str:
    """SQL of :func:`schemas.topics.forwards`: whether a message of ``depth`` and ``hops`` (SQL
    expressions; null read as 0 and none) may go on to the farm ``peer_domain``."""
    passed = f"transform(coalesce({hops}, {_NO_HOPS}), _hop -> lower(_hop))"
    return f"(coalesce({depth}, 0) <> 0 AND NOT array_contains({passed}, {_string(peer_domain.lower())}))"


def may_receive_sql(account: str, depth: str, hops: str, peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL: whether subscriber ``account`` (SQL expression) may get a message of ``depth`` and ``hops``:
    an account of ``[federation] peers`` (another farm's link) only when :func:`forwards_sql` allows, any
    other always.  The peers rule of :func:`schemas.topics.recipients`, which the gateways and the
    driver's simple batches apply; each peer a ``WHEN`` of one ``CASE``, built from the configuration,
    and ``TRUE`` with no peers (nothing added to the plan)."""
    if not peers:
        return "TRUE"
    cases = " ".join(f"WHEN {_string(peer)} THEN {forwards_sql(domain, depth, hops)}"
                     for peer, domain in sorted(peers.items()))
    return f"coalesce(CASE {account} {cases} ELSE TRUE END, FALSE)"


def _and_may_receive(account: str, depth: str, hops: str, peers: Mapping[str, str]) -> str:
    """`` AND`` :func:`may_receive_sql` for a join's condition, or nothing with no peers: a constant
    ``AND TRUE`` there trips Catalyst in :func:`late_sql` ("key not found: smuid")."""
    return f" AND {may_receive_sql(account, depth, hops, peers)}" if peers else ""


def route_all_sql(events: str, intervals: str, one: bool = True, peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL: :func:`route`'s rows, plus one row of account ``''`` for each publish that reached nobody
    and can expire (``expires_at`` not null): :func:`unrouted` from the same pass.

    Account-topic owners come out of the same join: each publish's row for its
    own topic (one per publish among its candidate patterns) also names the
    owner, and the join is LEFT so that row survives with no subscriber.  A
    second pass over the publishes instead cost ~20 % of a micro-batch.
    ``_reached`` (a window per smuid) tells the publishes that reached nobody;
    the per-(account, smuid) window after it needs no shuffle of its own.  A subscriber of ``peers``
    (another farm's link) is reached only as :func:`may_receive_sql` allows, in the join itself, so a
    DELIVERY ONE message is never picked for it when it may not get it.
    """
    publishes = _first_per("smuid", "seq", events, "type = 'publish'")
    pick_one = (f"row_number() OVER (PARTITION BY smuid ORDER BY {pick_order_sql('smuid', 'account')})" if one
                else "1")  # ``one`` False: no DELIVERY ONE publish in the batch, no window needed
    return f"""SELECT {", ".join(DELIVERIES.fieldNames())} FROM (
  SELECT *, {pick_one} AS _one FROM (
  SELECT *, row_number() OVER (PARTITION BY account, smuid ORDER BY seq) AS _d FROM (
    SELECT CASE WHEN _reached THEN _to ELSE '' END AS account, smuid, topic, cmuid, publisher, publisher_guid,
           accepted_at, priority, headers, sections, seq, expires_at, receipt, delivery, depth, hops, origin,
           origin_topic
    FROM (
      SELECT *, bool_or(coalesce(_to <> '', FALSE)) OVER (PARTITION BY smuid) AS _reached FROM (
        SELECT p.*, explode(array(s.account, CASE WHEN p._pattern = p.topic
                                                   {_and_may_receive("p._owner", "p.depth", "p.hops", peers)}
                                              THEN p._owner END)) AS _to
        FROM (
          SELECT smuid, topic, cmuid, account AS publisher, guid AS publisher_guid, accepted_at, priority, headers,
                 sections, seq, expires_at, lower(coalesce(receipt, 'none')) AS receipt,
                 lower(coalesce(delivery, 'all')) AS delivery, {federation_sql()},
                 {_micros_to_ts("accepted_at")} AS _at,
                 {account_topic_owner_sql("topic")} AS _owner, explode({candidate_patterns_sql("topic")}) AS _pattern
          FROM {publishes}
        ) p
        LEFT JOIN (SELECT account, pattern AS _pattern, from_seq, to_seq, since, until FROM {intervals}) s
        ON p._pattern = s._pattern
           AND (s.from_seq IS NULL OR s.from_seq < p.seq) AND (s.to_seq IS NULL OR p.seq < s.to_seq)
           AND (s.since IS NULL OR s.since <= p._at) AND (s.until IS NULL OR p._at < s.until)
           {_and_may_receive("s.account", "p.depth", "p.hops", peers)}))
    WHERE coalesce(_to <> '', FALSE) OR (NOT _reached AND expires_at IS NOT NULL)))
  WHERE _d = 1)
WHERE delivery <> 'one' OR _one = 1"""


def route_sql(events: str, intervals: str, peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL of :func:`route` over the relations ``events`` and ``intervals`` (:func:`route_all_sql`'s
    rows that name a subscriber)."""
    return f"SELECT * FROM ({route_all_sql(events, intervals, peers=peers)}) WHERE account <> ''"


def route(events: DataFrame, intervals: DataFrame, peers: Mapping[str, str] = NO_PEERS) -> DataFrame:
    """Publishes × subscription intervals → :data:`DELIVERIES`.

    A publish reaches an interval whose pattern matches its topic (see
    :func:`candidate_patterns`) when ``from_seq < seq < to_seq`` (null bounds
    open) and ``since <= accepted_at < until`` (null bounds open; the
    gateway's acceptance time, spec 4.1.9.1 SINCE/UNTIL).  A publish to an
    account topic also reaches its owner without any subscription (see
    :func:`account_topic_owner_sql`): that is how PUB REPLY and receipts get
    back to a publisher.  A publish repeated within the batch (same ``smuid``)
    counts once, at its first position.  One row per (subscriber account,
    smuid), however many ways reached that account.  A DELIVERY ONE message
    (2002 revision, XEP-0254 queueing) reaches one of them only, picked by a
    hash of (smuid, account): deterministic on replay, and spread evenly.  An account of ``peers``
    (``[federation] peers``: account → domain) is reached only when :func:`schemas.topics.forwards`
    allows (:func:`may_receive_sql`).
    """
    return run_sql(route_sql("{events}", "{intervals}", peers), {"events": events, "intervals": intervals})


# -- late subscribers

#: The stored deliveries a batch's new subscribers already have among the :func:`late` candidates.
HELD = StructType([
    StructField("account", StringType(), True),
    StructField("smuid", LongType(), True),
])


def _opened_sql(intervals: str) -> str:
    """SQL: the intervals this batch's SUBSCRIBEs opened that start a subscription (not a re-SUBSCRIBE
    redefining SINCE/UNTIL, whose previous interval ends where it opens) and are still open."""
    return f"""SELECT s.account, s.pattern, s.from_seq, s.since, s.until FROM {intervals} s
WHERE s.from_seq IS NOT NULL AND s.to_seq IS NULL
  AND NOT EXISTS (SELECT 1 FROM {intervals} p
                  WHERE p.account = s.account AND p.pattern = s.pattern AND p.to_seq = s.from_seq)"""


def late_sql(events: str, intervals: str, stored: str, held: str, routed_all: str, now: int | None,
             peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL of :func:`late` over the relations ``events``, ``intervals``, ``stored``, ``held`` and
    ``routed_all`` (:func:`route_all_sql`'s rows)."""
    publishes = _first_per("smuid", "seq", events, "type = 'publish'")
    columns = ("smuid, topic, cmuid, publisher, publisher_guid, accepted_at, priority, headers, sections, seq, "
               "expires_at, receipt, delivery, depth, hops, origin, origin_topic")
    candidates = f"""SELECT smuid, topic, cmuid, publisher, publisher_guid, unix_micros(accepted_at) AS accepted_at,
       priority, headers, sections, CAST(NULL AS {_SEQ_DDL}) AS seq, unix_micros(expires_at) AS expires_at,
       lower(coalesce(receipt, 'none')) AS receipt, lower(coalesce(delivery, 'all')) AS delivery,
       {federation_sql()}, FALSE AS _taken
FROM {_first_per("smuid", "batch_id", stored)} WHERE smuid NOT IN (SELECT smuid FROM {publishes})
UNION ALL
SELECT smuid, topic, cmuid, account AS publisher, guid AS publisher_guid, accepted_at, priority, headers, sections,
       seq, expires_at, lower(coalesce(receipt, 'none')) AS receipt, lower(coalesce(delivery, 'all')) AS delivery,
       {federation_sql()},
       EXISTS (SELECT 1 FROM {routed_all} r WHERE r.smuid = p.smuid AND r.account <> '') AS _taken
FROM {publishes} p"""
    return f"""SELECT account, {columns} FROM (
  SELECT *, row_number() OVER (PARTITION BY smuid ORDER BY {pick_order_sql("smuid", "account")}) AS _one FROM (
    SELECT *, row_number() OVER (PARTITION BY account, smuid ORDER BY seq) AS _d FROM (
      SELECT s.account, c.smuid, c.topic, c.cmuid, c.publisher, c.publisher_guid, c.accepted_at, c.priority,
             c.headers, c.sections, s.from_seq AS seq, c.expires_at, c.receipt, c.delivery, c.depth, c.hops,
             c.origin, c.origin_topic
      FROM (SELECT *, {_micros_to_ts("accepted_at")} AS _at, explode({candidate_patterns_sql("topic")}) AS _pattern
            FROM ({candidates}) WHERE NOT {_expired("expires_at", now)} AND NOT (delivery = 'one' AND _taken)) c
      JOIN ({_opened_sql(intervals)}) s
      ON s.pattern = c._pattern AND (c.seq IS NULL OR c.seq < s.from_seq)
         AND (s.since IS NULL OR s.since <= c._at) AND (s.until IS NULL OR c._at < s.until)
         {_and_may_receive("s.account", "c.depth", "c.hops", peers)}) m
    WHERE NOT EXISTS (SELECT 1 FROM {held} h WHERE h.account = m.account AND h.smuid = m.smuid)
      AND NOT EXISTS (SELECT 1 FROM {routed_all} r WHERE r.account = m.account AND r.smuid = m.smuid))
  WHERE _d = 1)
WHERE delivery <> 'one' OR _one = 1"""


def late(events: DataFrame, intervals: DataFrame, stored: DataFrame, held: DataFrame, routed_all: DataFrame,
         now: int | None, peers: Mapping[str, str] = NO_PEERS) -> DataFrame:
    """Messages published before a SUBSCRIBE that still reach it → :data:`DELIVERIES`.

    A message lives for its timeout (issue 4): a subscription this batch starts
    (:func:`_opened_sql`; a re-SUBSCRIBE only redefines SINCE/UNTIL and gets
    nothing again) gets every message on a topic it matches that was accepted
    before it and is not expired at ``now`` (a state message never is), within
    its SINCE/UNTIL, unless that account already has a delivery of it: stored
    (``held``, :data:`HELD`) or routed in this batch (``routed_all``).  The
    messages are the stored ones (``stored``: ``MESSAGES_TABLE`` columns, the
    sink reads the not yet expired ones of the subscribed topics) and this
    batch's publishes before the SUBSCRIBE.  A DELIVERY ONE message goes only
    when nobody holds it (the sink reads no stored one that anybody holds), to
    one of the new subscribers, picked by a hash like :func:`route`.  ``seq``
    is the SUBSCRIBE's: these Delivers answer it.  A new subscriber of ``peers`` gets what
    :func:`may_receive_sql` allows, as in :func:`route`.
    """
    return run_sql(late_sql("{events}", "{intervals}", "{stored}", "{held}", "{routed_all}", now, peers),
                   {"events": events, "intervals": intervals, "stored": stored, "held": held,
                    "routed_all": routed_all})


# -- SINCE clears what is pending

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


def cleared_sql(intervals: str, clearable: str, acks: str, expiring: str, retried: str, released: str) -> str:
    """SQL of :func:`cleared` over the relations ``intervals``, ``clearable``, ``acks``, ``expiring``,
    ``retried`` and ``released``."""
    return f"""SELECT account, smuid, seq FROM (
  SELECT c.account, c.smuid, s.from_seq AS seq,
         row_number() OVER (PARTITION BY c.account, c.smuid ORDER BY s.from_seq) AS _n
  FROM (SELECT *, explode({candidate_patterns_sql("topic")}) AS _pattern FROM {clearable}) c
  JOIN {intervals} s ON s.account = c.account AND s.pattern = c._pattern
       AND s.from_seq IS NOT NULL AND s.since IS NOT NULL AND c.accepted_at < s.since) x
WHERE _n = 1
  AND NOT EXISTS (SELECT 1 FROM {acks} a WHERE a.account = x.account AND a.smuid = x.smuid)
  AND NOT EXISTS (SELECT 1 FROM {expiring} e WHERE e.account = x.account AND e.smuid = x.smuid)
  AND NOT EXISTS (SELECT 1 FROM {retried} r WHERE r.account = x.account AND r.smuid = x.smuid)
  AND NOT EXISTS (SELECT 1 FROM {released} r WHERE r.account = x.account AND r.smuid = x.smuid)"""


def cleared(intervals: DataFrame, clearable: DataFrame, acks: DataFrame, expiring: DataFrame, retried: DataFrame,
            released: DataFrame) -> DataFrame:
    """Pending deliveries a SUBSCRIBE with SINCE clears → :data:`CLEARED`.

    Spec 4.1.9.1: a SUB MESSAGE with SINCE (a new subscription or a re-SUBSCRIBE
    redefining it) clears that subscriber's pending messages accepted before
    SINCE on the topics its pattern matches (``clearable``, :data:`CLEARABLE`:
    stored pending deliveries).  Their rows become ``cleared`` and an ``Acked``
    with reason ``cleared`` withdraws them from the gateways.  What this batch
    acknowledges, expires, retries or hands on is left alone (that wins).  Deliveries
    routed earlier in the same batch are :func:`withheld` instead.
    """
    return run_sql(cleared_sql("{intervals}", "{clearable}", "{acks}", "{expiring}", "{retried}", "{released}"),
                   {"intervals": intervals, "clearable": clearable, "acks": acks, "expiring": expiring,
                    "retried": retried, "released": released})


def _cleared_later_sql(events: str, routed: str) -> str:
    """SQL: true for a row of ``routed`` (a delivery of this batch) when a later SUBSCRIBE of the
    batch by the same account with SINCE after the message's acceptance, on a pattern matching its
    topic, clears it (:func:`withheld`)."""
    return f"""EXISTS (SELECT 1 FROM {events} s
  WHERE s.type = 'subscribe' AND s.since IS NOT NULL AND s.account = {routed}.account
    AND s.seq > {routed}.seq AND {routed}.accepted_at < s.since
    AND array_contains({candidate_patterns_sql(f"{routed}.topic")}, s.pattern))"""


def withheld_sql(events: str, routed: str, cleared: bool = True) -> str:
    """SQL of :func:`withheld` over the relations ``events`` and ``routed``; with ``cleared``
    False, the rest of ``routed`` (the deliveries that go out)."""
    test = _cleared_later_sql(events, "_r")
    return f"SELECT * FROM {routed} _r WHERE {test if cleared else f'NOT {test}'}"


def withheld(events: DataFrame, routed: DataFrame) -> DataFrame:
    """This batch's deliveries (:data:`DELIVERIES`) that a later SUBSCRIBE of the same batch clears.

    A SUB MESSAGE with SINCE clears what is pending for the subscriber before
    SINCE (:func:`cleared`); a delivery routed earlier in the same batch (through
    the subscription the SUBSCRIBE redefines, or another of the account's) is
    pending too, so it is never sent: its row becomes ``cleared`` at once
    (:func:`delivery_updates`).  ``seq`` orders them: a SUBSCRIBE before the
    publish filters it by SINCE when routing instead.
    """
    return run_sql(withheld_sql("{events}", "{routed}"), {"events": events, "routed": routed})


# -- Delta rows


def subscription_state_sql(intervals: str, batch_id: int) -> str:
    """SQL of :func:`subscription_state` over the relation ``intervals``."""
    last = _first_per("account, pattern", "from_seq DESC NULLS LAST", intervals,
                      "from_seq IS NOT NULL OR to_seq IS NOT NULL")
    return f"""SELECT account, pattern, guid, to_seq IS NULL AS active, subscribed_at, unsubscribed_at, since, until,
       {sql_literal(batch_id)} AS batch_id
FROM {last}"""


def subscription_state(intervals: DataFrame, batch_id: int) -> DataFrame:
    """Intervals → rows for the ``subscriptions`` merge (``SUBSCRIPTIONS_TABLE`` columns).

    Only (account, pattern) pairs this batch touched appear (an interval with a
    non-null bound).  Each takes its last interval: ``active`` when it is still
    open, with that interval's guid, ``subscribed_at``, ``unsubscribed_at`` and
    SINCE/UNTIL, so the next batch (or a restart) routes with the latest bounds.
    """
    return run_sql(subscription_state_sql("{intervals}", batch_id), {"intervals": intervals})


def extract_acks_sql(events: str) -> str:
    """SQL of :func:`extract_acks` over the relation ``events``."""
    return f"""SELECT account, smuid, {_micros_to_ts("accepted_at")} AS acked_at, guid AS acked_guid, seq
FROM {_first_per("account, smuid", "seq", events, "type = 'ack'")}"""


def extract_acks(events: DataFrame) -> DataFrame:
    """ACK events → :data:`ACKS`, one per (account, smuid): the first one in the batch."""
    return run_sql(extract_acks_sql("{events}"), {"events": events})


def message_rows_sql(events: str, batch_id: int) -> str:
    """SQL of :func:`message_rows` over the relation ``events``."""
    return f"""SELECT smuid, topic, cmuid, account AS publisher, guid AS publisher_guid, priority, headers, sections,
       {_micros_to_ts("accepted_at")} AS accepted_at, kafka_partition, kafka_offset,
       {sql_literal(batch_id)} AS batch_id, {_micros_to_ts("expires_at")} AS expires_at,
       lower(coalesce(receipt, 'none')) AS receipt, lower(coalesce(delivery, 'all')) AS delivery, {federation_sql()}
FROM {_first_per("smuid", "seq", events, "type = 'publish'")}"""


def message_rows(events: DataFrame, batch_id: int) -> DataFrame:
    """Publishes → ``MESSAGES_TABLE`` rows (one per smuid in the batch; data stays base64)."""
    return run_sql(message_rows_sql("{events}", batch_id), {"events": events})


def unguaranteed_sql(headers: str) -> str:
    """SQL: true when the message attributes ``headers`` say ``Guarantee: NO`` (or ``Guar: NO``).

    Such a message (2002 revision) is never acknowledged by its subscribers:
    its delivery is settled as soon as it is sent.
    """
    return (f"exists(coalesce({headers}, CAST(array() AS {HEADERS.simpleString()})), "
            f"_h -> lower(_h[0]) IN ('guarantee', 'guar') AND upper(trim(_h[1])) = 'NO')")


def settled_sql(acks: str, deliveries: str) -> str:
    """SQL: what the gateways may forget, as (account, smuid, seq): every ACK, and every
    delivery of a non-guaranteed message (no ACK will ever come for it)."""
    return f"""SELECT account, smuid, seq FROM {acks}
UNION ALL
SELECT account, smuid, seq FROM {deliveries} WHERE {unguaranteed_sql("headers")}"""


def settled(acks: DataFrame, deliveries: DataFrame) -> DataFrame:
    """ACKs + non-guaranteed deliveries → (account, smuid, seq) the gateways may forget (:func:`settled_sql`)."""
    return run_sql(settled_sql("{acks}", "{deliveries}"), {"acks": acks, "deliveries": deliveries})


def empty_sql(schema: StructType) -> str:
    """SQL: an empty relation with the columns of ``schema`` (stands in for a relation with no rows)."""
    columns = ", ".join(f"CAST(NULL AS {f.dataType.simpleString()}) AS `{f.name}`" for f in schema.fields)
    return f"(SELECT {columns} WHERE FALSE)"


def _expired(expires_at: str, now: int | None, micros: bool = True) -> str:
    """SQL: true when ``expires_at`` (microseconds, or a timestamp when not ``micros``) is at or
    before ``now`` (microseconds); never for a null ``expires_at`` (a state message) or ``now``."""
    if now is None:
        return "FALSE"
    bound = sql_literal(now) if micros else f"timestamp_micros({sql_literal(now)})"
    return f"coalesce({expires_at} <= {bound}, FALSE)"


def unrouted_sql(events: str, routed: str) -> str:
    """SQL of :func:`unrouted` over the relations ``events`` and ``routed``."""
    return f"""SELECT p.smuid, p.topic, p.priority, p.expires_at
FROM {_first_per("smuid", "seq", events, "type = 'publish'")} p LEFT ANTI JOIN {routed} r ON p.smuid = r.smuid
WHERE p.expires_at IS NOT NULL"""


def unrouted(events: DataFrame, routed: DataFrame) -> DataFrame:
    """Publishes of the batch that reached no subscriber and can expire: (smuid, topic, priority, expires_at).

    Each is kept as a ``deliveries`` row with account ``''`` and status
    ``unrouted`` (see :func:`delivery_updates`) until it expires into the
    Trash; a state message (no ``expires_at``) never does, so it needs none.
    The sink takes the same rows from :func:`route_all_sql` (:func:`unrouted_of_sql`),
    saving a join.
    """
    return run_sql(unrouted_sql("{events}", "{routed}"), {"events": events, "routed": routed})


def unrouted_of_sql(routed_all: str) -> str:
    """SQL: :func:`unrouted`'s rows out of the relation ``routed_all`` (:func:`route_all_sql`)."""
    return f"SELECT smuid, topic, priority, expires_at FROM {routed_all} WHERE account = ''"


def expiring_sql(routed: str, unrouted: str, acks: str, pending: str, now: int | None) -> str:
    """SQL of :func:`expiring` over the relations ``routed``, ``unrouted``, ``acks`` and ``pending``."""
    return f"""SELECT r.account, r.smuid, TRUE AS is_new
FROM {routed} r LEFT ANTI JOIN {acks} a ON r.account = a.account AND r.smuid = a.smuid
WHERE NOT {unguaranteed_sql("r.headers")} AND {_expired("r.expires_at", now)}
UNION ALL
SELECT '' AS account, u.smuid, TRUE AS is_new FROM {unrouted} u WHERE {_expired("u.expires_at", now)}
UNION ALL
SELECT p.account, p.smuid, FALSE AS is_new
FROM (SELECT * FROM {pending} q LEFT ANTI JOIN {routed} r ON q.account = r.account AND q.smuid = r.smuid) p
LEFT ANTI JOIN {acks} a ON p.account = a.account AND p.smuid = a.smuid
WHERE p.status IN ('pending', 'unrouted', 'waiting') AND {_expired("p.expires_at", now, micros=False)}"""


def expiring(routed: DataFrame, unrouted: DataFrame, acks: DataFrame, pending: DataFrame,
             now: int | None) -> DataFrame:
    """The deliveries whose message expires in this batch, unacknowledged → :data:`EXPIRING`.

    ``now`` (microseconds) is the batch's clock: the largest tick or
    ``accepted_at`` it holds, so a replay decides the same way.  A message
    expires when ``expires_at <= now``; a state message (null ``expires_at``)
    never does.  Expiring are: this batch's guaranteed deliveries
    (:data:`DELIVERIES`, ``routed``) of an already expired message, unless the
    batch also holds their ACK; this batch's :func:`unrouted` publishes
    (account ``''``); and the stored ``pending`` rows (:data:`PENDING`: status
    ``pending``, ``unrouted`` or ``waiting``) the batch neither acknowledges nor routes
    anew.  A delivery of a non-guaranteed message is settled when sent and
    never expires.
    """
    return run_sql(expiring_sql("{routed}", "{unrouted}", "{acks}", "{pending}", now),
                   {"routed": routed, "unrouted": unrouted, "acks": acks, "pending": pending})


def live_sql(routed: str, expiring: str) -> str:
    """SQL of :func:`live` over the relations ``routed`` and ``expiring``."""
    return f"""SELECT * FROM {routed} r
WHERE NOT EXISTS (SELECT 1 FROM {expiring} e WHERE e.is_new AND e.account = r.account AND e.smuid = r.smuid)"""


def live(routed: DataFrame, expiring: DataFrame) -> DataFrame:
    """This batch's deliveries minus those already expired (:func:`expiring`): the ones to send."""
    return run_sql(live_sql("{routed}", "{expiring}"), {"routed": routed, "expiring": expiring})


def unacknowledged_sql(live: str, acks: str) -> str:
    """SQL of :func:`unacknowledged` over the relations ``live`` and ``acks``."""
    return f"""SELECT * FROM {live} l
WHERE NOT EXISTS (SELECT 1 FROM {acks} a WHERE a.account = l.account AND a.smuid = l.smuid)"""


def unacknowledged(live: DataFrame, acks: DataFrame) -> DataFrame:
    """This batch's live deliveries minus those the same batch acknowledges: the ones whose
    ``Deliver`` a gateway still needs.

    An ACK in the batch that routes its message answers a NOTIFY a gateway sent on its own,
    routing early (the job's deliveries are sent only after its batch): that gateway has the
    delivery, and the ``Acked`` that follows settles it at every other; a ``Deliver`` before it
    would be ~600 B produced, stored and fetched by every gateway only to be skipped."""
    return run_sql(unacknowledged_sql("{live}", "{acks}"), {"live": live, "acks": acks})


def _trashed_at(now: int | None) -> str:
    return "CAST(NULL AS TIMESTAMP)" if now is None else f"timestamp_micros({sql_literal(now)})"


#: The stored messages of removed topics that nobody holds any more (``smuid``s; the sink reads them).
ORPHANED = StructType([StructField("smuid", LongType(), True)])


def dead_messages_sql(expiring: str, retried: str, orphaned: str | None = None, routed: str | None = None) -> str:
    """SQL of :func:`dead_messages` over the relations ``expiring``, ``retried``, ``orphaned`` and
    ``routed`` (none when None)."""
    orphaned = orphaned or empty_sql(ORPHANED)
    held = f" AND smuid NOT IN (SELECT smuid FROM {routed})" if routed else ""
    return f"""SELECT smuid, '' AS account,
       CASE WHEN bool_and(account = '') THEN 'undeliverable' ELSE 'expired' END AS reason
FROM {expiring} GROUP BY smuid
UNION ALL
SELECT smuid, account, 'max_retries' AS reason FROM {retried} WHERE dead
UNION ALL
SELECT DISTINCT smuid, '' AS account, 'topic_removed' AS reason FROM {orphaned}
WHERE smuid NOT IN (SELECT smuid FROM {expiring}){held}"""


def dead_messages(expiring: DataFrame, retried: DataFrame, orphaned: DataFrame | None = None,
                  routed: DataFrame | None = None) -> DataFrame:
    """What goes to the Trash in this batch → :data:`DEAD`.

    A message with an :func:`expiring` delivery goes once, as a whole
    (account ``''``): reason ``undeliverable`` when it reached no subscriber,
    else ``expired``.  A delivery that used up its retries (:func:`retried`,
    ``dead``) goes for that subscriber: reason ``max_retries``.  A message of a
    topic removed in this batch that nobody holds any more (``orphaned``,
    :data:`ORPHANED`: stored ones kept only for late subscribers, or unrouted,
    and the batch's own publishes before the removal) goes as a whole: reason
    ``topic_removed`` (unless it expires now: ``expired`` wins), unless this
    batch routes it to somebody (``routed``, :data:`DELIVERIES`): its pending
    deliveries still go out.
    """
    frames = {"expiring": expiring, "retried": retried}
    optional = {"orphaned": orphaned, "routed": routed}
    frames.update({name: frame for name, frame in optional.items() if frame is not None})
    return run_sql(dead_messages_sql("{expiring}", "{retried}", *("{%s}" % name if frame is not None else None
                                                                  for name, frame in optional.items())), frames)


def trash_sql(dead: str, messages: str, now: int | None, batch_id: int) -> str:
    """SQL of :func:`trash` over the relations ``dead`` and ``messages``."""
    return f"""SELECT m.smuid, m.topic, concat(m.topic, '/Trash') AS trash_topic, d.reason,
       {_trashed_at(now)} AS trashed_at, m.publisher, m.cmuid, m.headers, m.sections,
       {sql_literal(batch_id)} AS batch_id, d.account
FROM {dead} d JOIN {_first_per("smuid", "batch_id", messages)} m ON d.smuid = m.smuid"""


def trash(dead: DataFrame, messages: DataFrame, now: int | None, batch_id: int) -> DataFrame:
    """:func:`dead_messages` → ``TRASH_TABLE`` rows in the message's topic's Trash (``<topic>/Trash``).

    ``messages`` has the ``MESSAGES_TABLE`` columns (this batch's rows and the
    stored rows of the dead messages).  A fully acknowledged message has no
    pending delivery left and never dies.  ``trashed_at`` is the batch's ``now``.
    """
    return run_sql(trash_sql("{dead}", "{messages}", now, batch_id), {"dead": dead, "messages": messages})


def retried_sql(events: str, retrying: str, acks: str, expiring: str, released: str | None = None) -> str:
    """SQL of :func:`retried` over the relations ``events``, ``retrying``, ``acks``, ``expiring`` and
    ``released`` (none when None)."""
    released = released or empty_sql(RELEASED)
    return f"""SELECT r.account, r.smuid, CAST(coalesce(r.retries, 0) + n.nacks AS INT) AS retries,
       coalesce(r.retries, 0) + n.nacks > n.max_retries AS dead, n.seq
FROM (SELECT account, smuid, count(1) AS nacks, max_by(max_retries, seq) AS max_retries, max(seq) AS seq
      FROM {events} WHERE type = 'nack' GROUP BY account, smuid) n
JOIN {retrying} r ON n.account = r.account AND n.smuid = r.smuid
WHERE r.status = 'pending'
  AND NOT EXISTS (SELECT 1 FROM {acks} a WHERE a.account = r.account AND a.smuid = r.smuid)
  AND NOT EXISTS (SELECT 1 FROM {expiring} e WHERE e.account = r.account AND e.smuid = r.smuid)
  AND NOT EXISTS (SELECT 1 FROM {released} x WHERE x.account = r.account AND x.smuid = r.smuid)"""


def retried(events: DataFrame, retrying: DataFrame, acks: DataFrame, expiring: DataFrame,
            released: DataFrame | None = None) -> DataFrame:
    """NACKs (a NOTIFY unacknowledged within the retry timeout) → :data:`RETRIED`.

    Each NACK of a still ``pending`` delivery (``retrying``: its stored row,
    :data:`RETRYING`) counts one retry; a delivery whose count passes the
    ``max_retries`` the gateway stamped on its latest NACK (the first NOTIFY and
    ``max_retries`` more went unacknowledged) is ``dead`` and goes to the Trash.  A delivery this batch acknowledges or expires is not
    retried: the ACK (or the expiry) wins; nor is one :func:`released` to another subscriber.
    Retry counts live in the ``deliveries`` table, so a restart of the job or of a gateway keeps them.
    """
    frames = {"events": events, "retrying": retrying, "acks": acks, "expiring": expiring}
    if released is not None:
        frames["released"] = released
    return run_sql(retried_sql("{events}", "{retrying}", "{acks}", "{expiring}",
                               "{released}" if released is not None else None), frames)


def released_sql(events: str, retrying: str, acks: str, expiring: str, intervals: str, messages: str,
                 peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL of :func:`released` over the relations ``events``, ``retrying``, ``acks``, ``expiring``,
    ``intervals`` and ``messages``."""
    held = f"""SELECT n.account, n.smuid, n.seq FROM (
      SELECT account, smuid, max(seq) AS seq FROM {events} WHERE type = 'nack' GROUP BY account, smuid) n
    JOIN {retrying} r ON n.account = r.account AND n.smuid = r.smuid
    WHERE r.status = 'pending' AND r.delivery = 'one'
      AND NOT EXISTS (SELECT 1 FROM {acks} a WHERE a.account = n.account AND a.smuid = n.smuid)
      AND NOT EXISTS (SELECT 1 FROM {expiring} e WHERE e.account = n.account AND e.smuid = n.smuid)"""
    gone = f"SELECT DISTINCT account FROM {events} WHERE type = 'nack' AND reason = 'disconnect'"
    order = f"p.account IS NOT NULL, {pick_order_sql('c.smuid', 'c.`to`')}"
    return f"""SELECT account, smuid, `to`, seq FROM (
  SELECT c.*, row_number() OVER (PARTITION BY c.smuid ORDER BY {order}) AS _k
  FROM (
    SELECT h.account, h.smuid, h.seq, s.account AS `to`
    FROM (SELECT h.*, m.accepted_at AS _at, m.depth AS _depth, m.hops AS _hops,
                 explode({candidate_patterns_sql("m.topic")}) AS _pattern
          FROM ({held}) h JOIN {_first_per("smuid", "batch_id", messages)} m ON m.smuid = h.smuid) h
    JOIN {intervals} s ON s.pattern = h._pattern AND s.to_seq IS NULL
         AND (s.since IS NULL OR s.since <= h._at) AND (s.until IS NULL OR h._at < s.until)
         {_and_may_receive("s.account", "h._depth", "h._hops", peers)}
    WHERE s.account <> h.account AND s.account NOT IN ({gone})) c
  LEFT JOIN (SELECT DISTINCT account, smuid FROM {retrying}) p ON p.account = c.`to` AND p.smuid = c.smuid)
WHERE _k = 1"""


def released(events: DataFrame, retrying: DataFrame, acks: DataFrame, expiring: DataFrame, intervals: DataFrame,
             messages: DataFrame, peers: Mapping[str, str] = NO_PEERS) -> DataFrame:
    """NACKed DELIVERY ONE deliveries and who gets them instead → :data:`RELEASED`.

    XEP-0254 queueing: a DELIVERY ONE message is locked to one subscriber until
    it acknowledges; when its NOTIFY times out, or the subscriber's login ends
    (a ``disconnect`` NACK), it is unlocked and offered to another subscriber:
    one whose subscription covers its topic at the end of the batch (and whose
    SINCE/UNTIL admit it), not the one releasing it, not one that disconnected
    in this batch, preferring one that never held it, then by a hash of
    (smuid, account).  With nobody else, nothing is released and the NACK
    counts as a retry (:func:`retried`).  ``retrying`` holds the stored
    deliveries of the NACKed messages, every account's; ``messages`` has the
    ``MESSAGES_TABLE`` columns.  A subscriber of ``peers`` takes it only as :func:`may_receive_sql` allows.
    """
    return run_sql(released_sql("{events}", "{retrying}", "{acks}", "{expiring}", "{intervals}", "{messages}",
                                peers),
                   {"events": events, "retrying": retrying, "acks": acks, "expiring": expiring,
                    "intervals": intervals, "messages": messages})


def reassigned_sql(released: str, messages: str) -> str:
    """SQL: :func:`released` → the new deliveries (:data:`DELIVERIES`) to their new subscribers."""
    return f"""SELECT x.`to` AS account, m.smuid, m.topic, m.cmuid, m.publisher, m.publisher_guid,
       unix_micros(m.accepted_at) AS accepted_at, m.priority, m.headers, m.sections, x.seq,
       unix_micros(m.expires_at) AS expires_at, coalesce(m.receipt, 'none') AS receipt, 'one' AS delivery,
       {federation_sql("m")}
FROM {released} x JOIN {_first_per("smuid", "batch_id", messages)} m ON m.smuid = x.smuid"""


def delivery_updates_sql(deliveries: str, acks: str, batch_id: int, routed_at: datetime,
                         now: int | None = None, unrouted: str | None = None, expiring: str | None = None,
                         retried: str | None = None, released: str | None = None, nobody: str | None = None,
                         cleared: str | None = None, withheld: str | None = None) -> str:
    """SQL of :func:`delivery_updates` over the relations ``deliveries``, ``acks`` (and ``unrouted``,
    ``expiring``, ``retried``, ``released``, ``nobody``, ``cleared``, ``withheld``: empty when None)."""
    unrouted = unrouted or empty_sql(StructType([StructField("smuid", LongType()), StructField("topic", StringType()),
                                                 StructField("priority", IntegerType()),
                                                 StructField("expires_at", LongType())]))
    expiring = expiring or empty_sql(EXPIRING)
    retried = retried or empty_sql(RETRIED)
    routed_at_sql, batch_sql = sql_literal(routed_at), sql_literal(batch_id)
    released = released or empty_sql(RELEASED)
    nobody = nobody or empty_sql(NOBODY_UPDATES)
    cleared = cleared or empty_sql(CLEARED)
    no_update = "CAST(NULL AS INT) AS retries, CAST(NULL AS STRING) AS receipt, CAST(NULL AS STRING) AS delivery"
    deliveries = (f"(SELECT *, FALSE AS _withheld FROM {deliveries}"
                  + (f" UNION ALL SELECT *, TRUE AS _withheld FROM {withheld})" if withheld else ")"))
    return f"""SELECT d.account, d.smuid, d.topic, d.priority,
       CASE WHEN d._withheld THEN 'cleared'
            WHEN {unguaranteed_sql("d.headers")} THEN 'sent'
            WHEN a.acked_at IS NOT NULL OR a.acked_guid IS NOT NULL THEN 'acked'
            WHEN rt.dead THEN 'trashed'
            WHEN {_expired("d.expires_at", now)} THEN 'expired' ELSE 'pending' END AS status,
       {routed_at_sql} AS routed_at, {batch_sql} AS routed_batch_id,
       a.acked_at, a.acked_guid, {_micros_to_ts("d.expires_at")} AS expires_at, rt.retries,
       d.receipt, d.delivery, TRUE AS is_new
FROM {deliveries} d LEFT JOIN {acks} a ON d.account = a.account AND d.smuid = a.smuid
LEFT JOIN {retried} rt ON d.account = rt.account AND d.smuid = rt.smuid
UNION ALL
SELECT '' AS account, u.smuid, u.topic, u.priority,
       CASE WHEN {_expired("u.expires_at", now)} THEN 'expired' ELSE 'unrouted' END AS status,
       {routed_at_sql} AS routed_at, {batch_sql} AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       {_micros_to_ts("u.expires_at")} AS expires_at, {no_update}, TRUE AS is_new
FROM {unrouted} u
UNION ALL
SELECT a.account, a.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, 'acked' AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       a.acked_at, a.acked_guid, CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {acks} a LEFT ANTI JOIN {deliveries} d ON a.account = d.account AND a.smuid = d.smuid
UNION ALL
SELECT e.account, e.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, 'expired' AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {expiring} e WHERE NOT e.is_new
UNION ALL
SELECT r.account, r.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority,
       CASE WHEN r.dead THEN 'trashed' ELSE 'retry' END AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, r.retries, CAST(NULL AS STRING) AS receipt,
       CAST(NULL AS STRING) AS delivery, FALSE AS is_new
FROM {retried} r LEFT ANTI JOIN {deliveries} d ON r.account = d.account AND r.smuid = d.smuid
UNION ALL
SELECT x.account, x.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, 'released' AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {released} x
UNION ALL
SELECT c.account, c.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, 'cleared' AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {cleared} c
UNION ALL
SELECT '' AS account, n.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, n.status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {nobody} n"""


def delivery_updates(deliveries: DataFrame, acks: DataFrame, batch_id: int, routed_at: datetime,
                     now: int | None = None, unrouted: DataFrame | None = None,
                     expiring: DataFrame | None = None, retried: DataFrame | None = None,
                     released: DataFrame | None = None, nobody: DataFrame | None = None,
                     cleared: DataFrame | None = None, withheld: DataFrame | None = None) -> DataFrame:
    """New deliveries, acks and expiries → the source of the ``deliveries`` merge.

    ``DELIVERIES_TABLE`` columns plus ``is_new``: new deliveries are
    ``is_new`` rows, already ``acked`` when this batch also holds their ACK,
    ``sent`` for a non-guaranteed message (:func:`unguaranteed_sql`),
    ``expired`` when their message's ``expires_at <= now``;
    :func:`unrouted` publishes are ``is_new`` rows of account ``''``, status
    ``unrouted`` (``expired`` once past).  ACKs for deliveries of earlier
    batches are ``is_new = false`` rows with status ``acked``, and stored
    deliveries that expire now (:func:`expiring`, not ``is_new``) are
    ``is_new = false`` rows with status ``expired``: they update a matching row
    and are never inserted.  :func:`retried` deliveries are ``is_new = false``
    rows with their new ``retries`` and status ``retry`` (update the count
    only) or ``trashed`` (out of retries); :func:`released` ones are ``is_new =
    false`` rows with status ``released`` (their new subscriber's row comes in
    ``deliveries``).  ``nobody`` (:data:`NOBODY_UPDATES`) sets the status of stored ``unrouted``
    rows: ``routed`` once a late subscriber took the message (its delivery expires, or not, from
    then on), ``trashed`` once its topic was removed.  :func:`cleared` deliveries are ``is_new =
    false`` rows with status ``cleared``; :func:`withheld` ones (routed in this batch, never sent)
    are ``is_new`` rows with status ``cleared``.  One row per (account, smuid).
    """
    frames = {"deliveries": deliveries, "acks": acks}
    optional = {"unrouted": unrouted, "expiring": expiring, "retried": retried, "released": released,
                "nobody": nobody, "cleared": cleared, "withheld": withheld}
    frames.update({name: frame for name, frame in optional.items() if frame is not None})
    return run_sql(delivery_updates_sql("{deliveries}", "{acks}", batch_id, routed_at, now,
                                        *("{%s}" % name if frame is not None else None
                                          for name, frame in optional.items())), frames)


# -- records for smqp.deliveries


def deliver_records_sql(deliveries: str) -> str:
    """SQL of :func:`deliver_records` over the relation ``deliveries``."""
    return f"""SELECT CAST(account AS BINARY) AS key, to_json(named_struct(
         'type', 'deliver', 'account', account, 'smuid', smuid, 'topic', topic, 'cmuid', cmuid,
         'publisher', publisher, 'publisher_guid', publisher_guid, 'accepted_at', accepted_at,
         'priority', coalesce(priority, 0),
         'headers', coalesce(headers, CAST(array() AS {HEADERS.simpleString()})),
         'sections', coalesce(sections, CAST(array() AS {ArrayType(SECTION_JSON).simpleString()})),
         'delivery', coalesce(delivery, 'all'), 'expires_at', expires_at,
         'depth', coalesce(depth, 0), 'hops', coalesce(hops, {_NO_HOPS}), 'origin', origin,
         'origin_topic', origin_topic)) AS value,
       seq
FROM {deliveries}"""


def deliver_records(deliveries: DataFrame) -> DataFrame:
    """Deliveries → ``smqp.deliveries`` records: key = account, value = Deliver JSON.

    Field names and nesting are those of ``schemas.events.Deliver.to_bytes()``
    so ``schemas.events.decode`` returns an equal ``Deliver``.  ``seq`` is the
    publish's position: produce in that order (acceptance order).
    """
    return run_sql(deliver_records_sql("{deliveries}"), {"deliveries": deliveries})


def acked_records_sql(acks: str) -> str:
    """SQL of :func:`acked_records` over the relation ``acks``."""
    return f"""SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid)) AS value, seq
FROM {acks}"""


def acked_records(acks: DataFrame) -> DataFrame:
    """ACKs (:data:`ACKS` plus their ``seq``) → ``smqp.deliveries`` records: key = account, value = Acked JSON."""
    return run_sql(acked_records_sql("{acks}"), {"acks": acks})


def expired_records_sql(expiring: str, retried: str, released: str | None = None, cleared: str | None = None) -> str:
    """SQL of :func:`expired_records` over the relations ``expiring``, ``retried``, ``released`` and
    ``cleared`` (none when None)."""
    released = released or empty_sql(RELEASED)
    cleared = cleared or empty_sql(CLEARED)
    return f"""SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid, 'reason', 'expired')) AS value,
       CAST(NULL AS {_SEQ_DDL}) AS seq
FROM {expiring} WHERE account <> ''
UNION ALL
SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid, 'reason', 'max_retries')) AS value,
       seq
FROM {retried} WHERE dead
UNION ALL
SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid, 'reason', 'released')) AS value,
       seq
FROM {released}
UNION ALL
SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid, 'reason', 'cleared')) AS value,
       seq
FROM {cleared}"""


def expired_records(expiring: DataFrame, retried: DataFrame, released: DataFrame | None = None,
                    cleared: DataFrame | None = None) -> DataFrame:
    """Deliveries that died unacknowledged → ``Acked`` records with the reason, so the
    gateways withdraw them from their books and queues: those that expired (:func:`expiring`;
    this batch's expired deliveries the job never sends, but a gateway routing early may have
    notified them) and those out of retries
    (:func:`retried`, ``dead``), DELIVERY ONE ones handed to another subscriber (:func:`released`),
    and those a new SINCE cleared (:func:`cleared`)."""
    frames = {"expiring": expiring, "retried": retried}
    optional = {"released": released, "cleared": cleared}
    frames.update({name: frame for name, frame in optional.items() if frame is not None})
    return run_sql(expired_records_sql("{expiring}", "{retried}", *("{%s}" % name if frame is not None else None
                                                                    for name, frame in optional.items())), frames)


# -- receipts (2002 revision: RECEIPT ONE / ALL, and "X/Y" when the timeout passes first)

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


def receipts_due_sql(state: str, acks: str, expiring: str, receipted: str, messages: str | None = None,
                     routed: str | None = None) -> str:
    """SQL of :func:`receipts_due` over the relations ``state``, ``acks``, ``expiring``, ``receipted``,
    ``messages`` and ``routed`` (none when None)."""
    messages = messages or empty_sql(MESSAGES_TABLE)
    routed = routed or empty_sql(DELIVERIES)
    nobody = f"""SELECT e.smuid, lower(m.receipt) AS mode, 0 AS acked, 0 AS targeted
FROM (SELECT DISTINCT smuid FROM {expiring} WHERE account = '') e
JOIN {_first_per("smuid", "batch_id", messages)} m ON m.smuid = e.smuid
WHERE lower(m.receipt) IN ('one', 'all') AND e.smuid NOT IN (SELECT smuid FROM {state})
  AND e.smuid NOT IN (SELECT smuid FROM {receipted})"""
    return f"""{nobody}
UNION ALL
SELECT smuid, mode, acked, targeted FROM (
  SELECT s.smuid, max(s.receipt) AS mode,
         CAST(count_if(s.status = 'acked' OR a.account IS NOT NULL) AS INT) AS acked,
         CAST(count(1) AS INT) AS targeted, bool_or(e.smuid IS NOT NULL) AS expiring
  FROM (SELECT account, smuid, status, receipt FROM {state}
        UNION ALL SELECT account, smuid, 'pending' AS status, receipt FROM {routed}) s
  LEFT JOIN {acks} a ON a.account = s.account AND a.smuid = s.smuid
  LEFT JOIN (SELECT DISTINCT smuid FROM {expiring}) e ON e.smuid = s.smuid
  WHERE s.account <> '' AND s.receipt IN ('one', 'all') AND s.status <> 'released'
  GROUP BY s.smuid)
WHERE ((mode = 'one' AND acked >= 1) OR (mode = 'all' AND acked = targeted) OR expiring)
  AND smuid NOT IN (SELECT smuid FROM {receipted})"""


def receipts_due(state: DataFrame, acks: DataFrame, expiring: DataFrame, receipted: DataFrame,
                 messages: DataFrame | None = None, routed: DataFrame | None = None) -> DataFrame:
    """The receipts this batch owes → :data:`RECEIPTS_DUE`.

    ``state`` holds every stored delivery (:data:`RECEIPT_STATE`) of the
    messages concerned; this batch's ACKs count as acknowledged.  A RECEIPT
    ONE message is due at its first acknowledgement, a RECEIPT ALL message
    when every subscriber it was routed to acknowledged it, and either one,
    when its timeout passes first (it is :func:`expiring`), with ``X/Y`` =
    ``acked/targeted`` so far.  ``receipted`` (smuids) were answered already:
    a message gets one receipt, ever.  A message that reached nobody (an :func:`expiring` row of
    account ``''``; ``messages``, ``MESSAGES_TABLE`` columns, says whether it asked for a receipt)
    gets ``0/0`` at its expiry; one a late subscriber took (:func:`late`) is answered like any other.
    This batch's deliveries (``routed``, :data:`DELIVERIES`) count among the targeted too: a message
    already expired when routed gets its ``X/Y`` now, as from a later batch, and a subscriber may
    acknowledge a message in the batch that routes it, having been notified by a gateway routing early.
    """
    frames = {"state": state, "acks": acks, "expiring": expiring, "receipted": receipted}
    optional = {"messages": messages, "routed": routed}
    frames.update({name: frame for name, frame in optional.items() if frame is not None})
    return run_sql(receipts_due_sql("{state}", "{acks}", "{expiring}", "{receipted}",
                                    *("{%s}" % name if frame is not None else None
                                      for name, frame in optional.items())), frames)


def receipt_messages_sql(due: str, messages: str, now: int | None) -> str:
    """SQL of :func:`receipt_messages` over the relations ``due`` and ``messages``."""
    if now is None:
        return empty_sql(RECEIPT_MESSAGES)[1:-1]
    k = "_k"
    smuid = (f"shiftleft({sql_literal(now // 1000 - EPOCH_MS)} + div({k}, {MAX_SEQUENCE + 1}), "
             f"{NODE_BITS + SEQUENCE_BITS}) | shiftleft(CAST({JOB_NODE_ID} AS BIGINT), {SEQUENCE_BITS}) "
             f"| ({k} % {MAX_SEQUENCE + 1})")
    body = "concat(d.acked, '/', d.targeted)"
    return f"""SELECT lower(m.publisher) AS account, {smuid} AS smuid, concat('/accounts/', lower(m.publisher)) AS topic,
       m.cmuid, m.publisher, m.publisher_guid, {sql_literal(now)} AS accepted_at, 0 AS priority,
       array(array('Receipt', upper(d.mode)), array('Receipt-For', CAST(d.smuid AS STRING)),
             array('Delivered', {body})) AS headers,
       array(named_struct('headers', array(array('Content-Type', 'text/plain'),
                                           array('Content-Length', CAST(length({body}) AS STRING))),
                          'data', base64(CAST({body} AS BINARY)))) AS sections,
       CAST(NULL AS {_SEQ_DDL}) AS seq, CAST(NULL AS BIGINT) AS expires_at, 'none' AS receipt, 'all' AS delivery,
       0 AS depth, {_NO_HOPS} AS hops, CAST(NULL AS STRING) AS origin, CAST(NULL AS STRING) AS origin_topic,
       d.smuid AS receipt_for, d.mode, d.acked, d.targeted
FROM (SELECT *, row_number() OVER (ORDER BY smuid) - 1 AS {k} FROM {due}) d
JOIN {_first_per("smuid", "batch_id", messages)} m ON m.smuid = d.smuid"""


def receipt_messages(due: DataFrame, messages: DataFrame, now: int | None) -> DataFrame:
    """:func:`receipts_due` → the receipt messages (:data:`RECEIPT_MESSAGES`), one each.

    A receipt is a message on the publisher's account topic
    (``/accounts/<publisher>``, which reaches its owner), carrying the
    original's Cmuid and the attributes ``Receipt`` (ONE / ALL),
    ``Receipt-For`` (the original SMUID) and ``Delivered: X/Y``, with ``X/Y``
    as its text body.  Its SMUID is the job's own (node
    :data:`schemas.smuid.JOB_NODE_ID`, the batch's clock, a sequence by
    original SMUID), so a replayed batch makes the same receipt.
    ``messages`` has the ``MESSAGES_TABLE`` columns.
    """
    return run_sql(receipt_messages_sql("{due}", "{messages}", now), {"due": due, "messages": messages})


def receipt_rows_sql(receipts: str, batch_id: int) -> str:
    """SQL: :func:`receipt_messages` → ``RECEIPTS_TABLE`` rows (what was answered, when, with which message)."""
    return f"""SELECT receipt_for AS smuid, publisher, mode, acked, targeted, smuid AS receipt_smuid,
       timestamp_micros(accepted_at) AS receipted_at, {sql_literal(batch_id)} AS batch_id
FROM {receipts}"""


def receipt_message_rows_sql(receipts: str, batch_id: int) -> str:
    """SQL: :func:`receipt_messages` → ``MESSAGES_TABLE`` rows (a receipt is a message of record too)."""
    return f"""SELECT smuid, topic, cmuid, publisher, publisher_guid, priority, headers, sections,
       timestamp_micros(accepted_at) AS accepted_at, CAST(NULL AS INT) AS kafka_partition,
       CAST(NULL AS BIGINT) AS kafka_offset, {sql_literal(batch_id)} AS batch_id,
       CAST(NULL AS TIMESTAMP) AS expires_at, receipt, delivery, depth, hops, origin, origin_topic
FROM {receipts}"""
