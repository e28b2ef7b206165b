"""The job's ticker through a Kafka crash, against a Kafka node of the test's own."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from deploy.broker import KafkaBroker
from schemas.config import load_config
from streaming.ticker import Ticker
from tests.conftest import kafka_config


def _until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def test_the_ticker_rides_out_a_kafka_crash_and_ends_cleanly_while_kafka_is_down(tmp_path):
    """Ticks resume once Kafka is back; and when its query ends while Kafka is down (a tick still
    waiting for it), the ticker's thread ends within seconds, raising nothing: a thread that died
    with an exception left its producer's threads and connections behind."""
    with KafkaBroker(tmp_path / "kafka") as broker:
        config = replace(load_config(env={}, data_dir=str(tmp_path / "data")), kafka=kafka_config(broker.bootstrap))
        alive = threading.Event()
        alive.set()
        failures = []
        previous_hook, threading.excepthook = threading.excepthook, failures.append
        ticker = Ticker(config, interval=0.5, alive=alive.is_set).start()
        try:
            _until(lambda: ticker.sent >= 2, 30, "tick")
            broker.kill()
            time.sleep(3)  # ticks fail meanwhile; the last one waits in the producer
            broker.start()
            sent = ticker.sent
            _until(lambda: ticker.sent > sent, 60, "tick after the restart")
            broker.kill()
            time.sleep(3)
            alive.clear()  # the query ended, Kafka still down
            ticker._thread.join(30)
            assert not ticker._thread.is_alive()
        finally:
            threading.excepthook = previous_hook
            ticker.stop()
        assert [(f.thread.name, repr(f.exc_value)) for f in failures] == []
