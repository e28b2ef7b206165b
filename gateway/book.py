"""What each account still has to be notified of, as this gateway knows it.

Fed by the deliveries topic (``Deliver``, ``Acked``, ``Progress`` from the
job) and by this gateway's own durable ACKs.  Plain data, no I/O.

Why acknowledged-but-unconfirmed smuids are remembered: the job emits
``Deliver`` before its Delta commit, so a job restart may replay a batch and
emit a delivery the client has already acknowledged.  Until the job's
``Acked`` for it arrives (always after any replay, on the same partition),
such a delivery is ignored — this is what keeps Property 3 (never notified
again after the two-phase ACK) across job restarts.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

from schemas.events import Acked, Deliver, Progress


class DeliveryBook:
    """Pending deliveries per account, handed out highest priority first, then FIFO by smuid."""

    def __init__(self) -> None:
        self._pending: dict[str, dict[int, Deliver]] = defaultdict(dict)
        self._queue: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._in_flight: set[tuple[str, int]] = set()
        self._acked_unconfirmed: set[tuple[str, int]] = set()
        self.commands_offsets: dict[str, int] = {}

    def apply(self, event) -> str | None:
        """Apply one deliveries-topic event; returns the account that gained work, if any."""
        if isinstance(event, Deliver):
            return self._add(event)
        if isinstance(event, Acked):
            self._forget(event.account, event.smuid)
            self._acked_unconfirmed.discard((event.account, event.smuid))
        elif isinstance(event, Progress):
            self.commands_offsets.update(event.commands_offsets)
        return None

    def _add(self, deliver: Deliver) -> str | None:
        key = (deliver.account, deliver.smuid)
        pending = self._pending[deliver.account]
        if key in self._acked_unconfirmed or deliver.smuid in pending:
            return None
        pending[deliver.smuid] = deliver
        heapq.heappush(self._queue[deliver.account], (-deliver.priority, deliver.smuid))
        return deliver.account

    def _forget(self, account: str, smuid: int) -> None:
        self._pending[account].pop(smuid, None)
        self._in_flight.discard((account, smuid))

    def acknowledged(self, account: str, smuid: int) -> None:
        """The client's 310 ACK is durable in Kafka: never hand this one out again."""
        self._forget(account, smuid)
        self._acked_unconfirmed.add((account, smuid))

    def take(self, account: str) -> Deliver | None:
        """The next delivery to NOTIFY for ``account``, now marked in flight."""
        queue, pending = self._queue[account], self._pending[account]
        while queue:
            _, smuid = heapq.heappop(queue)
            deliver = pending.get(smuid)
            if deliver is not None and (account, smuid) not in self._in_flight:
                self._in_flight.add((account, smuid))
                return deliver
        return None

    def release(self, account: str, smuid: int) -> None:
        """A NOTIFY went unacknowledged (session gone): offer it again, in its place."""
        if (account, smuid) in self._in_flight:
            self._in_flight.discard((account, smuid))
            deliver = self._pending[account].get(smuid)
            if deliver is not None:
                heapq.heappush(self._queue[account], (-deliver.priority, smuid))

    def pending_count(self, account: str) -> int:
        return len(self._pending.get(account, ()))
