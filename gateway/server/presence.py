"""Farm-wide presence: at which gateways each account is logged in, folded from commands partition 0.

The streaming job routes a DELIVERY ONE message to one subscriber by a hash,
whether or not it is logged in anywhere.  A gateway alone only knows its own
logins; to hand such a message on to a subscriber who is online, every
gateway needs to know whether the chosen account is logged in at *any*
gateway.  So each gateway appends :class:`schemas.events.Presence` (an
account's first login there started / its last one there ended) and
:class:`schemas.events.NodeReset` (at start: its previous incarnation's logins
are gone; at a clean stop) to partition 0, and every gateway folds them, in
the one order of that partition, into a :class:`PresenceMap`: they all agree
on who is logged in where.

Plain data, no I/O, like :mod:`gateway.registry` beside it.  What a fold
changes is returned as :class:`Arrived` (logged in nowhere before, somewhere
now) and :class:`Left` (logged in somewhere before, nowhere now), so the
gateway can hand on what is locked to an account that left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from schemas.events import NodeReset, Presence


@dataclass(frozen=True)
class Arrived:
    """``account`` is logged in at some gateway now, and was at none before."""

    account: str


@dataclass(frozen=True)
class Left:
    """``account`` is logged in at no gateway any more."""

    account: str


PresenceChange = Union[Arrived, Left]


@dataclass
class PresenceMap:
    """Account → the gateway nodes it is logged in at, as folded from partition 0."""

    _nodes: dict[str, set[int]] = field(default_factory=dict)

    def apply(self, event) -> list[PresenceChange]:
        """Fold one partition-0 event (others are ignored); returns the accounts that arrived or left."""
        if isinstance(event, Presence):
            return self._arrive(event.account, event.node) if event.present else self._leave(event.account, event.node)
        if isinstance(event, NodeReset):
            changes: list[PresenceChange] = []
            for account in [a for a, nodes in self._nodes.items() if event.node in nodes]:
                changes += self._leave(account, event.node)
            return changes
        return []

    def _arrive(self, account: str, node: int) -> list[PresenceChange]:
        nodes = self._nodes.setdefault(account, set())
        before = bool(nodes)
        nodes.add(node)
        return [] if before else [Arrived(account)]

    def _leave(self, account: str, node: int) -> list[PresenceChange]:
        nodes = self._nodes.get(account)
        if not nodes or node not in nodes:
            return []  # a repeated or stale "absent": nothing changes
        nodes.discard(node)
        if nodes:
            return []
        del self._nodes[account]
        return [Left(account)]

    def present(self, account: str) -> bool:
        """Logged in at some gateway (as far as the fold has got)."""
        return account in self._nodes

    def nodes(self, account: str) -> frozenset[int]:
        """The gateway nodes ``account`` is logged in at."""
        return frozenset(self._nodes.get(account, ()))
