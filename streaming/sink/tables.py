"""The job's Delta tables, opened once and kept up to date, and the batch each last committed: the app
transactions that make a replayed batch write nothing twice.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Schema, Transaction

from schemas.spark import TABLES, TABLE_PROPERTIES, arrow_schema


class DeltaTables:
    """The Delta tables, open (``_tables``, set up by the host), and the app transactions of this query.

    A mixin of :class:`streaming.sink.command_sink.CommandSink`: it uses the sink's ``config`` (where
    the tables are) and ``query_name`` (the app-transaction ids), and keeps ``_versions`` (set up by the
    host: :meth:`committed_version`).
    """

    def app_id(self, table: str) -> str:
        """The Delta app-transaction id for ``table``: ``"<query name>:<table>"``."""
        return f"{self.query_name}:{table}"

    def committed_version(self, table: str) -> int | None:
        """The last batch id committed to ``table`` by this query (None: never).

        Read from the table once, then kept as this sink's own commits move it (:meth:`_committing`):
        delta-rs reads it from the log's actions each time it is asked (1-3 ms, five times a batch),
        and only this query writes its app transactions.  A batch that fails forgets what was kept
        (:meth:`forget_versions`): a commit that raised may have landed all the same."""
        if table not in self._versions:
            if not self._exists(table):
                return None
            self._versions[table] = self._table(table).transaction_version(self.app_id(table))
        return self._versions[table]

    @contextmanager
    def _committing(self, table: str, batch_id: int) -> Iterator[CommitProperties]:
        """The commit properties of ``batch_id``'s commit to ``table`` (its app transaction), for the
        ``with`` block that commits; once the block ends without an error, ``table`` holds ``batch_id``."""
        yield CommitProperties(app_transactions=[Transaction(self.app_id(table), batch_id)])
        self._versions[table] = batch_id

    def last_committed_batch(self) -> int | None:
        """The newest batch id this query committed to any of its tables (None: none yet): what the
        checkpoint it runs on must have reached (:func:`streaming.job.ensure_checkpoint_wrote_tables`)."""
        versions = [version for name in TABLES if (version := self.committed_version(name)) is not None]
        return max(versions, default=None)

    def forget_versions(self) -> None:
        """Ask each table again for the batch it last committed (after a batch failed)."""
        self._versions.clear()

    def _exists(self, name: str) -> bool:
        return name in self._tables or DeltaTable.is_deltatable(self.config.table_path(name))

    def _done(self, table: str, batch_id: int) -> bool:
        version = self.committed_version(table)
        return version is not None and version >= batch_id

    def _table(self, name: str) -> DeltaTable:
        """Table ``name`` at its latest version: opened once (:meth:`_open`) and kept open.

        Why kept open: a batch reads or commits a dozen times, and opening a table reads its last
        checkpoint and the log after it (measured with delta-rs 1.6: 12 ms; a commit and a fresh
        open 39 ms against 8).  Nor is it brought up to date before each use: the sink is these
        tables' one writer, and delta-rs moves an open table to the version each of its own commits
        made.  Asking the log for newer commits anyway cost ~5 ms a use, ~70 ms a batch at 1,000 msg/s
        (py-spy).  So the job's other writers of these tables (the Trash sweep, the compaction) write
        through them too (:meth:`_existing`); a commit of the sink's on a table another process
        changed still lands, on top of that change, as Delta's optimistic concurrency resolves it."""
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = self._open(name)
        return table

    def _existing(self, name: str) -> DeltaTable | None:
        """Table ``name`` open (:meth:`_table`), or None while it does not exist."""
        return self._table(name) if self._exists(name) else None

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
        return None if self._done(name, batch_id) else self._table(name)
