"""A batch's Delta commits: each table merged or appended idempotently for its batch id, in the order
a replay relies on (:meth:`DeltaCommits.commit_outputs`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from delta_edge import rows_within
from schemas.spark import DELIVERIES_TABLE, TABLES, arrow_schema


def _smuid_range(rows: pa.Table) -> tuple[int, int]:
    """The lowest and highest SMUID of ``rows``: the bounds that let a read or a merge skip every file
    whose SMUID range lies outside them."""
    bounds = pc.min_max(rows.column("smuid"))
    return int(bounds["min"].as_py()), int(bounds["max"].as_py())


def _holds_any(table: DeltaTable, rows: pa.Table) -> bool:
    """Whether ``table`` holds a row of the ``(account, smuid)`` of any of ``rows``: read from the few
    files whose SMUID range may (``delta_edge.rows_within``).
    A null account is the whole message's, as ``''`` is (older Trash rows).

    Why: a batch's new deliveries and Trash rows are mostly of messages it brought or that die in it,
    which no row can match; then appending them is what merging does, at a third of its cost (on a
    50-file table: 23 ms against 71; a quiet batch spent 91 ms p50 in all its commits).  But a new
    delivery may find its key stored: a DELIVERY ONE message handed back to a subscriber that held it
    (``released`` there), or one that waits again (``unrouted``); then only the merge keeps it one row."""
    low, high = _smuid_range(rows)
    stored = rows_within(table, ["account", "smuid"], [("smuid", ">=", low), ("smuid", "<=", high)])
    if not stored.num_rows:
        return False
    keys = set(zip((account or "" for account in stored.column("account").to_pylist()),
                   stored.column("smuid").to_pylist()))
    return any(key in keys for key in zip((account or "" for account in rows.column("account").to_pylist()),
                                          rows.column("smuid").to_pylist()))


def _fresh(arrow: pa.Table, own: pa.ChunkedArray, batch_id: int) -> pa.ChunkedArray:
    """Which of a batch's deliveries rows are new ones of its own publishes (SMUIDs ``own``), routed in
    it.  A message is first routed in the batch that brings its publish, so no stored row has their
    keys (but those a failed attempt at the same batch appended: :meth:`DeltaCommits.undo_fresh_deliveries`),
    and appending them is what the merge's insert would do.

    Why apart from the merge: delta-rs rewrites each file a merge matches a row in, and writes the
    rows it inserts into the same new file.  Each batch ACKs the last one's deliveries, so with its
    new rows merged the file it rewrote held every delivery ever routed, and every batch copied them
    all: ``python -m deploy.sink_bench --expiring`` took 31 ms a merge at 5,600 rows and 109 ms at
    81,000, growing with the history.  Appended, a batch's new rows make a file of their own, which
    the next batch's ACKs rewrite alone."""
    fresh = pc.and_kleene(pc.and_kleene(arrow.column("is_new"), pc.is_in(arrow.column("smuid"), own)),
                          pc.equal(arrow.column("routed_batch_id"), batch_id))
    return pc.fill_null(fresh, False)  # a settled row has no ``routed_batch_id``


#: The ``deliveries`` merge's update clauses, in their order: the source statuses that can fire each
#: (its predicate asks for one of them), its updates, its predicate.  A batch's merge takes only those
#: its rows' statuses can fire, and the insert only when a row is new: the same rows change, and
#: delta-rs plans less (a merge of 400 ACKs into a 50-file table, 21-23 ms with one clause against
#: 30 with nine and the insert: ``bench-results/deliveries-apart-2026-12-07/clauses.py``).
_DELIVERY_UPDATES: tuple[tuple[frozenset[str], dict[str, str], str], ...] = (
    (frozenset({"acked"}), {"status": "s.status", "acked_at": "s.acked_at", "acked_guid": "s.acked_guid"},
     "s.status = 'acked' AND t.status NOT IN ('acked', 'expired', 'trashed', 'released')"),
    (frozenset({"expired"}), {"status": "s.status"},
     "s.status = 'expired' AND t.status IN ('pending', 'unrouted', 'waiting')"),
    (frozenset({"trashed"}), {"status": "s.status", "retries": "s.retries"},
     "s.status = 'trashed' AND t.status = 'pending'"),
    (frozenset({"retry"}), {"retries": "s.retries"},
     "s.status = 'retry' AND t.status = 'pending'"),
    # handed on (DELIVERY ONE), or cleared by a new SINCE
    (frozenset({"released", "cleared"}), {"status": "s.status"},
     "s.status IN ('released', 'cleared') AND t.status = 'pending'"),
    # an ``unrouted`` row: a late subscriber took it, or its topic was removed; a ``waiting`` one: a
    # subscriber had room for it
    (frozenset({"routed", "trashed"}), {"status": "s.status"},
     "NOT s.is_new AND ((s.status IN ('routed', 'trashed') AND t.status IN ('unrouted', 'waiting')) "
     "OR (s.status = 'trashed' AND t.status = 'removed'))"),
    # a DELIVERY ONE message handed on, and nobody has room for it now
    (frozenset({"waiting"}), {"status": "s.status"},
     "s.is_new AND s.status = 'waiting' AND t.status IN ('unrouted', 'routed')"),
    # a message a late subscriber took from ``unrouted`` outlives its topic
    (frozenset({"removed"}), {"status": "s.status"},
     "s.is_new AND s.status = 'removed' AND t.status = 'routed'"),
    # a DELIVERY ONE message handed back to a subscriber that held it before
    (frozenset({"pending"}), {"status": "s.status", "routed_at": "s.routed_at", "routed_batch_id": "s.routed_batch_id",
                              "retries": "s.retries"},
     "s.is_new AND s.status = 'pending' AND t.status = 'released'"),
)


