"""A peer's NOTIFY made durable here: read, dropped or appended to this farm's commands topic.

Both kinds of session end here: a peer's forwarding (:meth:`Forwarder.forward`) and a remote
virtual topic's pull (:meth:`Forwarder.pull`).  The append goes where a gateway's PUB of the topic
goes (keyed by the canonical topic, :meth:`kafka_edge.DurableLog.append`), so this farm's job and
gateways take it as any publish; the caller ACKs on the peer only once this returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from federation import inbound
from federation.interest import Pull
from federation.metrics import LinkMetrics
from federation.seen import Seen
from gateway.client import Notification
from gateway.ids import SmuidFactory
from gateway.registry import Registry
from kafka_edge import DurableLog
from schemas.config import SMQPConfig
from schemas.queue_params import TopicSettings
from schemas.timefmt import now_micros

log = logging.getLogger("smqp.federation")

#: A pulled message whose topic no remote virtual topic here links any more.
UNLINKED = "unlinked"


class Forwarder:
    """Appends what peers send to this farm's commands topic, once each (:class:`Seen`)."""

    def __init__(self, config: SMQPConfig, commands: DurableLog, seen: Seen, registry: Registry, metrics: LinkMetrics):
        self.config = config
        self.domain = config.domain
        self.commands = commands
        self.seen = seen
        self.registry = registry
        self.metrics = metrics
        self.new_smuid = SmuidFactory(config.federation.node_id)
        self.topic_settings = TopicSettings(config.topics)

    def _read(self, link: str, peer_domain: str, note: Notification) -> inbound.Arrival | None:
        try:
            return inbound.arrival(note.topic, note.headers, note.sections, peer_domain)
        except inbound.Malformed as error:
            log.warning("link %s: dropping a NOTIFY: %s", link, error)
            self.metrics.dropped.inc(link, inbound.MALFORMED)
            return None

    async def forward(self, link: str, peer_domain: str, note: Notification) -> None:
        """A message ``peer_domain`` forwarded: the same topic here, its Depth spent by one."""
        message = self._read(link, peer_domain, note)
        if message is not None:
            await self._store(link, peer_domain, message, inbound.forwarded(message, peer_domain), by_depth=True)

    async def pull(self, link: str, peer_domain: str, note: Notification,
                   linking: Callable[[str], Iterable[Pull]]) -> None:
        """A message of a remote topic pulled from ``peer_domain``: stored on each virtual topic here
        that links it (``linking(path)``)."""
        message = self._read(link, peer_domain, note)
        if message is None:
            return
        pulls = list(linking(message.path))
        if not pulls:
            self.metrics.dropped.inc(link, UNLINKED)
        for pull in pulls:
            await self._store(link, peer_domain, message, inbound.pulled(message, pull.topic, pull.target),
                              by_depth=False)

    async def _store(self, link: str, peer_domain: str, message: inbound.Arrival, outbound: inbound.Outbound, *,
                     by_depth: bool) -> None:
        reason = inbound.drop_reason(message, outbound, self.domain, self.seen, by_depth=by_depth)
        key = inbound.dedup_key(message.origin, outbound.topic)
        if reason is None and not await self.seen.claim(key):
            reason = inbound.SEEN
        if reason is not None:
            self.metrics.dropped.inc(link, reason)
            log.debug("link %s: dropped %s (%s)", link, message.origin, reason)
            return
        appended, expires_at = False, None
        try:
            params = self.topic_settings.resolve(outbound.topic)
            publish = inbound.to_publish(
                message, outbound, smuid=self.new_smuid(), now=now_micros(),
                server_timeout=params.timeout or self.registry.server_timeout,
                delivery=self.registry.delivery(outbound.topic) or params.delivery, peer_domain=peer_domain)
            expires_at = publish.expires_at
            await self.commands.append(outbound.topic.encode("utf-8"), publish.to_bytes())
            appended = True
        finally:
            self.seen.settle(key, appended, expires_at)
        self.metrics.forwarded.inc(link)
        self.metrics.state(link).appended(message.created, now_micros())
