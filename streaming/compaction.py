"""Compacting the job's Delta tables: the small files its micro-batches write, joined into few.

Why: each batch appends a file to ``messages`` and its merges write new files into ``deliveries``,
``unrouted`` and ``trash``: some 3,600 files an hour per table at a batch a second.  Every read and
merge of a batch looks at every file (delta-rs makes a fragment of each and checks its statistics),
so without compaction a batch grows slower the longer the job runs.

:class:`TableCompactor` compacts them every ``streaming.compact_interval_s`` of the batches' clock,
and a table as soon as it has ``streaming.compact_files`` files more than after its last compaction:
one table a batch at most, the interval's too, so that no one batch pays for them all.  The
interval alone let a table grow by 300 files between two compactions, and a gateway's whole-topic
read (LIST MESSAGE, COUNT) opens every file: a Trash of 150 one-row files took 335 ms to list, 10 ms
compacted.

Like the Trash sweep it runs in the foreachBatch thread, between two batches' commits: that thread
is the one writer of these tables, and a compaction beside one of its merges would conflict with it.
delta-rs' ``optimize.compact`` packs the files smaller than ``compact_target_mb`` into bins of up to
that size, in their order (so the SMUID ranges reads prune by stay narrow), and rewrites each bin
that holds two files or more as one.  A compacted file is packed again with the new small ones until
it reaches the target, so one compaction rewrites at most about that much of a table.  The files it
replaced stay readable through time travel until the table is vacuumed.

A table compacted for its file count packs only the files under ``streaming.compact_step_mb`` (1):
with the whole target, each such compaction, one in fifty batches at any load, copied again
everything the table had gained since the last interval (at 1,000 msg/s ``messages`` took 74 ms,
then 177 ms two minutes on, and ``deploy.sink_bench``'s 601st-800th batches up to 604 ms).  The
interval's compaction packs those files up to ``compact_target_mb``, once every five minutes.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from schemas.config import SMQPConfig

log = logging.getLogger(__name__)

#: The tables the job's sink writes, and so compacts (``metrics`` has a writer of its own).
SINK_TABLES = ("messages", "deliveries", "unrouted", "trash", "receipts", "subscriptions")


class TableCompactor:
    """``compactor(now)``: compact one of the sink's tables: once ``streaming.compact_interval_s`` of
    the batches' clock ``now`` (µs; None: a batch without a clock) has passed since the last time,
    each in turn, one a call (packed together in one batch, ``messages``, ``unrouted`` and
    ``deliveries`` took 214-237 ms of a ``deploy.sink_bench`` batch); else the one table with the
    most files beyond ``streaming.compact_files`` more than it had after its last compaction.
    Returns the files the compacted table lost.  ``table(name)``: the table, open and up to date (the
    sink's own, :meth:`streaming.sink.tables.DeltaTables._table`), or None when it does not exist yet.

    A compaction that fails (the disk, a writer it conflicts with) is logged and tried again later:
    small files only slow the job down, they must never stop it.
    """

    def __init__(self, config: SMQPConfig, table: Callable[[str], DeltaTable | None]):
        self.interval = int(config.streaming.compact_interval_s * 1_000_000)
        self.files = config.streaming.compact_files
        self.target_bytes = config.streaming.compact_target_mb << 20
        self.step_bytes = int(config.streaming.compact_step_mb * (1 << 20))
        self.table = table
        self.last: int | None = None  # the clock of the last compaction by the interval (or of the first batch)
        self.compacted_to: dict[str, int] = {}  # table → its files after its last compaction or try (none: 0)
        self.queued: list[str] = []  # the tables the interval's compaction has still to pack, one a batch

    def due(self, now: int | None) -> bool:
        """An interval has passed at ``now`` since the last compaction, or since the first batch seen."""
        if self.interval <= 0 or now is None:
            return False
        if self.last is None:
            self.last = now
        return now - self.last >= self.interval

    def crowded(self) -> str | None:
        """The table with the most files gained since its last compaction, if at least ``compact_files``."""
        if self.files <= 0:
            return None
        gained = {}
        for name in SINK_TABLES:
            table = self.table(name)
            if table is not None:
                gained[name] = len(table.file_uris()) - self.compacted_to.get(name, 0)
        name = max(gained, key=gained.get, default=None)
        return name if name is not None and gained[name] >= self.files else None

    def __call__(self, now: int | None) -> dict[str, int]:
        if self.due(now):
            self.last = now
            self.queued = list(SINK_TABLES)
        while self.queued and self.table(self.queued[0]) is None:
            self.queued.pop(0)
        if self.queued:
            name, target = self.queued.pop(0), self.target_bytes
        elif (name := self.crowded()) is not None:
            target = self.step_bytes
        else:
            return {}
        lost = self._compact(name, target)
        return {name: lost} if lost else {}

    def _compact(self, name: str, target: int) -> int:
        """Compact table ``name`` (one that exists: :meth:`__call__` picks no other), packing its files
        under ``target`` bytes; the files it lost."""
        started, table = time.monotonic(), None
        try:
            table = self.table(name)
            metrics = table.optimize.compact(target_size=target)
        except (DeltaError, OSError):
            log.exception("compaction of %s failed; tried again at the next interval or %d files on",
                          name, self.files)
            return 0
        finally:
            if table is not None:  # counted from here, done or not: a failure is not retried at every batch
                self.compacted_to[name] = len(table.file_uris())
        if metrics["numFilesRemoved"]:
            log.info("compacted %s: %d files into %d in %d ms", name, metrics["numFilesRemoved"],
                     metrics["numFilesAdded"], (time.monotonic() - started) * 1000)
        return metrics["numFilesRemoved"]
