"""RabbitMQ as the other side of the benchmark: a private server and a pika adapter.

``running_rabbitmq()`` installs Debian's ``rabbitmq-server`` with apt when it
is missing (services kept from starting during the install), then starts a
node of its own: bound to 127.0.0.1 on free ports (AMQP, Erlang distribution,
and an epmd of its own), with its data, logs, cookie and plugin list in a
temporary directory, no plugins, and Erlang's scheduler busy-waiting off
(this machine is shared).  It is stopped with ``rabbitmqctl stop`` and its
epmd with ``epmd -kill`` however the block ends, then killed by process id
if either refused.

:class:`RabbitSystem` is the adapter the workloads of
``deploy.compare_workloads`` drive, over pika's asyncio connection: a
destination is a durable fanout exchange, a subscriber a durable queue bound
to it (a destination with no subscriber still gets one queue, or what is
published would be dropped unrouted), messages are persistent, publishers
use confirms, consumers acknowledge each message with a prefetch of
``prefetch``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pika
from pika.adapters.asyncio_connection import AsyncioConnection

from deploy.broker import free_port, wait_for_port

PERSISTENT = pika.BasicProperties(delivery_mode=2)
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")  # Debian's real scripts (the /usr/sbin wrappers su to 'rabbitmq')
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


def _tool(name: str) -> str | None:
    path = RABBIT_BIN / name
    return str(path) if path.exists() else shutil.which(name)


def ensure_installed(progress: Callable[[str], None] = print) -> None:
    """Install Debian's rabbitmq-server with apt when its scripts are missing, without letting the
    package start its system-wide service (a policy-rc.d that denies it, unless one is in place)."""
    if _tool("rabbitmq-server") and _tool("rabbitmqctl"):
        return
    progress("RabbitMQ not found: installing Debian's rabbitmq-server with apt ...")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    guard = os.geteuid() == 0 and not POLICY_RC_D.exists()
    if guard:
        POLICY_RC_D.write_text("#!/bin/sh\n# written by deploy.rabbit while it installs rabbitmq-server\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "rabbitmq-server"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
    finally:
        if guard:
            POLICY_RC_D.unlink()
    if not (_tool("rabbitmq-server") and _tool("rabbitmqctl")):
        raise RuntimeError("rabbitmq-server was installed but its scripts are not where expected")


@dataclass
class RabbitServer:
    port: int
    workdir: str
    env: dict
    process: subprocess.Popen

    @property
    def beam_pid(self) -> int:
        """The Erlang VM's process id (the node writes it to its pid file)."""
        return int(Path(self.workdir, "rabbit.pid").read_text().split()[0])

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([_tool("rabbitmqctl"), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def version(self) -> str:
        result = self.ctl("version")
        return result.stdout.strip() if result.returncode == 0 else "unknown"


def _environment(workdir: str, port: int) -> dict:
    """Everything the node and rabbitmqctl need to find each other, and only on 127.0.0.1."""
    Path(workdir, "enabled_plugins").write_text("[].\n")
    Path(workdir, "rabbitmq-env.conf").write_text("")
    loopback = "-kernel inet_dist_use_interface {127,0,0,1}"
    return dict(
        os.environ,
        HOME=workdir,  # the Erlang cookie is made there, shared by the node and rabbitmqctl
        RABBITMQ_NODENAME=f"smqpbench{os.getpid()}@localhost",
        RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
        RABBITMQ_NODE_PORT=str(port),
        RABBITMQ_DIST_PORT=str(free_port()),
        RABBITMQ_MNESIA_BASE=f"{workdir}/mnesia",
        RABBITMQ_LOG_BASE=f"{workdir}/log",
        RABBITMQ_PID_FILE=f"{workdir}/rabbit.pid",
        RABBITMQ_CONF_ENV_FILE=f"{workdir}/rabbitmq-env.conf",
        RABBITMQ_CONFIG_FILE=f"{workdir}/rabbitmq",  # none there: defaults, not /etc/rabbitmq's
        RABBITMQ_ENABLED_PLUGINS_FILE=f"{workdir}/enabled_plugins",
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=f"{loopback} +sbwt none +sbwtdcpu none +sbwtdio none",
        RABBITMQ_CTL_ERL_ARGS=loopback,
        ERL_EPMD_ADDRESS="127.0.0.1",
        ERL_EPMD_PORT=str(free_port()),
    )


def _await_startup(server: RabbitServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"rabbitmq-server exited with {server.process.returncode}; "
                               f"see {server.workdir}/server.log")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"RabbitMQ did not start within {timeout:g} s; see {server.workdir}/server.log")
        with contextlib.suppress(subprocess.TimeoutExpired):
            if server.ctl("--timeout", str(int(max(left, 5))), "await_startup", timeout=left + 10).returncode == 0:
                wait_for_port("127.0.0.1", server.port, 10)
                return
        time.sleep(1)


def _stop(server: RabbitServer) -> None:
    """``rabbitmqctl stop`` (waits for the VM to exit), then ``epmd -kill``; by process id if refused."""
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        server.ctl("stop", f"{server.workdir}/rabbit.pid", timeout=90)
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(5)
    epmd = shutil.which("epmd") or next(iter(sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd"))), None)
    killed = False
    if epmd:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            killed = subprocess.run([epmd, "-kill"], env=server.env, capture_output=True, timeout=10).returncode == 0
    if not killed:
        for pid in _epmd_pids(server.env["ERL_EPMD_PORT"]):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


def _epmd_pids(port: str) -> list[int]:
    """Process ids of the epmd daemons started with ``ERL_EPMD_PORT=port`` (ours, and only ours)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if status.read_text().strip() == "epmd":
                environ = (status.parent / "environ").read_bytes().split(b"\0")
                if f"ERL_EPMD_PORT={port}".encode() in environ:
                    found.append(int(status.parent.name))
    return found


@contextlib.contextmanager
def running_rabbitmq(progress: Callable[[str], None] = print, timeout: float = 120) -> Iterator[RabbitServer]:
    """A RabbitMQ node of our own on 127.0.0.1 (installed first if need be), stopped afterwards."""
    ensure_installed(progress)
    workdir = tempfile.mkdtemp(prefix="smqp-rabbit-")
    port = free_port()
    env = _environment(workdir, port)
    with open(f"{workdir}/server.log", "wb") as log:
        process = subprocess.Popen([_tool("rabbitmq-server")], env=env, cwd=workdir, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = RabbitServer(port, workdir, env, process)
    try:
        _await_startup(server, timeout)
        yield server
    finally:
        _stop(server)


# -- the client side: pika's asyncio connection as awaitables


class _Connection:
    """One pika ``AsyncioConnection`` on this event loop with one channel."""

    def __init__(self) -> None:
        self.connection = None
        self.channel = None
        self.closed = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, port: int, timeout: float = 15) -> _Connection:
        self = cls()
        loop = asyncio.get_running_loop()
        opened = loop.create_future()

        def failed(_connection, error) -> None:
            if not opened.done():
                opened.set_exception(ConnectionError(f"RabbitMQ: {error}"))
            if not self.closed.done():
                self.closed.set_result(error)

        parameters = pika.ConnectionParameters("127.0.0.1", port, heartbeat=0)
        self.connection = AsyncioConnection(parameters, on_open_callback=opened.set_result,
                                            on_open_error_callback=failed, on_close_callback=failed,
                                            custom_ioloop=loop)
        await asyncio.wait_for(opened, timeout)
        channel_opened = loop.create_future()
        self.connection.channel(on_open_callback=channel_opened.set_result)
        self.channel = await asyncio.wait_for(channel_opened, timeout)
        return self

    async def call(self, method: str, *args, **kwargs):
        """A channel method with a reply (``queue_declare``, ``basic_qos`` …): its reply frame."""
        reply = asyncio.get_running_loop().create_future()
        getattr(self.channel, method)(*args, callback=lambda frame: reply.done() or reply.set_result(frame), **kwargs)
        done, _ = await asyncio.wait({reply, self.closed}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if reply not in done:
            raise ConnectionError(f"RabbitMQ: no reply to {method} ({self.closed.result() if done else 'timeout'})")
        return reply.result()

    async def close(self) -> None:
        if not self.closed.done() and not self.connection.is_closing and not self.connection.is_closed:
            self.connection.close()
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.closed), 10)


class _Publisher:
    """Publishes persistent messages to a fanout exchange; each returns on the broker's confirm."""

    def __init__(self, connection: _Connection, exchange: str):
        self.connection, self.exchange = connection, exchange
        self.pending: collections.OrderedDict[int, asyncio.Future] = collections.OrderedDict()
        self.next_tag = 0

    async def start(self) -> _Publisher:
        await self.connection.call("confirm_delivery", self._confirmed)
        self.connection.closed.add_done_callback(lambda _: self._fail_all())
        return self

    def _confirmed(self, frame) -> None:
        method = frame.method
        tags = [t for t in self.pending if t <= method.delivery_tag] if method.multiple else [method.delivery_tag]
        for tag in tags:
            waiter = self.pending.pop(tag, None)
            if waiter is not None and not waiter.done():
                if isinstance(method, pika.spec.Basic.Ack):
                    waiter.set_result(None)
                else:
                    waiter.set_exception(RuntimeError("RabbitMQ refused (nack) a publish"))

    def _fail_all(self) -> None:
        for waiter in self.pending.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("RabbitMQ connection closed"))
        self.pending.clear()

    async def publish(self, body: bytes) -> None:
        if self.connection.closed.done():
            raise ConnectionError("RabbitMQ connection closed")
        self.next_tag += 1
        waiter = asyncio.get_running_loop().create_future()
        self.pending[self.next_tag] = waiter
        self.connection.channel.basic_publish(self.exchange, "", body, PERSISTENT)
        await waiter

    async def close(self) -> None:
        await self.connection.close()


@dataclass
class _Delivery:
    data: bytes
    channel: object
    tag: int

    async def ack(self) -> None:
        self.channel.basic_ack(self.tag)  # no reply in AMQP 0-9-1: nothing to wait for


class _Subscriber:
    def __init__(self, connection: _Connection):
        self.connection = connection
        self.queue: asyncio.Queue[_Delivery] = asyncio.Queue()

    async def start(self, queue: str, prefetch: int) -> _Subscriber:
        await self.connection.call("basic_qos", prefetch_count=prefetch)
        await self.connection.call("basic_consume", queue, self._received)
        return self

    def _received(self, channel, method, _properties, body: bytes) -> None:
        self.queue.put_nowait(_Delivery(body, channel, method.delivery_tag))

    async def receive(self, timeout: float) -> _Delivery:
        if self.queue.empty():
            return await asyncio.wait_for(self.queue.get(), timeout)
        return self.queue.get_nowait()  # as our client's next_notification: no wait_for task when one waits

    async def flush(self) -> None:
        """Nothing to wait for: basic.ack has no reply."""

    async def close(self) -> None:
        await self.connection.close()  # unacknowledged messages go back to the queue


class RabbitSystem:
    """The workloads' view of RabbitMQ (see ``deploy.compare_workloads.System``)."""

    name = "rabbitmq"

    def __init__(self, server: RabbitServer, prefetch: int = 100):
        self.server = server
        self.prefetch = prefetch
        self.queues: dict[str, list[str]] = {}

    async def create(self, dest: str, subscribers: int) -> list[str]:
        admin = await _Connection.open(self.server.port)
        try:
            await admin.call("exchange_declare", dest, exchange_type="fanout", durable=True)
            queues = self.queues[dest] = [f"{dest}.q{i}" for i in range(max(1, subscribers))]
            for queue in queues:
                await admin.call("queue_declare", queue, durable=True)
                await admin.call("queue_bind", queue, dest)
        finally:
            await admin.close()
        return queues[:subscribers]

    async def publisher(self, dest: str) -> _Publisher:
        return await _Publisher(await _Connection.open(self.server.port), dest).start()

    async def subscriber(self, dest: str, name: str) -> _Subscriber:
        return await _Subscriber(await _Connection.open(self.server.port)).start(name, self.prefetch)

    async def settle(self, dest: str, published: int, timeout: float) -> float:
        return 0.0  # a confirmed message is already in its queues

    async def cleanup(self, dest: str) -> None:
        """Delete the exchange and its queues, so what one run left does not weigh on the next."""
        admin = await _Connection.open(self.server.port)
        try:
            for queue in self.queues.pop(dest, ()):
                await admin.call("queue_delete", queue)
            await admin.call("exchange_delete", dest)
        finally:
            await admin.close()

    async def observe(self) -> dict:
        return {}

    def processes(self) -> dict[str, int]:
        return {"RabbitMQ beam.smp": self.server.beam_pid}
