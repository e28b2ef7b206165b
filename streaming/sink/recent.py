"""The messages the job committed lately that will expire soon, kept in memory, so expiry finds
them without reading the ``messages`` table.

Why: a batch in which deliveries expire needs their messages (topic, headers, sections: the Trash
rows).  Read from Delta, that cost ~100 ms a batch at 1,000 msg/s three minutes into a run
(py-spy: 13 % of the sink, delta-rs building a dataset over every file of the table), and more as
the table grows.  The job wrote those rows itself moments before: it keeps the rows of messages
whose Timeout is at most :data:`HORIZON_US`, until :data:`GRACE_US` after they expire, and reads
only the others from Delta (:meth:`streaming.sink.reads.StoredReads.stored_messages`).

Only committed rows are kept (the sink calls :meth:`RecentMessages.keep` after the ``messages``
commit), so what this holds always equals the table; a restarted job starts empty and reads them.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

#: Messages expiring at most this long after their acceptance are kept (µs): short Timeouts, whose
#: expiry comes while the job still remembers them.
HORIZON_US = 60_000_000

#: A kept message is forgotten this long after it expired (µs), by the newest acceptance time kept:
#: the expiry a batch finds comes within a tick or two of it.
GRACE_US = 30_000_000


class RecentMessages:
    """Committed ``messages`` rows (any columns holding ``smuid``, ``accepted_at`` and ``expires_at``)
    of messages that expire soon, in the batches they came in."""

    def __init__(self, horizon_us: int = HORIZON_US, grace_us: int = GRACE_US):
        self.horizon_us = horizon_us
        self.grace_us = grace_us
        self._batches: list[tuple[int, pa.Table]] = []  # (the latest expiry among them, rows)

    def keep(self, rows: pa.Table) -> None:
        """Keep the rows of a committed batch whose message expires within the horizon of its
        acceptance, and forget those that expired a grace ago (by the batch's newest acceptance)."""
        if not rows.num_rows:
            return
        expires = rows.column("expires_at").cast(pa.int64())
        accepted = rows.column("accepted_at").cast(pa.int64())
        soon = pc.fill_null(pc.less_equal(pc.subtract(expires, accepted), self.horizon_us), False)
        kept = rows.filter(soon)
        if kept.num_rows:
            self._batches.append((pc.max(kept.column("expires_at").cast(pa.int64())).as_py(), kept))
        clock = pc.max(accepted).as_py()
        if clock is not None:
            self._batches = [(latest, table) for latest, table in self._batches if latest >= clock - self.grace_us]

    def take(self, smuids: list[int]) -> pa.Table | None:
        """The kept rows of ``smuids``, one per message (None: nothing kept yet)."""
        if not self._batches:
            return None
        wanted = pa.array(smuids, pa.int64())
        found = pa.concat_tables([table.filter(pc.is_in(table.column("smuid"), wanted))
                                  for _, table in self._batches])
        first: dict[int, int] = {}  # smuid → its first row (a replayed commit keeps its rows again)
        for row, smuid in enumerate(found.column("smuid").to_pylist()):
            first.setdefault(smuid, row)
        return found.take(pa.array(list(first.values()), pa.int64()))

    def __len__(self) -> int:
        return sum(table.num_rows for _, table in self._batches)
