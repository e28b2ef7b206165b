"""The link process of one farm: a session per configured peer, one per remote virtual topic's login.

Why a process of its own, not the job: forwarding is a client of another farm's gateway, a long-lived
login with its own two-phase ACKs and backoff, which a micro-batch job cannot hold; and routing stays
where it is: what comes in is appended to this farm's commands topic as a ``Publish``, so this farm's
gateways and job route it like any other (DESIGN: one routing rule, in one place).

At start it reads this farm's commands topic once (:func:`federation.seen.rebuild`: what was forwarded
here already), folds partition 0 (:class:`federation.interest.InterestFold`), then runs the sessions
(:class:`federation.link.PeerSession`) until :meth:`LinkProcess.close`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping

from federation.forwarder import Forwarder
from federation.interest import InterestFold, Pull, peer_accounts, pulls, wanted_patterns
from federation.link import Backoff, Peer, PeerSession
from federation.metrics import LinkMetrics, serve_metrics
from federation.seen import Seen, rebuild
from gateway.server.feeds import open_commands_log
from gateway.server.remote import link_ssl, login_method, pull_login
from kafka_edge import Cluster, DurableLog
from schemas.config import LinkConfig, SMQPConfig
from schemas.timefmt import now_micros

log = logging.getLogger("smqp.federation")

#: How often the dedup set forgets the messages that can no longer come again, in seconds.
FORGET_EVERY_S = 60.0

#: Seconds :meth:`LinkProcess.close` waits for its sessions to stop (a stuck one is logged, not awaited).
CLOSE_TIMEOUT_S = 10.0


class LinkProcess:
    """Everything ``smqp-link`` runs, on one event loop."""

    def __init__(self, config: SMQPConfig, env: Mapping[str, str] | None = None):
        self.config = config
        self.env = os.environ if env is None else env
        self.metrics = LinkMetrics()
        self.cluster: Cluster | None = None
        self.log: DurableLog | None = None
        self.seen: Seen | None = None
        self.fold: InterestFold | None = None
        self.forwarder: Forwarder | None = None
        self.sessions: dict[str, PeerSession] = {}
        self._tasks: list[asyncio.Task] = []
        self.status: asyncio.Server | None = None

    async def start(self) -> None:
        self.cluster = Cluster(self.config.kafka, client_id="smqp-link")
        self.log = await open_commands_log(self.config.kafka, self.cluster)
        self.seen = await rebuild(self.config.kafka, self.cluster, now=now_micros(),
                                  grace_us=round(self.config.federation.seen_grace_s * 1_000_000))
        log.info("%d forwarded messages here that may still come again", len(self.seen))
        self.fold = InterestFold(self.config, self.cluster)
        await self.fold.start()
        self.forwarder = Forwarder(self.config, self.log, self.seen, self.fold.registry, self.metrics)
        for link in self.config.federation.links:
            self._start_forwarding(link)
        self._spawn(self._follow_pulls(self.fold.listen()))
        self._spawn(self._forget_dead())
        if self.config.federation.status_port:
            self.status = await serve_metrics(self.metrics, self.config.gateway.host,
                                              self.config.federation.status_port)
            log.info("link status page on http://%s:%s/metrics", *self.status.sockets[0].getsockname()[:2])

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.append(task)

    async def _forget_dead(self) -> None:
        """Keep the dedup set to what may still come again (:meth:`Seen.forget_dead`), once a minute."""
        while True:
            await asyncio.sleep(FORGET_EVERY_S)
            if forgotten := self.seen.forget_dead(now_micros()):
                log.debug("forgot %d forwarded messages that cannot come again", forgotten)

    def _backoff(self) -> Backoff:
        return Backoff(self.config.federation.retry_initial_s, self.config.federation.retry_max_s)

    def _password(self, variable: str) -> str:
        return self.env.get(variable, "") if variable else ""

    def _start_forwarding(self, link: LinkConfig) -> None:
        """The session that logs in as this farm's account at ``link``'s peer and holds our interest."""
        name, domain = link.domain.lower(), link.domain.lower()
        host, port = link.host_port
        excluded = peer_accounts(self.config, domain)
        login = link.account or "guest"
        peer = Peer(name, host, port, login, self._password(link.password_env), link_ssl(link),
                    login_method(link, login))
        session = PeerSession(
            peer, lambda: wanted_patterns(self.fold.registry, excluded),
            lambda note: self.forwarder.forward(name, domain, note), self.fold.listen(),
            self.metrics.state(name), lambda: self.metrics.connect_failures.inc(name), self._backoff(),
            owns_account=bool(link.account))
        self.sessions[name] = session
        self._spawn(session.run())

    async def _follow_pulls(self, changed: asyncio.Event) -> None:
        """Keep one pull session per (peer, login) that a remote virtual topic here needs."""
        while True:
            await changed.wait()
            changed.clear()
            for pull in pulls(self.fold.registry, self.config):
                name = f"pull:{pull.domain}:{pull.login}"
                if name not in self.sessions:
                    self._start_pull(name, pull)

    def _start_pull(self, name: str, first: Pull) -> None:
        """Spec 4.1.3: a plain subscriber of the remote topics, as the creating account or guest."""
        link = self.config.federation.link(first.domain)
        host, port = link.host_port
        domain, login = first.domain, first.login
        try:
            _, password = pull_login(link, login, self.env)
        except KeyError as missing:
            log.warning("%s: no password for %s in $%s; pulling with none", domain, login, missing)
            password = ""

        def mine() -> list[Pull]:  # from the registry as it is now, whichever task woke first
            return [pull for pull in pulls(self.fold.registry, self.config)
                    if (pull.domain, pull.login) == (domain, login)]

        session = PeerSession(
            Peer(name, host, port, login, password, link_ssl(link), login_method(link, login)),
            lambda: {pull.path for pull in mine()},
            lambda note: self.forwarder.pull(name, domain, note, lambda path: [p for p in mine() if p.path == path]),
            self.fold.listen(), self.metrics.state(name), lambda: self.metrics.connect_failures.inc(name),
            self._backoff(), owns_account=False)
        self.sessions[name] = session
        self._spawn(session.run())

    async def close(self) -> None:
        """Stop the sessions (a NOTIFY being taken in is not ACKed: the peer sends it again), then Kafka."""
        loop = asyncio.get_running_loop()
        pending, deadline = set(self._tasks), loop.time() + CLOSE_TIMEOUT_S
        while pending and loop.time() < deadline:
            for task in pending:  # again each second: Python 3.11's wait_for may swallow a cancellation
                task.cancel()  # that comes as its awaitable completes (a login just then, say)
            _, pending = await asyncio.wait(pending, timeout=1.0)
        for task in pending:
            log.error("a link task did not stop within %g s: %s", CLOSE_TIMEOUT_S, task.get_stack(limit=5))
        self._tasks.clear()
        if self.status is not None:
            self.status.close()
        if self.fold is not None:
            await self.fold.stop()
        if self.log is not None:
            await self.log.close()
        if self.cluster is not None:
            self.cluster.close()
