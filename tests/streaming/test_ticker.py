"""The job's ticker through a Kafka crash, against a Kafka node of the test's own."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

from kafka import KafkaConsumer, TopicPartition

from deploy.broker import KafkaBroker
from schemas.config import load_config
from streaming.ticker import ALARM_HORIZON_US, Ticker
from tests.conftest import kafka_config


def _until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def _values(config, count: int) -> list[bytes]:
    """The first ``count`` record values of commands partition 0."""
    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        consumer.assign([TopicPartition(config.kafka.commands_topic, 0)])
        values = []
        for record in consumer:
            values.append(record.value)
            if len(values) == count:
                break
        return values
    finally:
        consumer.close()


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
            time.sleep(3)  # time itself: Kafka stays down while ticks fall due
            alive.clear()  # the query ended, Kafka still down
            ticker._thread.join(30)
            assert not ticker._thread.is_alive()
        finally:
            threading.excepthook = previous_hook
            ticker.stop()
        assert [(f.thread.name, repr(f.exc_value)) for f in failures] == []


def test_an_alarm_ticks_between_regular_ticks_and_one_beyond_the_horizon_does_not(broker, tmp_path):
    """The sink's alarms (when the deliveries it routed expire) each bring a tick of their own, at or
    after the alarm's time, long before the next regular tick would come."""
    config = replace(load_config(env={}, data_dir=str(tmp_path)), kafka=kafka_config(broker.bootstrap))
    ticker = Ticker(config, interval=600).start()  # one regular tick now, the next in ten minutes
    try:
        _until(lambda: ticker.sent == 1, 30, "first tick")
        now = time.time_ns() // 1000
        ticker.wake_at([now + 300_000, now + 300_001, now + ALARM_HORIZON_US + 60_000_000])
        _until(lambda: ticker.sent == 2, 30, "alarm tick")  # the first two share one step: one tick
        time.sleep(1.0)  # time itself: no third tick within a second (the far alarm is dropped)
        assert ticker.sent == 2
        ticks = [json.loads(value) for value in _values(config, 2)]
        assert ticks[1]["at"] >= now + 300_000
    finally:
        ticker.stop()
