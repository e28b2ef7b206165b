"""The tail of the job's deliveries topic (Deliver, Acked, Progress) into the delivery book."""

from __future__ import annotations

import logging
from gateway.server.feeds import RawDeliver
from schemas.events import Acked, AckedBatch, decode

log = logging.getLogger("smqp.gateway")


class DeliveriesTail:
    """The job's deliveries topic, read into the delivery book and the connections.

    A mixin of :class:`gateway.server.gateway.Gateway`: it uses the gateway's registry, book, sessions
    and Kafka clients, set up in :mod:`gateway.server.gateway`.
    """

    def _on_deliveries(self, events: list) -> None:
        for event in events:
            if type(event) is AckedBatch:
                for acked in event.events():
                    self._on_delivery(acked)
            else:
                self._on_delivery(event)

    def _on_delivery(self, event) -> None:
        """One deliveries-topic event: into the book, and to the logins here it concerns."""
        if isinstance(event, RawDeliver):
            if self.book.knows(event.account, event.smuid):
                return  # routed early here, or acknowledged: the job's copy changes nothing
            try:
                event = decode(event.value)
            except (ValueError, TypeError, KeyError):
                log.warning("skipping undecodable deliveries record %r", event.value[:80])
                return
        deliver = self.book.apply(event)
        if deliver is not None and deliver.delivery == "one" and not self.logged_in_anywhere(deliver.account):
            # routed to a subscriber logged in at no gateway: hand it on if someone here can take it
            self._hand_on(deliver)
        elif deliver is not None:
            self._offer(deliver)
        elif isinstance(event, Acked):
            self._settled_hand_on(event.account, event.smuid)
            if event.reason != "acked":
                for connection in self.sessions.get(event.account, ()):
                    connection.withdraw(event.smuid)
