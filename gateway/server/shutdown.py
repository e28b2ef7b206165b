"""Stopping a gateway, at once or after a grace period (planned shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from datetime import timedelta

from schemas.events import NodeReset, PlannedShutdown
from schemas.timefmt import format_timeout, parse_timeout

log = logging.getLogger("smqp.gateway")


class Shutdown:
    """Closing a gateway: at once, or planned with a grace period announced to its clients
    (NOTIFY SERVER BYE) and to the farm.

    A mixin of :class:`gateway.server.gateway.Gateway`: it uses the gateway's registry, book, sessions
    and Kafka clients, set up in :mod:`gateway.server.gateway`.
    """

    def plan_shutdown(self, grace_s: float) -> None:
        """Ask :func:`serve` to stop with :meth:`close` (``grace_s``).  A later ask can only shorten
        the grace, even one under way: Ctrl-C during a SIGTERM's grace closes at once."""
        if self.shutdown_asked.is_set():
            grace_s = min(grace_s, self.shutdown_grace_s)
        self.shutdown_grace_s = grace_s
        self.shutdown_asked.set()

    def _admin_bye(self, event: PlannedShutdown) -> None:
        """``python -m gateway.admin bye`` named this gateway."""
        try:
            grace = parse_timeout(event.grace)
        except ValueError:
            grace = None
        if grace is None:
            log.warning("planned shutdown %s has no usable grace %r: ignored", event.request, event.grace)
            return
        log.info("planned shutdown %s: NOTIFY SERVER BYE %s, then closing", event.request, event.grace)
        self.plan_shutdown(grace.total_seconds())

    async def _bye_ahead(self, grace_s: float) -> None:
        """NOTIFY SERVER BYE <grace> (4.1.11.4.2) to every client, then serve those connected until
        the grace ends or they have all left.  No new connection is taken meanwhile (the listeners
        close first): a client moving to another gateway of the farm must not land here again."""
        for server in (self.server, self.tls_server):
            if server:
                server.close()
        timeout = format_timeout(timedelta(seconds=math.ceil(grace_s)))
        frame = f"NOTIFY SERVER BYE {timeout}\r\n\r\n".encode("ascii")
        for connection in list(self.connections):
            if not connection.closing:
                connection.send(frame)
        started = time.monotonic()
        while self.connections and time.monotonic() - started < min(grace_s, self._current_grace()):
            await asyncio.sleep(0.05)

    def _current_grace(self) -> float:
        """The grace as a later :meth:`plan_shutdown` may have shortened it."""
        return self.shutdown_grace_s if self.shutdown_asked.is_set() else float("inf")

    async def close(self, grace_s: float = 0.0) -> None:
        """Stop accepting, say NOTIFY SERVER BYE to every client, then close the Kafka clients.
        With ``grace_s`` (a planned shutdown), :meth:`_bye_ahead` first."""
        if grace_s > 0:
            await self._bye_ahead(grace_s)
        for server in (self.server, self.tls_server):
            if server:
                server.close()
        if self.status:
            self.status.close()
        for connection in list(self.connections):
            if not connection.closing:
                connection.send(connection.session.server_bye())
                connection.closing = True
                connection.put(None)
                connection.reader.feed_eof()
        await asyncio.sleep(0.2)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._connections_ended(), 3)
        await self._reset_presence()
        for tail in (self.tail, self.control):
            if tail:
                await tail.stop()
        if self.log:
            await self.log.close()
        if self.kafka:
            self.kafka.close()

    async def _connections_ended(self) -> None:
        while self.connections:
            await asyncio.sleep(0.05)

    async def _reset_presence(self) -> None:
        """A clean stop: tell the farm nobody is logged in here any more (each ended login has
        said so too; this covers one whose announcement is still being retried).  Bounded: with
        Kafka unreachable the other gateways keep this node's logins until it starts again."""
        self.stopping = True
        if not self.log:
            return
        try:
            await asyncio.wait_for(self.log.append(b"", NodeReset(self.config.gateway.node_id).to_bytes(),
                                                   partition=0), 2)
        except Exception as error:  # noqa: BLE001 - stopping anyway
            log.warning("could not announce this node's logins as ended: %s", error)
