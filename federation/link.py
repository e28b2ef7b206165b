"""One login at a peer farm: the patterns held there, each NOTIFY MESSAGE taken in, then ACKed.

The link is a plain SMQP client of the peer (spec 2.3, :class:`gateway.client.SMQPClient`): it logs
in, holds the patterns this farm wants there (SUB/UNSUB to follow :mod:`federation.interest`; a
pattern the peer refuses, 401 or 404, is skipped, counted, and tried again at the next change), and
for every NOTIFY MESSAGE awaits ``take`` (a durable append here, or a drop) before its ``310 ACK``:
the peer's durable queue for the login's account is the link's progress, so a link that dies before
an ACK gets that message again, and one that was down gets what was published meanwhile.  A peer
that cannot be reached, or a session that breaks, is tried again after ``retry_initial_s``, doubling
up to ``retry_max_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import kafka.errors as KafkaErrors

from federation.metrics import LinkState
from gateway.client import Notification, SMQPClient, SMQPError
from gateway.client.wire import ServerProtocolError
from gateway.scram import ScramError
from gateway.replies import FORBIDDEN, NOT_ALLOWED, NOT_FOUND, UNAUTHORIZED

log = logging.getLogger("smqp.federation")

#: What a peer answers a SUB it will not take: no right (401, 403 for another's account topic), no
#: such topic (404), not allowed there (405).
REFUSALS = frozenset({UNAUTHORIZED, FORBIDDEN, NOT_FOUND, NOT_ALLOWED})

#: Failures that end a session (or an attempt at one); the link tries again after its backoff.
SESSION_FAILURES = (OSError, ConnectionError, asyncio.TimeoutError, SMQPError, ServerProtocolError, ScramError,
                    KafkaErrors.KafkaError)


class Backoff:
    """``initial`` seconds, doubling at each failure, up to ``maximum``; :meth:`reset` after a success."""

    def __init__(self, initial: float, maximum: float):
        self.initial, self.maximum = initial, max(initial, maximum)
        self._next = initial

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.initial


@dataclass(frozen=True)
class Peer:
    """Where and as whom one session logs in."""

    name: str  # its label in logs and /metrics
    host: str
    port: int
    login: str  # the account at the peer
    password: str = field(repr=False, default="")
    ssl: ssl_module.SSLContext | None = None
    method: str = "CLEAR"  # LOGIN's method: SCRAM-SHA-256 keeps a password off a plain connection


class PeerSession:
    """Runs one login at a peer until cancelled: connect, hold :attr:`wanted`, take NOTIFYs, ACK.

    ``owns_account``: the login's account is this link's alone (a peer account), so what it holds
    there and this farm no longer wants is unsubscribed; a shared login (guest, a creating account)
    ends only what this session subscribed itself."""

    def __init__(self, peer: Peer, wanted: Callable[[], set[str]], take: Callable[[Notification], Awaitable[None]],
                 changed: asyncio.Event, state: LinkState, on_failure: Callable[[], None], backoff: Backoff, *,
                 owns_account: bool):
        self.peer = peer
        self.wanted = wanted
        self.take = take
        self.changed = changed
        self.state = state
        self.on_failure = on_failure
        self.backoff = backoff
        self.owns_account = owns_account
        self.held: set[str] = set()  # patterns subscribed at the peer, as far as this session knows
        self.client: SMQPClient | None = None

    async def run(self) -> None:
        while True:
            try:
                self.client = await SMQPClient.open(self.peer.host, self.peer.port, self.peer.login,
                                                    self.peer.password, ssl=self.peer.ssl, method=self.peer.method)
            except SESSION_FAILURES as error:
                self.on_failure()
                await self._pause(f"cannot log in at {self.peer.host}:{self.peer.port}: {error!r}")
                continue
            log.info("link %s: logged in at %s:%d as %s", self.peer.name, self.peer.host, self.peer.port,
                     self.peer.login)
            self.backoff.reset()
            try:
                await self._serve(self.client)
            except SESSION_FAILURES as error:
                await self._pause(f"session lost: {error!r}")
            except Exception:  # noqa: BLE001 - a bug in one message's handling: logged, the link goes on
                log.exception("link %s: session failed", self.peer.name)
                await self._pause("session failed")
            finally:
                self.state.up = False
                client, self.client = self.client, None
                with contextlib.suppress(Exception):
                    await client.close()

    async def _pause(self, why: str) -> None:
        delay = self.backoff.next()
        log.warning("link %s: %s; retrying in %.1f s", self.peer.name, why, delay)
        await asyncio.sleep(delay)

    async def _serve(self, client: SMQPClient) -> None:
        """Hold the wanted patterns and take the NOTIFYs, until either fails."""
        if self.owns_account:
            try:
                self.held = set(await client.list_subscriptions())
            except SMQPError as error:  # a server without LIST SUBSCRIPTIONS: what we hold is unknown
                log.warning("link %s: LIST SUBSCRIPTIONS refused (%s): holding only what it subscribes now",
                            self.peer.name, error)
        self.state.up = True
        self.changed.set()  # reconcile at once: the peer may have lost or kept what we held
        tasks = [asyncio.ensure_future(self._follow(client)), asyncio.ensure_future(self._receive(client))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self, client: SMQPClient) -> None:
        while True:
            await self.changed.wait()
            self.changed.clear()
            await self.reconcile(client)

    async def reconcile(self, client: SMQPClient) -> None:
        """UNSUB what is held and no longer wanted, then SUB what is wanted and not held."""
        wanted = self.wanted()
        for pattern in sorted(self.held - wanted, key=len, reverse=True):
            if pattern not in self.held:
                continue  # ended with a wider pattern just now
            try:
                ended = await client.unsubscribe(pattern)
            except SMQPError as error:
                if error.code != NOT_FOUND:
                    raise
                ended = [("MESSAGE", pattern)]
            self.held -= {topic for resource, topic in ended if resource == "MESSAGE"} | {pattern}
            log.info("link %s: unsubscribed %s", self.peer.name, pattern)
        refused = 0
        for pattern in sorted(wanted - self.held):
            try:
                await client.subscribe(pattern)
            except SMQPError as error:
                if error.code not in REFUSALS:
                    raise
                refused += 1
                log.warning("link %s: %s refused at the peer: %s", self.peer.name, pattern, error)
                continue
            self.held.add(pattern)
            log.info("link %s: subscribed %s", self.peer.name, pattern)
        self.state.refused = refused

    async def _receive(self, client: SMQPClient) -> None:
        while True:
            note = await client.next_notification()
            if note.resource != "MESSAGE":
                continue  # NOTIFY SERVER BYE: the close that follows ends the session
            self.state.received += 1
            try:
                await self.take(note)
            finally:
                self.state.settled += 1
            await self.acknowledge(note)

    async def acknowledge(self, note: Notification) -> None:
        """The ``310 ACK``, once ``take`` made the message durable here (or dropped it)."""
        await note.ack()
