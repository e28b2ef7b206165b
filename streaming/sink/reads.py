"""What a batch reads from the Delta tables before routing: the stored deliveries, messages and
subscriptions its commands concern, each query pruned to the few files that can hold them.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import DataFrame, SparkSession

from delta_edge import rows_within
from schemas.spark import SUBSCRIPTIONS_TABLE, arrow_schema
from streaming.routing.frames import CLEARABLE, HELD, ORPHANED, PENDING, RECEIPT_STATE, RETRYING
from streaming.sink.query import OUTPUTS, RECEIPTED, STORED, STORED_COLUMNS
from streaming.sink.records import acked_smuids, distinct_fields, events_of


def _with_columns(arrow: pa.Table, schema: pa.Schema) -> pa.Table:
    """``arrow`` plus a null column for each column of ``schema`` it lacks (a table older than that column)."""
    for field in schema:
        if field.name not in arrow.column_names:
            arrow = arrow.append_column(field, pa.nulls(arrow.num_rows, field.type))
    return arrow


#: The statuses of a delivery that expire at its message's ``expires_at`` (``unrouted``: nobody got it yet;
#: ``waiting``: a DELIVERY ONE message waiting for a subscriber with room).
EXPIRING = ("pending", "unrouted", "waiting")
_MAY_EXPIRE = "status IN ({})".format(", ".join(f"'{status}'" for status in EXPIRING))

#: A floor past any time: no stored row may expire.
_NEVER = 1 << 62


def _next_expiry(query: QueryBuilder, now: int) -> int:
    """The earliest ``expires_at`` (µs) after ``now`` of a row of ``query``'s tables that may expire."""
    after = f"WHERE {_MAY_EXPIRE} AND expires_at > to_timestamp_micros({int(now)})"
    earliest = pa.table(query.execute(
        f"SELECT min(at) AS at FROM (SELECT CAST(expires_at AS BIGINT) AS at FROM deliveries {after} "
        f"UNION ALL SELECT CAST(expires_at AS BIGINT) AS at FROM unrouted {after})")).column("at")[0].as_py()
    return _NEVER if earliest is None else earliest


def _sql_string(text: str) -> str:
    """``text`` as a SQL string literal (for the delta-rs queries)."""
    return "'" + text.replace("'", "''") + "'"


