"""What this farm wants of each peer, from its registry: patterns to hold there, topics to pull.

The link process folds commands partition 0 into a :class:`gateway.registry.Registry` as every
gateway does (:mod:`gateway.server.fold`), so it sees the same subscriptions and virtual topics.
Its *interest* on a peer is the union of the subscription patterns here (local subscribers and other
peers' links alike: a farm in the middle of a chain passes on what the farms beyond it want), except
those held by that very peer's own link account here (what it wants it has).  A remote virtual topic
(``CREATE TOPIC /quotes/ibm > b.example/stocks/ibm``) is a :class:`Pull` of its target.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from gateway.registry import Registry
from gateway.server.remote import pull_account
from gateway.server.feeds import RawPublish, control_tail
from kafka_edge import Cluster, Tail
from schemas.config import SMQPConfig
from schemas.events import CreateTopic, RemoveTopic, RenameTopic, Subscribe, Unsubscribe
from schemas.timefmt import now_micros
from schemas.topics import is_account_topic

log = logging.getLogger("smqp.federation")

#: Folded events that may change what a peer is asked for (or make a refused pattern worth retrying).
_INTEREST_EVENTS = (Subscribe, Unsubscribe, CreateTopic, RemoveTopic, RenameTopic)


@dataclass(frozen=True)
class Pull:
    """A remote virtual topic here: ``topic`` stores what ``domain``'s ``path`` gets; it is pulled
    logged in there as ``login`` (the creating account when the link names it, else guest)."""

    topic: str
    domain: str
    path: str
    login: str

    @property
    def target(self) -> str:
        return f"{self.domain}{self.path}"


def wanted_patterns(registry: Registry, excluded: set[str], now: int | None = None) -> set[str]:
    """The MESSAGE patterns subscribed here by accounts other than ``excluded`` (a peer's own link
    accounts), account topics aside (they are this farm's own), and those whose UNTIL passed by
    ``now`` (microseconds; the gateways end them by their clocks, appending nothing)."""
    now = now_micros() if now is None else now
    return {pattern for account, subscriptions in registry.subscriptions.items() if account not in excluded
            for pattern, subscription in subscriptions.items()
            if not is_account_topic(pattern.removesuffix("/*"))
            and (subscription.until is None or subscription.until > now)}


def peer_accounts(config: SMQPConfig, domain: str) -> set[str]:
    """The accounts here that ``domain``'s link logs in as (``[federation] peers``)."""
    return {account for account, peer in config.federation.peers.items() if peer == domain.lower()}


def pulls(registry: Registry, config: SMQPConfig) -> list[Pull]:
    """The remote virtual topics here that a configured link can pull.

    ``Registry.remote_links()``: (topic, domain, remote path, creating account)."""
    found = []
    for topic, domain, path, creator in registry.remote_links():
        link = config.federation.link(domain)
        if link is None:
            continue  # its link was configured away: nothing to pull from
        found.append(Pull(topic, domain.lower(), path, pull_account(link, creator)))
    return sorted(found, key=lambda pull: (pull.domain, pull.login, pull.topic))


class InterestFold:
    """Commands partition 0 folded into a registry; each :meth:`listen` event is set whenever what
    peers may be asked for may have changed (and once the replay is complete)."""

    def __init__(self, config: SMQPConfig, cluster: Cluster):
        self.config = config
        accounts = set(config.accounts) | {"guest"}
        self.registry = Registry(is_account=accounts.__contains__, server_timeout=config.gateway.default_timeout,
                                 max_children=config.gateway.max_children_per_topic)
        self._listeners: list[asyncio.Event] = []
        self.tail: Tail = control_tail(config.kafka, cluster, self._on_control)

    async def start(self, timeout: float = 120.0) -> None:
        """Fold what partition 0 holds now; the fold goes on in the background."""
        self.tail.start()
        await asyncio.wait_for(self.tail.ready.wait(), timeout)
        self._changed()

    def listen(self) -> asyncio.Event:
        """An event set at each change (set now if the replay is complete); its owner clears it."""
        event = asyncio.Event()
        if self.tail.ready.is_set():
            event.set()
        self._listeners.append(event)
        return event

    def _changed(self) -> None:
        for event in self._listeners:
            event.set()

    async def stop(self) -> None:
        await self.tail.stop()

    def _on_control(self, records: list) -> None:
        touched = False
        for offset, event in records:
            if isinstance(event, RawPublish):
                self.registry.apply(None, offset)
                continue
            self.registry.apply(event, offset)
            touched = touched or isinstance(event, _INTEREST_EVENTS)
        if touched and self.tail.ready.is_set():
            self._changed()