def _to_table(arrow: pa.Table, name: str) -> pa.Table:
    """Spark's Arrow output, cast to the table's declared Arrow schema."""
    schema = arrow_schema(TABLES[name])
    return arrow.select(schema.names).cast(schema)


class DeltaCommits:
    """The Delta commits of a batch's outputs (:meth:`commit_outputs`).

    A mixin of :class:`streaming.sink.command_sink.CommandSink`: it commits through
    :class:`~streaming.sink.tables.DeltaTables` and tells
    :meth:`~streaming.sink.reads.StoredReads._note_removed` and ``recent``
    (:class:`~streaming.sink.recent.RecentMessages`) what it committed.
    """

    def commit_outputs(self, out: dict[str, pa.Table], batch_id: int) -> None:
        """Commit the Delta outputs of :meth:`outputs`, each table idempotently for ``batch_id``,
        ``subscriptions`` last (see :mod:`streaming.sink.command_sink`); a table no order binds is
        committed beside the others (:meth:`_beside`)."""
        deliveries = out["deliveries"]
        nobody = pc.equal(deliveries.column("account"), "")
        # ``messages`` rows are the batch's publishes whatever is stored, so no replay depends on when
        # they land.  The Trash goes before deliveries, so that a replay still sees what expired; it is
        # also what an expiry waits to show (LIST <topic>/Trash).  A message that dies in the batch it
        # came in may be listed there before its ``messages`` row is in (its GUID blank till then)
        own = out["messages"].column("smuid")
        messages = self._beside(lambda: self._commit_messages(out["messages"], batch_id),
                                lambda: self._commit_trash(out["trash"], batch_id),
                                lambda: self._commit_deliveries(deliveries.filter(pc.invert(nobody)), batch_id, own))
        self.recent.keep(messages)
        # after deliveries: a replay that finds this batch's deliveries committed takes DELIVERY ONE's
        # holders from them (:meth:`limit_in_flight`) and still owes the waiting rows that go with them;
        # and it makes the same receipts
        self._beside(lambda: self._commit_receipts(out["receipts"], batch_id),
                     lambda: self._commit_deliveries(deliveries.filter(nobody), batch_id, own, "unrouted"))
        self.lower_expiry_floor(deliveries)
        self._commit_subscriptions(out["subscriptions"], batch_id)
        self._note_removed(out)

    def _beside(self, apart: Callable[[], object], *in_order: Callable[[], object]) -> object:
        """Run the commit ``apart`` in :meth:`commit_pool`'s thread while this one runs the commits
        ``in_order``, one after the other; ``apart``'s result once all have ended, else the first error,
        raised only then, so that a failed batch's replay never runs beside a commit of it still landing.

        Why: delta-rs commits outside the GIL.  A batch of 200 publishes, their ACKs and an expiry
        committed in p50 85-94 ms one table after the other, 74-75 ms with ``messages`` beside
        (``python -m deploy.sink_bench --expiring``, three alternating pairs, idle host;
        ``bench-results/commits-beside-2026-12-07/``)."""
        future = self.commit_pool().submit(apart)
        try:
            for commit in in_order:
                commit()
        finally:
            wait([future])
        return future.result()

    def commit_pool(self) -> ThreadPoolExecutor:
        """The thread a commit runs in beside the batch thread's (:meth:`_beside`), started on first use."""
        if self._commit_pool is None:
            self._commit_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.query_name}-commit")
        return self._commit_pool

    def close_commit_pool(self) -> None:
        if self._commit_pool is not None:
            self._commit_pool.shutdown()
            self._commit_pool = None

    def undo_fresh_deliveries(self, batch_id: int, published: list[int]) -> None:
        """Remove the rows a failed attempt at ``batch_id`` appended (:func:`_fresh`: new deliveries of
        its publishes, SMUIDs ``published``) when its deliveries merge did not land, so that its replay
        reads the tables as they were before it.  Run before a batch that follows a start or a failure."""
        if not published:
            return
        listed = ", ".join(str(int(smuid)) for smuid in published)
        for name in ("deliveries", "unrouted"):
            if self._exists(name) and not self._done(name, batch_id):
                self._table(name).delete(f"routed_batch_id = {int(batch_id)} AND smuid IN ({listed})")

    def _appended_unless_held(self, table: DeltaTable, rows: pa.Table, name: str, batch_id: int) -> bool:
        """Append ``rows`` to ``table`` when it holds none of their ``(account, smuid)`` keys
        (:func:`_holds_any`): what inserting them by a merge would do, at a third of its cost.  False,
        and nothing written, when it holds one."""
        if _holds_any(table, rows):
            return False
        self._append(table, rows, name, batch_id)
        return True

    def _append(self, table: DeltaTable, rows: pa.Table, name: str, batch_id: int) -> None:
        """Append ``rows`` to ``table`` as the commit of ``batch_id`` (its app transaction)."""
        with self._committing(name, batch_id) as txn:
            write_deltalake(table, rows, mode="append", commit_properties=txn)

    def _commit_messages(self, arrow: pa.Table, batch_id: int) -> pa.Table:
        """Append the batch's messages; returns them as the table holds them now."""
        rows = _to_table(arrow, "messages")
        if rows.num_rows and (table := self._uncommitted("messages", batch_id)) is not None:
            self._append(table, rows, "messages", batch_id)
        return rows

    def _commit_deliveries(self, arrow: pa.Table, batch_id: int, own: pa.ChunkedArray,
                           name: str = "deliveries") -> None:
        """Merge into ``deliveries`` (or ``unrouted``: the rows of account ``''``, same columns); the new
        rows of the batch's own publishes (SMUIDs ``own``) appended first, apart (:func:`_fresh`)."""
        if not arrow.num_rows or (table := self._uncommitted(name, batch_id)) is None:
            return
        rows = _to_table(arrow, name)
        fresh = _fresh(arrow, own, batch_id)
        if pc.all(fresh).as_py():  # a batch of publishes alone: no stored row can have their keys
            self._append(table, rows, name, batch_id)
            return
        if pc.all(arrow.column("is_new")).as_py() and self._appended_unless_held(table, rows, name, batch_id):
            return
        if pc.any(fresh).as_py():
            # no app transaction: the merge below carries the batch's; a batch that fails between the
            # two leaves these rows, which its replay removes first (:meth:`undo_fresh_deliveries`)
            write_deltalake(table, rows.filter(fresh), mode="append")
            stale = pc.invert(fresh)
            arrow, rows = arrow.filter(stale), rows.filter(stale)
        low, high = _smuid_range(rows)
        source = rows.append_column("is_new", arrow.column("is_new"))
        statuses = set(pc.unique(source.column("status")).to_pylist())
        with self._committing(name, batch_id) as txn:
            merge = table.merge(
                source,
                predicate=(f"t.account = s.account AND t.smuid = s.smuid "
                           f"AND t.smuid >= {int(low)} AND t.smuid <= {int(high)}"),
                source_alias="s", target_alias="t",
                commit_properties=txn,
            )
            clauses = [clause for clause in _DELIVERY_UPDATES if clause[0] & statuses] or _DELIVERY_UPDATES
            for _, updates, predicate in clauses:  # (none fires: all, so the merge still commits the batch)
                merge = merge.when_matched_update(updates=updates, predicate=predicate)
            if pc.any(source.column("is_new")).as_py():
                columns = DELIVERIES_TABLE.fieldNames()
                merge = merge.when_not_matched_insert(updates={c: f"s.{c}" for c in columns}, predicate="s.is_new")
            merge.execute()

    def _commit_trash(self, arrow: pa.Table, batch_id: int) -> None:
        """Insert the batch's Trash rows; a message already in the Trash (for the whole message,
        account '', or for one subscriber) is never added again."""
        rows = _to_table(arrow, "trash")
        if not rows.num_rows or (table := self._uncommitted("trash", batch_id)) is None:
            return
        if self._appended_unless_held(table, rows, "trash", batch_id):
            return
        low, high = _smuid_range(rows)
        with self._committing("trash", batch_id) as txn:
            (
                table.merge(
                    rows, predicate=(f"t.smuid = s.smuid AND coalesce(t.account, '') = s.account "
                                     f"AND t.smuid >= {int(low)} AND t.smuid <= {int(high)}"),
                    source_alias="s", target_alias="t",
                    commit_properties=txn,
                )
                .when_not_matched_insert_all()
                .execute()
            )

    def _commit_receipts(self, arrow: pa.Table, batch_id: int) -> None:
        """Record the receipts sent: a message is answered once, ever."""
        rows = _to_table(arrow, "receipts")
        if not rows.num_rows or (table := self._uncommitted("receipts", batch_id)) is None:
            return
        low, high = _smuid_range(rows)  # so that the merge reads only the files that may hold them
        with self._committing("receipts", batch_id) as txn:
            (
                table.merge(rows, predicate=f"t.smuid = s.smuid AND t.smuid >= {low} AND t.smuid <= {high}",
                            source_alias="s", target_alias="t", commit_properties=txn)
                .when_not_matched_insert_all()
                .execute()
            )

    def _commit_subscriptions(self, arrow: pa.Table, batch_id: int) -> None:
        rows = _to_table(arrow, "subscriptions")
        if not rows.num_rows:
            return
        with self._committing("subscriptions", batch_id) as txn:
            (
                self._table("subscriptions").merge(
                    rows, predicate="t.account = s.account AND t.pattern = s.pattern",
                    source_alias="s", target_alias="t",
                    commit_properties=txn,
                )
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
