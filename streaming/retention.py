"""Emptying the Trash: the ``trash`` table keeps a message for ``streaming.trash_retention``.

Spec 2.2.1: "Messages in the Trash queue will remain there until the server
periodically empties the messages in a particular topic's trash or all the
topics trash."  Here every topic's Trash is emptied alike: a row whose
``trashed_at`` is older than the retention is deleted with delta-rs
(``DeltaTable.delete``, which rewrites only the files holding such rows and
commits nothing when there are none).  Deleted rows stay readable through
time travel (``smqp-sql --as-of``) until the table is vacuumed.

The sweep runs inside the streaming job's own foreachBatch thread, between
two batches' commits, on the sink's open ``trash`` table (:class:`streaming.sink.CommandSink` calls a
:class:`TrashSweeper` with each batch's clock): the sink merges into
``trash`` every batch, and a second writer would race those merges.  Its
clock is the batch's *now* (:func:`streaming.sink.records.batch_now`), never the
wall clock, like expiry itself (README, "Time in the stream").
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Callable

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from schemas.config import SMQPConfig
from schemas.timefmt import format_date_time, parse_timeout

log = logging.getLogger(__name__)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def delete_trashed_before(table: DeltaTable | str | None, cutoff: int) -> int:
    """Delete the rows of the ``trash`` table (open, or at a path; None or no table there: nothing)
    trashed before ``cutoff`` (microseconds since the epoch, UTC); return how many were removed (0,
    and no commit, when none was)."""
    if isinstance(table, str):
        table = DeltaTable(table) if DeltaTable.is_deltatable(table) else None
    if table is None:
        return 0
    # Typed as the column is (UTC microseconds): delta-rs refuses to compare it with a zone-less timestamp.
    predicate = f"trashed_at < arrow_cast({int(cutoff)}, 'Timestamp(Microsecond, Some(\"UTC\"))')"
    return int(table.delete(predicate)["num_deleted_rows"])


def retention_micros(text: str) -> int | None:
    """``trash_retention`` (the spec's timeout format) in microseconds; None: keep forever."""
    try:
        retention = parse_timeout(text)
    except ValueError as error:
        raise ValueError(f"[streaming] trash_retention: {error}") from None
    return None if retention is None else retention // timedelta(microseconds=1)


class TrashSweeper:
    """``sweeper(now)``: empty the Trash of what is older than the retention, at most once every
    ``streaming.trash_sweep_interval_s`` of the batches' clock ``now`` (microseconds; None: a
    batch without a clock, skipped).  Returns the rows removed.

    A sweep that fails (the disk, a conflicting writer) is logged and tried again one interval
    later: keeping old Trash a little longer must never stop the routing.
    """

    def __init__(self, config: SMQPConfig, table: Callable[[], DeltaTable | None] | None = None):
        self.path = config.table_path("trash")
        # the sink's own open table, which the delete then moves along (by default the table at the path)
        self.table: Callable[[], DeltaTable | str | None] = table or (lambda: self.path)
        self.retention = retention_micros(config.streaming.trash_retention)
        self.interval = int(config.streaming.trash_sweep_interval_s * 1_000_000)
        self.last: int | None = None  # the clock of the last sweep

    def due(self, now: int | None) -> bool:
        """A sweep is due at ``now``: a retention, a clock, and an interval since the last one."""
        return (self.retention is not None and now is not None
                and (self.last is None or now - self.last >= self.interval))

    def __call__(self, now: int | None) -> int:
        if not self.due(now):
            return 0
        self.last = now
        cutoff = now - self.retention
        try:
            removed = delete_trashed_before(self.table(), cutoff)
        except (DeltaError, OSError):
            log.exception("trash retention: sweep failed; next try in %d s", self.interval // 1_000_000)
            return 0
        if removed:
            log.info("trash retention: removed %d message(s) trashed before %s", removed,
                     format_date_time(_EPOCH + timedelta(microseconds=cutoff)))
        return removed

