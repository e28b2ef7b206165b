"""The Apache Kafka node of the local stack and the tests: one KRaft process on 127.0.0.1.

A single JVM is both broker and controller (``process.roles=broker,controller``), listening on
127.0.0.1 only, with a modest heap.  Its jars come from Maven Central through
``deploy/kafka/pom.xml`` (:mod:`deploy.jars`); everything it keeps lives in one directory:

- ``server.properties`` and ``log4j2.properties``, written at every start;
- ``data/``, Kafka's log, formatted once (``kafka.tools.StorageTool format``) and reused by every
  later start, so a restart keeps every topic and record;
- ``broker.log``, what the JVM prints.

Production runs a Kafka cluster of its own (``deploy/kafka-topics.md``); this node is for one
machine.  Durability: like any Kafka broker by default it acknowledges an append once the record
is in the operating system's page cache, not once it is fsynced, so a killed broker loses
nothing and a power cut may lose the last seconds (``[local_kafka] flush_every_message`` fsyncs
each append first, as RabbitMQ does for persistent messages).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Collection, Iterator

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.protocol.metadata import MetadataRequest

from deploy.jars import classpath, jar_dir
from kafka_edge.cluster import METADATA_VERSION
from kafka_edge.connection import BrokerConnection
from schemas.config import KafkaConfig, LocalKafkaConfig

#: Topic settings of the commands and deliveries topics (deploy/kafka-topics.md says why).  The
#: gateways fold the commands topic from offset 0 at every start, so nothing may ever be deleted.
TOPIC_SETTINGS = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete",
                  "max.message.bytes": "2097152"}

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
# one line when the node is up, and each clean shutdown
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
"""


