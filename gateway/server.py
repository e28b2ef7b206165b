"""The asyncio SMQP gateway: sockets, timers and Kafka around the sans-I/O core.

Each connection owns a :class:`gateway.protocol.Session`.  Bytes read go
into the session; the actions it returns are carried out here, in order:
``Send`` is written, ``Durable`` is appended to Kafka and its reply written
only once Kafka acknowledged it (Property 1), ``LoggedIn`` registers the
connection for notifications, ``Close`` ends it.  Replies to pipelined
commands leave in command order.  Notifications come from the deliveries
topic through a :class:`gateway.book.DeliveryBook`; each login has its own
:class:`gateway.book.NotifyQueue` (spec section 3: every login of an account
receives the messages), with one NOTIFY in flight, the next only after the
server's ``310 ACK`` (spec 4.1.11.1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from gateway.accounts import Accounts
from gateway.book import DeliveryBook, NotifyQueue
from gateway.ids import SmuidFactory, new_guid
from gateway.kafka_io import DeliveriesTail, DurableLog, read_acks_since
from gateway.protocol import Close, Durable, LoggedIn, Send, Session
from gateway.replies import SERVICE_UNAVAILABLE, Reply
from schemas.config import SMQPConfig, load_config
from schemas.events import Ack

log = logging.getLogger("smqp.gateway")

READ_SIZE = 65536
MAX_PIPELINED = 1000  # durable appends one connection may have outstanding before we stop reading it


class Connection:
    """One client connection: reads, runs the session's actions, writes in order."""

    def __init__(self, gateway: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.gateway = gateway
        self.reader = reader
        self.writer = writer
        self.session = gateway.new_session()
        # bytes to write, a _PendingReply to await then write, a callable to run, or None to finish
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.unsettled = 0  # durable appends not yet answered
        self.settled = asyncio.Event()
        self.queue = NotifyQueue()  # filled at LOGIN from the account's pending deliveries
        self.in_flight: int | None = None  # smuid of the NOTIFY awaiting the client's 310 ACK
        self.acking = False  # the client's 310 ACK is being made durable
        self.closing = False

    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_loop())
        try:
            self.outbox.put_nowait(self.session.greeting())
            await self._read_loop()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closing = True
            self.outbox.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer_task, 10)
            self.gateway.unregister(self)
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _read_loop(self) -> None:
        timeout = self.gateway.config.gateway.frame_timeout_s
        while not self.closing:
            while self.unsettled >= MAX_PIPELINED:  # back-pressure: Kafka is slower than this client
                self.settled.clear()
                await self.settled.wait()
            try:
                data = await asyncio.wait_for(self.reader.read(READ_SIZE),
                                              timeout if self.session.in_frame else None)
            except asyncio.TimeoutError:
                self._perform(self.session.frame_timeout())
                continue
            self._perform(self.session.receive_data(data))
            if not data:
                return

    def _perform(self, actions) -> None:
        for action in actions:
            if isinstance(action, Send):
                self.outbox.put_nowait(action.data)
            elif isinstance(action, Durable):
                self.outbox.put_nowait(self._make_durable(action))
            elif isinstance(action, LoggedIn):  # after the 200 reply is written, not before
                self.outbox.put_nowait(lambda: self.gateway.register(self))
            elif isinstance(action, Close):
                self.closing = True
                self.outbox.put_nowait(None)

    def _make_durable(self, action: Durable) -> _PendingReply:
        """Start the Kafka append now, in command order; the writer awaits it in order."""
        is_ack = isinstance(action.event, Ack)
        if is_ack:
            self.acking = True
        self.unsettled += 1
        future = self.gateway.log.append(action.key, action.event.to_bytes(), immediate=is_ack)
        return _PendingReply(future, action.reply, action.event if is_ack else None)

    async def _settle(self, pending: _PendingReply) -> bytes:
        try:
            await pending.future
        except Exception as error:  # not durable: the client must not believe it is
            log.warning("Kafka append failed: %s", error)
            if pending.ack:
                self.acking = False
            return Reply(SERVICE_UNAVAILABLE, ("Service unavailable: message store not reachable",)).to_bytes()
        finally:
            self.unsettled -= 1
            self.settled.set()
        return pending.reply

    def _ack_written(self, ack: Ack) -> None:
        """Both phases done: forget the message for good, then offer the next one."""
        self.acking = False
        self.in_flight = None
        self.gateway.book.acknowledged(ack.account, ack.smuid)
        self.send_next()

    async def _write_loop(self) -> None:
        while (item := await self.outbox.get()) is not None:
            if isinstance(item, _PendingReply):
                self.writer.write(await self._settle(item))
                if item.ack and self.acking:
                    self._ack_written(item.ack)
                elif item.ack:  # the ACK is not durable: the message stays pending; end this login
                    self.closing = True
                    self.reader.feed_eof()
                    break
            elif callable(item):
                item()
            else:
                self.writer.write(item)
            if self.outbox.empty():
                await self._drain()
        await self._drain()

    async def _drain(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()

    def send_next(self) -> None:
        """Send the next NOTIFY MESSAGE if none awaits its two-phase ACK."""
        if self.closing or self.in_flight is not None or self.acking:
            return
        deliver = self.queue.pop()
        if deliver is not None:
            self.in_flight = deliver.smuid
            self.outbox.put_nowait(self.session.notify(deliver))


@dataclass
class _PendingReply:
    """A reply that may only be written once its event is durable in Kafka."""

    future: asyncio.Future
    reply: bytes
    ack: Ack | None = None


class Gateway:
    """The SMQP server: accepts connections, owns the Kafka clients and the delivery book."""

    def __init__(self, config: SMQPConfig):
        self.config = config
        self.accounts = Accounts(config.accounts, allow_guest=config.gateway.allow_guest)
        self.new_smuid = SmuidFactory(config.gateway.node_id)
        self.book = DeliveryBook()
        self.sessions: dict[str, list[Connection]] = defaultdict(list)
        self.connections: set[Connection] = set()
        self.log: DurableLog | None = None
        self.tail: DeliveriesTail | None = None
        self.server: asyncio.base_events.Server | None = None

    def new_session(self) -> Session:
        return Session(self.config.gateway, self.accounts.authenticate,
                       clock=lambda: datetime.now(timezone.utc), new_guid=new_guid, new_smuid=self.new_smuid)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.log = await asyncio.to_thread(DurableLog, self.config.kafka)
        self.tail = DeliveriesTail(self.config.kafka, loop, self._on_deliveries)
        self.tail.start()
        await asyncio.wait_for(self.tail.ready.wait(), 60)
        for ack in await asyncio.to_thread(read_acks_since, self.config.kafka, dict(self.book.commands_offsets)):
            self.book.acknowledged(ack.account, ack.smuid)
        self.server = await asyncio.start_server(self._accept, self.config.gateway.host, self.config.gateway.port,
                                                 limit=self.config.gateway.max_line_bytes * 2)
        log.info("SMQP gateway listening on %s", self.address)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.sockets[0].getsockname()[:2]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(self, reader, writer)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)

    def _on_deliveries(self, events: list) -> None:
        for deliver in filter(None, map(self.book.apply, events)):
            for connection in self.sessions.get(deliver.account, ()):
                connection.queue.push(deliver)
                connection.send_next()

    def register(self, connection: Connection) -> None:
        account = connection.session.account
        connection.queue = self.book.queue_for_login(account)
        self.sessions[account].append(connection)
        connection.send_next()

    def unregister(self, connection: Connection) -> None:
        """A login ended; whatever it left unacknowledged stays pending for the account."""
        account = connection.session.account
        if account and connection in self.sessions.get(account, ()):
            self.sessions[account].remove(connection)

    async def close(self) -> None:
        """Stop accepting, say NOTIFY SERVER BYE to every client, then close the Kafka clients."""
        if self.server:
            self.server.close()
        for connection in list(self.connections):
            if not connection.closing:
                connection.outbox.put_nowait(connection.session.server_bye())
                connection.closing = True
                connection.outbox.put_nowait(None)
                connection.reader.feed_eof()
        await asyncio.sleep(0.2)
        if self.tail:
            self.tail.stop()
        if self.log:
            await asyncio.to_thread(self.log.close)


async def serve(config: SMQPConfig, ready: asyncio.Event | None = None) -> None:
    """Run a gateway until SIGINT/SIGTERM."""
    gateway = Gateway(config)
    await gateway.start()
    host, port = gateway.address
    print(f"SMQP gateway ready on {host}:{port} (node {config.gateway.node_id})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if ready:
        ready.set()
    await stop.wait()
    await gateway.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="smqp-gateway",
        description="Run one SMQP gateway: clients connect over TCP; PUBLISH/SUBSCRIBE/ACK go to Kafka; "
                    "NOTIFYs come from the streaming job's deliveries topic.",
    )
    parser.add_argument("--config", help="TOML configuration file (default: $SMQP_CONFIG, else built-in defaults)")
    parser.add_argument("--host", help="listen address (overrides [gateway] host)")
    parser.add_argument("--port", type=int, help="listen port (overrides [gateway] port)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO is per-connection chatter
    config = load_config(args.config)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = replace(config, gateway=replace(config.gateway, **overrides))
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
