"""DELIVERY ONE hand-on between gateways, from the farm-wide presence map."""

from __future__ import annotations

import asyncio
import logging

from gateway.server.presence import Arrived, Left
from schemas.events import Deliver, Nack, Presence
from schemas.timefmt import now_micros

log = logging.getLogger("smqp.gateway")


class HandOn:
    """Farm-wide presence, and the hand-on (NACK, reason ``disconnect``) of DELIVERY ONE messages
    routed to accounts logged in at no gateway.

    A mixin of :class:`gateway.server.gateway.Gateway`: it uses the gateway's registry, book, sessions
    and Kafka clients, set up in :mod:`gateway.server.gateway`.
    """

    def logged_in_anywhere(self, account: str) -> bool:
        """Logged in here (known at once), or at another gateway (as far as the fold has got)."""
        return bool(self.sessions.get(account)) or self.presence.present(account)

    def _hand_on(self, deliver: Deliver, takers: list[str] | None = None) -> None:
        """NACK (``disconnect``) ``deliver``, locked to an account logged in nowhere, when one of
        ``takers`` (default: every account logged in here) could be handed it.

        Only a gateway with such a login NACKs, so a NACK finds someone online to release the
        message to, not a retry counted against it; several such gateways NACKing the same
        delivery is harmless (the second NACK finds it released).  Once per delivery per gateway,
        until the account logs in again or the delivery is settled."""
        if not self.handing_on or deliver.smuid in self.handed_on.get(deliver.account, ()):
            return
        takers = list(self.sessions) if takers is None else takers
        if any(a != deliver.account and self.registry.admits(a, deliver.topic, deliver.accepted_at) for a in takers):
            self.handed_on[deliver.account].add(deliver.smuid)
            self.nack(deliver.account, "", deliver, reason="disconnect")

    def _settled_hand_on(self, account: str, smuid: int) -> None:
        """The job settled (released, acknowledged, expired) ``account``'s delivery of ``smuid``."""
        done = self.handed_on.get(account)
        if done is not None:
            done.discard(smuid)
            if not done:
                del self.handed_on[account]

    def _hand_on_locked(self, accounts, takers: list[str] | None = None) -> None:
        """Hand on what is locked to each of ``accounts`` that is logged in nowhere."""
        for account in accounts:
            if not self.logged_in_anywhere(account):
                for deliver in self.book.locked_to(account):
                    self._hand_on(deliver, takers)

    def _presence_changed(self, change) -> None:
        if isinstance(change, Left):  # its last login anywhere ended: unlock what it held
            self._hand_on_locked([change.account])
        elif isinstance(change, Arrived):  # it is back: what it holds is its own again
            self.handed_on.pop(change.account, None)

    def _announce_presence(self, account: str) -> None:
        """Append whether ``account`` is logged in here *now* to partition 0 for every gateway's
        presence map.  A failed append is tried again a second later, with the state of then:
        each announcement says the whole truth, so a repeat or a late one does no harm."""
        if self.stopping:
            return
        event = Presence(node=self.config.gateway.node_id, account=account, present=bool(self.sessions.get(account)))
        future = self.log.append(b"", event.to_bytes(), partition=0)

        def settled(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception() is not None:
                log.warning("presence of %s not appended (%s): trying again", account, done.exception())
                asyncio.get_running_loop().call_later(1, self._announce_presence, account)
        future.add_done_callback(settled)

    def nack(self, account: str, guid: str, deliver: Deliver, reason: str = "timeout") -> None:
        """Append a NACK of ``deliver`` (its NOTIFY went unacknowledged, or its subscriber left)
        for the job to count or reassign, stamped with its topic's ``max_retries``.

        Best effort: a NACK lost to a Kafka outage only delays the Trash by one retry."""
        event = Nack(account=account, guid=guid or "", smuid=deliver.smuid,
                     accepted_at=now_micros(),
                     max_retries=self.queue_params(deliver.topic).max_retries, reason=reason)
        future = self.log.append(account.encode("utf-8"), event.to_bytes(), linger=True)
        future.add_done_callback(lambda done: done.exception() and log.warning(
            "NACK of %s for %s not appended: %s", deliver.smuid, account, done.exception()))
