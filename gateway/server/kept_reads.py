"""The reads of a Delta table's version that a gateway keeps, for the polls that repeat them.

Clients poll: ``GET MESSAGE`` until a message is visible, ``LIST MESSAGE …/Trash`` until it dies,
``COUNT`` for a dashboard.  The job commits a few times a second, the clients poll more often, and
between two commits every poll read the same files again and got the same rows.  A read's result
is immutable (a pyarrow table) and belongs to one version of one table, so it is kept until the
table moves on, within a bound in bytes (``[gateway] kept_read_bytes``, 32 MiB by default): a read
larger than the whole bound is never kept.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable

import pyarrow as pa


class KeptReads:
    """The latest reads of each table at its latest version, least recently used dropped first.

    Not thread-safe: its owner (:class:`gateway.server.message_store.MessageStore`) calls it with
    its lock held.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._reads: OrderedDict[tuple, pa.Table] = OrderedDict()
        self._versions: dict[str, int] = {}  # table URI → the version its kept reads are of
        self._bytes = 0

    def read(self, uri: str, version: int, what: Hashable, read: Callable[[], pa.Table]) -> pa.Table:
        """``read()``, the read ``what`` of table ``uri`` at ``version``, or what it returned before."""
        if self._versions.get(uri) != version:
            self._forget(uri)
            self._versions[uri] = version
        key = (uri, what)
        rows = self._reads.get(key)
        if rows is not None:
            self._reads.move_to_end(key)
            return rows
        rows = read()
        if 0 < self.max_bytes and rows.nbytes <= self.max_bytes:
            self._reads[key] = rows
            self._bytes += rows.nbytes
            while self._bytes > self.max_bytes:
                self._bytes -= self._reads.popitem(last=False)[1].nbytes
        return rows

    def _forget(self, uri: str) -> None:
        """Drop the reads of ``uri``'s older version: no later read can want them."""
        for key in [key for key in self._reads if key[0] == uri]:
            self._bytes -= self._reads.pop(key).nbytes