class StoredReads:
    """The reads of stored state a batch's routing needs, and the cache of messages held past their
    topic's removal.

    A mixin of :class:`streaming.sink.command_sink.CommandSink`: it reads through
    :class:`~streaming.sink.tables.DeltaTables` and keeps ``_removed_held``, ``_active`` and
    ``_expiry_floor`` (set up by the host) up to date.
    """

    def active_subscriptions(self) -> pa.Table:
        """Active rows of the ``subscriptions`` Delta table.

        Kept per table version (``_active``): a batch asks up to twice, and most batches change no
        subscription, while each read of the table's files took ~5 ms.  The sink is the table's one
        writer, and its open table moves with each of its commits (:meth:`_table`)."""
        schema = arrow_schema(SUBSCRIPTIONS_TABLE)
        if not self._exists("subscriptions"):
            return schema.empty_table()
        table = self._table("subscriptions")
        version = table.version()
        if self._active is None or self._active[0] != version:
            arrow = table.to_pyarrow_table(filters=[("active", "=", True)])
            self._active = (version, _with_columns(arrow, schema).select(schema.names).cast(schema))
        return self._active[1]

    def current_subscriptions(self, spark: SparkSession) -> DataFrame:
        """Active rows of the ``subscriptions`` Delta table, as a Spark frame."""
        return spark.createDataFrame(self.active_subscriptions(), schema=SUBSCRIPTIONS_TABLE)

    def expiry_candidates(self, now: int | None, deliveries: DeltaTable | None = None) -> pa.Table:
        """Stored deliveries (:data:`streaming.routing.PENDING`) still ``pending`` (``deliveries``) or ``unrouted``
        or ``waiting`` (the ``unrouted`` table) whose message expires at or before ``now``.

        Reads only those rows: delta-rs prunes files by their ``status`` and
        ``expires_at`` statistics, so rows already settled and messages that
        expire later mostly cost nothing.  And reads nothing while ``now`` is before the
        earliest time a stored row may expire, asked of the tables with the last read that found
        none and brought forward by each commit (:meth:`lower_expiry_floor`).  ``deliveries``: the
        table, when the batch opened it already.
        """
        schema = arrow_schema(PENDING)
        if now is None or (self._expiry_floor is not None and now < self._expiry_floor):
            return schema.empty_table()
        # delta-rs' own engine (DataFusion): merges write string_view columns, which pyarrow's
        # dataset filters cannot compare with the table's string statistics.
        query = (QueryBuilder().register("deliveries", deliveries or self._table("deliveries"))
                 .register("unrouted", self._table("unrouted")))
        columns = ", ".join(schema.names)
        where = f"WHERE {_MAY_EXPIRE} AND expires_at <= to_timestamp_micros({int(now)})"
        rows = pa.table(query.execute(f"SELECT {columns} FROM deliveries {where} "
                                      f"UNION ALL SELECT {columns} FROM unrouted {where}")).cast(schema)
        # none expires before the next of the others, unless this batch expires these (then ask again)
        self._expiry_floor = None if rows.num_rows else _next_expiry(query, now)
        return rows

    def lower_expiry_floor(self, deliveries: pa.Table) -> None:
        """Take into :meth:`expiry_candidates`' floor the expiry of the rows a batch committed
        (``deliveries`` and ``unrouted`` rows) that may expire: new ones, or one waiting again.

        Why a floor: asking both tables for what expires took ~9 % of a quiet batch (py-spy), and
        mostly found nothing.  The floor is the earliest time a stored row may expire; it holds
        while the sink is the tables' one writer, and every row it commits goes through here.  A
        row's ``expires_at`` is its message's, so a status update moves it no earlier."""
        if self._expiry_floor is None:
            return
        may = deliveries.filter(pc.fill_null(pc.is_in(deliveries.column("status"), pa.array(EXPIRING)), False))
        earliest = pc.min(may.column("expires_at").cast(pa.int64())).as_py() if may.num_rows else None
        if earliest is not None:
            self._expiry_floor = min(self._expiry_floor, earliest)

    def forget_expiry_floor(self) -> None:
        """Ask the tables again at the next batch (after a batch failed: what it committed is not known)."""
        self._expiry_floor = None

    def retry_candidates(self, deliveries: DeltaTable, keys: list[tuple[str, int]]) -> pa.Table:
        """The stored ``deliveries`` rows (:data:`streaming.routing.RETRYING`) of the messages the NACKed
        ``keys`` name, every account's (who held a DELIVERY ONE message before)."""
        schema = arrow_schema(RETRYING)
        if not keys:
            return schema.empty_table()
        smuids = ", ".join(str(int(smuid)) for smuid in sorted({smuid for _, smuid in keys}))
        reader = (QueryBuilder().register("deliveries", deliveries)
                  .execute(f"SELECT account, smuid, status, retries, delivery FROM deliveries WHERE smuid IN ({smuids})"))
        return pa.table(reader).cast(schema)

    def receipt_state(self, deliveries: DeltaTable, smuids: list[int]) -> pa.Table:
        """Every stored delivery (:data:`streaming.routing.RECEIPT_STATE`) of those of ``smuids`` that asked for
        a receipt.  delta-rs prunes by the ``receipt`` statistics: files of messages that asked for
        none (most) cost nothing."""
        schema = arrow_schema(RECEIPT_STATE)
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
        schema = arrow_schema(RECEIPTED)
        if not smuids:
            return schema.empty_table()
        return rows_within(self._table("receipts"), ["smuid"], [("smuid", "in", sorted(smuids))]).cast(schema)

    def stored_messages(self, smuids: list[int]) -> pa.Table:
        """The stored ``messages`` rows (columns :data:`STORED_COLUMNS`) of ``smuids``: those the job
        committed lately and keeps (``recent``, :class:`~streaming.sink.recent.RecentMessages`), the
        others read from the table."""
        schema = arrow_schema(STORED)
        if not smuids:
            return schema.empty_table()
        kept = self.recent.take(smuids)
        kept = schema.empty_table() if kept is None else kept.select(STORED_COLUMNS).cast(schema)
        missing = sorted(set(smuids) - set(kept.column("smuid").to_pylist()))
        if not missing:
            return kept
        arrow = rows_within(self._table("messages"), STORED_COLUMNS,
                            [("smuid", ">=", min(missing)), ("smuid", "<=", max(missing))])
        arrow = arrow.filter(pc.is_in(arrow.column("smuid"), pa.array(missing, pa.int64())))
        return pa.concat_tables([kept, arrow.cast(schema)])

    def late_candidates(self, deliveries: DeltaTable, subscribed: list[tuple[str, str]],
                        now: int | None) -> tuple[pa.Table, pa.Table]:
        """What late subscribers may get (:func:`streaming.routing.late`): the stored messages (columns
        :data:`STORED_COLUMNS`) on the topics the batch's SUBSCRIBEs (``subscribed``: (account,
        pattern)) cover that are not expired at ``now`` nor in the Trash as a whole, leaving out
        DELIVERY ONE messages somebody holds or that wait for room (:meth:`limit_in_flight`); and which of them those accounts hold already
        (:data:`streaming.routing.HELD`).  Read only for a batch with a SUBSCRIBE."""
        schema = arrow_schema(STORED)
        held_schema = arrow_schema(HELD)
        if not subscribed:
            return schema.empty_table(), held_schema.empty_table()
        matches = " OR ".join(f"starts_with(topic, {_sql_string(pattern[:-1])})" if pattern.endswith("/*")
                              else f"topic = {_sql_string(pattern)}" for pattern in sorted({p for _, p in subscribed}))
        alive = "" if now is None else f"(expires_at IS NULL OR expires_at > to_timestamp_micros({int(now)})) AND "
        candidates = f"""SELECT {", ".join(STORED_COLUMNS)} FROM messages
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
        with their message's acceptance time (:data:`streaming.routing.CLEARABLE`)."""
        schema = arrow_schema(CLEARABLE)
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
        """The stored messages (:data:`streaming.routing.ORPHANED`) of the removed ``topics`` and their
        descendants that have not expired, are not in the Trash as a whole and that nobody holds
        (no ``pending`` delivery): unrouted ones, and those kept only for late subscribers."""
        return self._removed_messages(deliveries, topics, now, held=False).select(["smuid"]).cast(
            arrow_schema(ORPHANED))

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
        acked = set(distinct_fields(events_of(records, "ack"), lambda e: (str(e["account"]), int(e["smuid"]))))
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