def kafka_version() -> str:
    """The version of the Kafka jars the node runs (``kafka_2.13-<version>.jar``)."""
    for jar in jar_dir("kafka").glob("kafka_*-*.jar"):
        return jar.stem.rpartition("-")[2]
    raise BrokerError(f"no kafka_*.jar in {jar_dir('kafka')}")


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_RANGE = (32768, 60999)


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel hands out for outgoing connections and for listeners on port 0."""
    try:
        low, high = (int(field) for field in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_RANGE


def free_port(low: int = 10000, tries: int = 200, avoid: Collection[int] = ()) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a listener started later, and
    none of ``avoid`` (the ports chosen already for the other listeners of the same start: each
    choice is random, so two may fall on one port).

    It is chosen at random from ``low`` up to the kernel's ephemeral range, not by binding port 0:
    a port from that range may be handed to one of the many outgoing connections the Kafka JVM and
    Spark open before the listener binds it, and then the listener fails with "address already in
    use" (it did, once, in CI).  Where nothing lies below the range, the ports above it are used."""
    ephemeral_low, ephemeral_high = ephemeral_range()
    choices = range(low, ephemeral_low) if ephemeral_low > low else range(ephemeral_high + 1, 65536)
    pick = random.SystemRandom()  # not the seeded ``random``: two processes must not draw the same ports
    for _ in range(tries if choices else 0):
        port = pick.choice(choices)
        if port in avoid:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # every try was taken: an ephemeral port is better than none
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float = 15.0) -> None:
    """Block until ``host:port`` accepts TCP connections, or raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")
        time.sleep(0.05)


class BrokerError(RuntimeError):
    """The Kafka node could not be formatted or started; the message says why and where its log is."""


class KafkaBroker:
    """One Kafka node in ``directory`` on ``127.0.0.1:port``; a context manager that stops it.

    ``advertised_port``: where clients are told to connect after bootstrapping (another port only
    behind a proxy); ``controller_port``: the KRaft controller's listener (a free port if not given).
    :meth:`start` again after :meth:`stop` or :meth:`kill` reopens the same log."""

    def __init__(self, directory: str | os.PathLike, port: int | None = None, *,
                 settings: LocalKafkaConfig = LocalKafkaConfig(), controller_port: int | None = None,
                 advertised_port: int | None = None, preexec_fn: Callable[[], None] | None = None):
        self.directory = Path(directory).absolute()
        self.preexec_fn = preexec_fn  # run in the JVM's process before it starts (deploy.children.dying_with)
        self.port = port or free_port()
        self.controller_port = controller_port or free_port(avoid={self.port})
        self.advertised_port = advertised_port or self.port
        self.settings = settings
        self.process: subprocess.Popen | None = None
        self.formatted = False  # whether the last start formatted a new, empty log

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.advertised_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "broker.log"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    def _java(self, main: str, *args: str, heap: str) -> list[str]:
        # The serial collector, not G1: a one-node broker's young collections of a small heap are short,
        # and G1's own structures and barriers cost memory and CPU.  Alternating, 4 runs each of
        # ingest and latency: peak RSS 444-463 -> 349-358 MiB, CPU per message at 1,000 msg/s
        # 345-479 -> 298-440 µs, NOTIFY latency within the host's drift; the full comparison's heavier
        # workloads still grow the heap to its cap (467 MiB peak) (bench-results/ab-kafka-serial-gc/).
        return ["java", f"-Xmx{heap}", "-Xms64m", "-XX:+UseSerialGC",
                "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
                "-cp", classpath("kafka"), main, *args]

    def _write_config(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        properties = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.advertised_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.data_dir),
            "auto.create.topics.enable": "false",
            # one node: every internal topic has one replica
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # after a SIGKILL the node waits out its own previous registration before serving again:
            # 9 s by default (measured 11.9 s from start to serving), 3.8 s with these
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "2000",
            # two cores: Kafka's defaults (3 network, 8 I/O threads) only add memory here
            "num.network.threads": "2",
            "num.io.threads": "2",
        }
        if self.settings.flush_every_message:
            properties["log.flush.interval.messages"] = "1"
        path = self.directory / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
        (self.directory / "log4j2.properties").write_text(_LOG4J2)
        return path

    def _format_once(self, config: Path) -> None:
        """Format ``data/`` unless an earlier start did (its ``meta.properties`` is there)."""
        self.formatted = False
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = _cluster_id()
        result = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config),
                                           heap="256m"), capture_output=True, text=True)
        if result.returncode != 0:
            raise BrokerError(f"formatting Kafka's log in {self.data_dir} failed:\n{result.stdout}{result.stderr}")
        self.formatted = True

    def start(self, timeout: float = 60.0) -> KafkaBroker:
        """Start the node (formatting its log the first time) and return once it serves requests."""
        config = self._write_config()
        self._format_once(config)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self._java("kafka.Kafka", str(config), heap=self.settings.heap),
                                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, preexec_fn=self.preexec_fn)
        try:
            self._wait_until_serving(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_until_serving(self, timeout: float) -> None:
        """Until the node answers a Metadata request naming itself as a broker (its port opens
        before the controller is elected and the broker registered).  Asked on its own port, not
        the advertised one, which may be a proxy not listening yet."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerError(f"Kafka exited with code {self.process.returncode} at start; "
                                  f"see {self.log_path}:\n{_tail(self.log_path)}")
            try:
                if asyncio.run(_registered_brokers(self.port)):
                    return
            except (KafkaError, OSError) as error:
                last_error = error
            time.sleep(0.1)
        raise BrokerError(f"Kafka did not serve on 127.0.0.1:{self.port} within {timeout:g}s ({last_error}); "
                          f"see {self.log_path}:\n{_tail(self.log_path)}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM: Kafka closes its log), SIGKILL after ``timeout`` seconds."""
        if not self.running:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash would: what Kafka acknowledged is in the page cache and survives."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def scratch_broker(**options) -> Iterator[KafkaBroker]:
    """A Kafka node in a new temporary directory, removed once the node stopped (scripts, tests)."""
    with tempfile.TemporaryDirectory(prefix="smqp-kafka-") as directory, KafkaBroker(directory, **options) as broker:
        yield broker


def _cluster_id() -> str:
    """A random cluster id as Kafka writes them (URL-safe base64 of 16 bytes), never starting with
    ``-``, which the format tool would take for an option (Kafka's own ``Uuid.randomUuid`` skips those)."""
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cluster_id


async def _registered_brokers(port: int) -> int:
    """How many brokers the node on ``port`` names in its metadata (0 until it has registered)."""
    connection = await BrokerConnection.open("127.0.0.1", port, "smqp-broker-check", timeout=2.0)
    try:
        response = await connection.call(MetadataRequest(topics=[], max_version=METADATA_VERSION), 2.0)
        return len(response.brokers)
    finally:
        connection.close()


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def create_topics(config: KafkaConfig) -> None:
    """Create the commands and deliveries topics (replication 1: one node, :data:`TOPIC_SETTINGS`) and
    wait until they can be used; existing ones are left as they are."""
    admin = KafkaAdminClient(bootstrap_servers=config.bootstrap, client_id="smqp-admin")
    try:
        for name, partitions in ((config.commands_topic, config.commands_partitions),
                                 (config.deliveries_topic, config.deliveries_partitions)):
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics([NewTopic(name, partitions, 1, topic_configs=TOPIC_SETTINGS)])
        # created is not yet usable: each partition's leader reaches the broker's metadata a moment later
        admin.wait_for_topics([config.commands_topic, config.deliveries_topic], timeout_ms=30000)
    finally:
        admin.close()
