"""The asyncio SMQP gateway: sockets, timers and Kafka around the sans-I/O core.

Each connection owns a :class:`gateway.protocol.session.Session`.  Bytes read go
into the session; the actions it returns are carried out here, in order:
``Send`` is written, ``Durable`` is appended to Kafka and its reply written
only once Kafka acknowledged it (Property 1), ``Control`` is appended to
commands partition 0 and answered with the outcome this gateway's registry
fold recorded for it, ``Consult`` / ``ReadMessages`` answer from the
registry / the Delta messages table, ``LoggedIn`` registers the connection
for notifications, ``Close`` ends it.  Replies to pipelined commands leave in
command order.

Notifications come from the deliveries topic through a
:class:`gateway.server.book.DeliveryBook`; each login has its own
:class:`gateway.server.book.NotifyQueue` (spec section 3: every login of an account
receives the messages), with one NOTIFY in flight, the next only after the
server's ``310 ACK`` (spec 4.1.11.1) — or, after the client's SET NOTIFY
WINDOW <n> (our extension), up to n in flight, each with its own retry
timeout.  NOTIFY TOPIC / SUBSCRIBERS / SERVER TIMEOUT come from the registry
fold, to the logins connected here.

DELIVERY ONE messages routed to an account logged in at no gateway are handed
on (NACKed, reason ``disconnect``) by the gateways where a login that could
take them is connected, from a farm-wide presence map every gateway folds
from partition 0 (:mod:`gateway.server.presence`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import ssl
import uuid
from collections import defaultdict
from datetime import datetime, timezone

from gateway.accounts import Accounts, DEFAULT_ITERATIONS, hash_password, new_salt, stored_hash
from gateway.server.book import DeliveryBook
from gateway.server.feeds import control_tail, deliveries_tail, open_commands_log, read_acks_since
from gateway.ids import SmuidFactory, new_guid
from gateway.server.message_store import MessageStore
from gateway.metrics import CONTENT_TYPE, GatewayMetrics, Response, serve_http
from gateway.server.presence import PresenceMap
from gateway.protocol.actions import Durable
from gateway.protocol.session import Session
from gateway.registry import Registry
from gateway.server.connection import Connection, MAX_UNGUARANTEED, RENDERED_MEMORY
from gateway.server.deliveries import DeliveriesTail
from gateway.server.fold import RegistryFold
from gateway.server.handon import HandOn
from gateway.server.shutdown import Shutdown
from gateway.server.tls import notify_tls_context, tls_context
from gateway.ual import AccessList
from kafka_edge import Cluster, DurableLog, Tail
from schemas.config import SMQPConfig
from schemas.events import NodeReset, Publish
from schemas.queue_params import TopicSettings

log = logging.getLogger("smqp.gateway")


class Gateway(RegistryFold, DeliveriesTail, HandOn, Shutdown):
    """The SMQP server: accepts connections, owns the Kafka clients, the registry and the delivery book."""

    def __init__(self, config: SMQPConfig):
        self.config = config
        self.book = DeliveryBook()
        self.registry = Registry(is_account=self._is_account, server_timeout=config.gateway.default_timeout,
                                 max_children=config.gateway.max_children_per_topic,
                                 pending_for_topic=self.book.pending_for_topic)
        self.accounts = Accounts(config.accounts, allow_guest=config.gateway.allow_guest,
                                 overrides=self.registry.passwords, max_failures=config.gateway.max_login_failures,
                                 lockout_s=config.gateway.login_lockout_s, throttle_s=config.gateway.login_throttle_s)
        self.access = AccessList(config.ual)
        self.queue_params = functools.lru_cache(maxsize=4096)(TopicSettings(config.topics).resolve)
        self.messages = MessageStore(config.table_path("messages"), config.table_path("deliveries"),
                                     kept_bytes=config.gateway.kept_read_bytes)
        self.new_smuid = SmuidFactory(config.gateway.node_id)
        self.sessions: dict[str, list[Connection]] = defaultdict(list)
        # farm-wide: the gateway nodes each account is logged in at, folded from partition 0
        self.presence = PresenceMap()
        # DELIVERY ONE messages are handed on only once the book and the presence map are complete
        # (set at the end of start): a half-read map would make every account look logged out
        self.handing_on = False
        # route DELIVERY ALL messages from the fold, ahead of the job (:meth:`_route_early`)
        self.routes_early = config.gateway.route_early and config.kafka.commands_partitions == 1
        # per account logged in nowhere, the smuids this gateway NACKed away from it: once each
        self.handed_on: dict[str, set[int]] = defaultdict(set)  # (an account's entry goes once empty)
        self.stopping = False
        # a planned shutdown was asked for (SIGTERM, ``gateway.admin bye``): :func:`serve` closes
        # with ``shutdown_grace_s``
        self.shutdown_asked = asyncio.Event()
        self.shutdown_grace_s = 0.0
        self.connections: set[Connection] = set()
        self.kafka: Cluster | None = None
        self.log: DurableLog | None = None
        self.tail: Tail | None = None
        self.control: Tail | None = None
        self.server: asyncio.base_events.Server | None = None
        self.tls_server: asyncio.base_events.Server | None = None
        self.metrics = GatewayMetrics(self)
        self.status: asyncio.base_events.Server | None = None  # the /metrics page, when status_port is set
        self._fold_waiters: list[tuple[int, asyncio.Future]] = []
        # DELIVERY ALL publishes of this gateway's clients, by their record, from their append until
        # the fold reaches them (:meth:`RegistryFold.remember_own`)
        self._own_publishes: dict[bytes, Publish] = {}
        # the timer that wakes at the earliest UNTIL of a subscription still on (:meth:`_arm_until`), and that UNTIL
        self._until_timer: asyncio.TimerHandle | None = None
        self._until_due: int | None = None
        # the NOTIFY frames of the latest messages sent, by SMUID: a message fanned out to many
        # logins is rendered once (the frame does not depend on the account)
        self.rendered: dict[int, bytes] = {}
        # a client over this many unread bytes is not read from, and closed if it stays over it
        self.pause_at = config.gateway.max_buffered_bytes // 2
        self.unguaranteed_outstanding = 0
        self.unguaranteed_dropped = 0
        self._notify_tls: ssl.SSLContext | None = None  # see notify_tls_context

    def fire_and_forget(self, action: Durable) -> None:
        """A non-guaranteed PUB: appended without a reply; dropped (and logged) when the
        producer cannot take it or too many are outstanding, never holding up guaranteed traffic."""
        if self.unguaranteed_outstanding >= MAX_UNGUARANTEED:
            self.unguaranteed_dropped += 1
            return
        self.unguaranteed_outstanding += 1
        future = self.log.append(action.key, action.event.to_bytes(), linger=True)

        def settled(done: asyncio.Future) -> None:
            self.unguaranteed_outstanding -= 1
            if done.exception() is not None:
                self.unguaranteed_dropped += 1
        future.add_done_callback(settled)

    def remember_rendered(self, smuid: int, frame: bytes) -> None:
        """Keep ``frame`` for the next logins sent ``smuid``; the oldest of
        :data:`RENDERED_MEMORY` frames is forgotten."""
        if smuid not in self.rendered:
            self.rendered[smuid] = frame
            if len(self.rendered) > RENDERED_MEMORY:
                del self.rendered[next(iter(self.rendered))]

    def _is_account(self, name: str) -> bool:
        return self.accounts.exists(name)

    def notify_tls_context(self) -> ssl.SSLContext:
        """Made at the first TLS session's SET NOTIFY PORT (a plain-only gateway never reads the CA file)."""
        if self._notify_tls is None:
            self._notify_tls = notify_tls_context(self.config.gateway)
        return self._notify_tls

    def new_session(self, peer: str = "", *, tls: bool = False) -> Session:
        """A session for a client at ``peer``: its failed logins are throttled by that address."""
        return Session(self.config.gateway, functools.partial(self.accounts.authenticate, source=peer),
                       clock=lambda: datetime.now(timezone.utc), new_guid=new_guid, new_smuid=self.new_smuid,
                       registry=self.registry, new_request=lambda: uuid.uuid4().hex,
                       hash_password=hash_password, on_command=self.metrics.frame_in,
                       over_capacity=self._over_capacity, access=self.access,
                       scram_credentials=functools.partial(self.accounts.scram_credentials, source=peer),
                       login_outcome=functools.partial(self.accounts.login_outcome, source=peer),
                       new_nonce=lambda: secrets.token_urlsafe(18),
                       new_salt=lambda: (new_salt(), DEFAULT_ITERATIONS), store_credentials=stored_hash,
                       queue_params=self.queue_params, queued=self.book.sizes.of, peer=peer, tls=tls,
                       known_message=self.book.seen.get, federation=self.config.federation)

    def _over_capacity(self) -> str | None:
        """None while this gateway takes logins; else where to redirect them ("" = nowhere: 503)."""
        logins = sum(len(connections) for connections in self.sessions.values())
        return None if logins < self.config.gateway.max_logins else self.config.gateway.redirect_to

    async def start(self) -> None:
        """Fold partition 0 and read the deliveries topic, then listen.

        This node's previous incarnation's logins are gone, even after a crash: a ``NodeReset``
        says so before anything is folded.  Nothing is handed on while the book and the presence
        map are being read: only once both are complete (the fold past that reset) does
        ``handing_on`` start; no login is connected here before that, so nothing is missed."""
        self.kafka = Cluster(self.config.kafka, client_id="smqp-gateway")
        self.log = await open_commands_log(self.config.kafka, self.kafka)
        reset = await self.log.append(b"", NodeReset(self.config.gateway.node_id).to_bytes(), partition=0)
        self.control = control_tail(self.config.kafka, self.kafka, self._on_control)
        self.control.start()
        self.tail = deliveries_tail(self.config.kafka, self.kafka, self._on_deliveries)
        self.tail.start()
        await asyncio.wait_for(asyncio.gather(self.tail.ready.wait(), self.control.ready.wait()), 60)
        await self.folded(reset.offset)
        for ack in await read_acks_since(self.config.kafka, self.kafka, dict(self.book.commands_offsets)):
            self.book.acknowledged(ack.account, ack.smuid)
        self.handing_on = True
        self.server = await asyncio.start_server(self._accept, self.config.gateway.host, self.config.gateway.port,
                                                 limit=self.config.gateway.max_line_bytes * 2,
                                                 backlog=self.config.gateway.listen_backlog)
        log.info("SMQP gateway listening on %s", self.address)
        if self.config.gateway.tls_port:
            self.tls_server = await asyncio.start_server(
                self._accept, self.config.gateway.host, self.config.gateway.tls_port,
                limit=self.config.gateway.max_line_bytes * 2, ssl=tls_context(self.config.gateway),
                backlog=self.config.gateway.listen_backlog)
            log.info("SMQPS (TLS) listening on %s", self.tls_address)
        if self.config.gateway.status_port:
            self.status = await serve_http(self.config.gateway.host, self.config.gateway.status_port, {
                "/metrics": self._metrics_page, "/healthz": self._health_page})
            log.info("status page on http://%s:%s/metrics", *self.status_address)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.sockets[0].getsockname()[:2]

    @property
    def tls_address(self) -> tuple[str, int] | None:
        return self.tls_server.sockets[0].getsockname()[:2] if self.tls_server else None

    @property
    def status_address(self) -> tuple[str, int] | None:
        return self.status.sockets[0].getsockname()[:2] if self.status else None

    async def _metrics_page(self, query: str) -> Response:
        return Response(self.metrics.render(), CONTENT_TYPE)

    async def _health_page(self, query: str) -> Response:
        return Response("ok\n")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(self, reader, writer)
        self.connections.add(connection)
        self.metrics.connections_total.inc()
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)


    def register(self, connection: Connection) -> None:
        """A login started.  The account's first one here is announced to the farm, and what is
        locked to accounts logged in nowhere that it could take is handed on."""
        account = connection.session.account
        connection.queue = self.book.queue_for_login(account)
        first = not self.sessions.get(account)
        self.sessions[account].append(connection)
        if first:
            self._announce_presence(account)
            self.handed_on.pop(account, None)
            self._hand_on_locked(self.book.accounts(), takers=[account])
        connection.send_next()

    def unregister(self, connection: Connection) -> None:
        """A login ended; whatever it left unacknowledged stays pending for the account.  Its last
        one here is announced to the farm; once every gateway has folded that the account is logged
        in nowhere, the DELIVERY ONE messages locked to it are handed on by the gateways where
        someone who could take them is logged in (XEP-0254: unlocked on disconnect)."""
        account = connection.session.account
        if account and connection in self.sessions.get(account, ()):
            self.sessions[account].remove(connection)
            if not self.sessions[account]:
                del self.sessions[account]
                self._announce_presence(account)
