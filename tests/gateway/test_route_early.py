"""Routing early: a gateway NOTIFYs a DELIVERY ALL message from its fold of the commands log, without
waiting for the job.  A real Kafka node and no streaming job: the test plays the job where one is
needed (it writes the job's ``Deliver`` and ``Acked`` to the deliveries topic)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from kafka import KafkaProducer

from gateway.client import SMQPClient
from schemas.events import Acked, AckedBatch, Deliver
from tests.e2e.stack import GatewayThread, commands_records, create_smqp_topics, hashed, stack_config

QUIET_S = 1.5  # long enough for a NOTIFY that is coming to arrive (the fold polls every 20 ms)


@contextlib.contextmanager
def gateway_with_bob(broker, tmp_path, **gateway_options):
    """A gateway where bob is logged in, subscribed to ``/news/*``; ann publishes.  Yields
    (config, gateway, ann, bob, write) where ``write`` appends events to the deliveries topic as the job."""
    config = stack_config(broker, tmp_path, accounts=hashed(ann="a", bob="b"),
                          topics={"/work": {"delivery": "one"}}, **gateway_options)
    producer = KafkaProducer(bootstrap_servers=config.kafka.bootstrap, acks="all")

    def write(*events) -> None:
        for event in events:
            producer.send(config.kafka.deliveries_topic, value=event.to_bytes()).get(timeout=30)

    with GatewayThread(config) as gateway:
        asyncio.run(create_smqp_topics(gateway.address, "/news/today", "/work"))
        ann = gateway.call(SMQPClient.open(*gateway.address, "ann", "a"))
        bob = gateway.call(SMQPClient.open(*gateway.address, "bob", "b"))
        gateway.call(bob.subscribe("/news/*"))
        gateway.call(bob.subscribe("/work"))
        try:
            yield config, gateway, ann, bob, write
        finally:
            for client in (ann, bob):
                with contextlib.suppress(Exception):
                    gateway.call(client.close())
            producer.close()


def as_the_job(smuid: int, topic: str = "/news/today") -> Deliver:
    return Deliver("bob", smuid, topic, f"c{smuid}", "ann", "g", 0)


def silent(gateway, client, seconds: float = QUIET_S) -> bool:
    """Whether ``client`` gets no NOTIFY for ``seconds``."""
    try:
        gateway.call(client.next_notification(timeout=seconds), timeout=seconds + 10)
    except TimeoutError:
        return True
    return False


def test_a_subscriber_logged_in_is_notified_with_no_job_running_and_once_only(broker, tmp_path):
    """The publish reaches bob from the gateway's fold alone; the job's later Deliver of the same
    message, after bob's two-phase ACK, brings no second NOTIFY."""
    with gateway_with_bob(broker, tmp_path) as (config, gateway, ann, bob, write):
        smuid = gateway.call(ann.publish("/news/today", "early"))
        note = gateway.call(bob.next_notification(timeout=10))
        assert (note.smuid, note.data) == (smuid, b"early")
        gateway.call(note.ack())
        write(as_the_job(smuid))  # the job routes it afterwards, as it always does
        assert silent(gateway, bob)
        write(Acked("bob", smuid))
        assert gateway.gateway.book.pending_count("bob") == 0
        assert gateway.gateway.metrics.routed_early.get() == 1


def test_an_ack_of_a_message_routed_early_follows_its_publish_in_the_commands_log(broker, tmp_path):
    """The job must never read an ACK before the publish it acknowledges (it would settle nothing,
    and the message would be sent again): with one commands partition, the log's order is the
    job's, and the ACK of a NOTIFY the fold made comes after the publish it folded."""
    with gateway_with_bob(broker, tmp_path) as (config, gateway, ann, bob, write):
        smuid = gateway.call(ann.publish("/news/today", "early"))
        note = gateway.call(bob.next_notification(timeout=10))
        gateway.call(note.ack())
        records = commands_records(config)
    assert list(records) == [0]
    [publish] = [r for r in records[0] if r.value.startswith(b'{"type":"publish"')]
    [ack] = [r for r in records[0] if r.value.startswith(b'{"type":"ack"')]
    assert f'"smuid":{smuid}'.encode() in ack.value and ack.key == b"bob"
    assert ack.offset > publish.offset


def test_without_route_early_only_the_jobs_deliver_notifies(broker, tmp_path):
    with gateway_with_bob(broker, tmp_path, route_early=False) as (config, gateway, ann, bob, write):
        smuid = gateway.call(ann.publish("/news/today", "late"))
        assert silent(gateway, bob)
        write(as_the_job(smuid))
        assert gateway.call(bob.next_notification(timeout=10)).smuid == smuid


def test_the_jobs_acked_batch_settles_each_delivery_in_it(broker, tmp_path):
    """One ``AckedBatch`` record does what an ``Acked`` record per delivery did: the book forgets
    each delivery in it, and those that died unacknowledged (expired) are never sent."""
    def pending_becomes(count: int) -> None:
        deadline = time.monotonic() + 10
        while gateway.gateway.book.pending_count("bob") != count:
            assert time.monotonic() < deadline, f"bob has {gateway.gateway.book.pending_count('bob')} pending"
            time.sleep(0.02)

    def batch(*acked: Acked) -> AckedBatch:
        return AckedBatch([{"type": "acked", "account": a.account, "smuid": a.smuid, "reason": a.reason}
                           for a in acked])

    with gateway_with_bob(broker, tmp_path, route_early=False) as (config, gateway, ann, bob, write):
        smuids = [gateway.call(ann.publish("/news/today", f"m{n}")) for n in range(3)]
        write(*(as_the_job(smuid) for smuid in smuids))
        first = gateway.call(bob.next_notification(timeout=10))  # window 1: the others wait behind it
        assert first.smuid == smuids[0]
        pending_becomes(3)  # all three read (the tail may read the first alone)
        write(batch(*(Acked("bob", smuid, "expired") for smuid in smuids[1:])))
        pending_becomes(1)
        gateway.call(first.ack())
        assert silent(gateway, bob)
        write(batch(Acked("bob", smuids[0])))
        pending_becomes(0)


def test_delivery_one_and_topics_nobody_subscribes_to_are_left_to_the_job(broker, tmp_path):
    """The job picks a DELIVERY ONE message's subscriber; a topic outside bob's patterns is not his."""
    with gateway_with_bob(broker, tmp_path) as (config, gateway, ann, bob, write):
        gateway.call(create_smqp_topics(gateway.address, "/sports"))
        gateway.call(ann.publish("/work", "a job"))
        gateway.call(ann.publish("/sports", "not for bob"))
        assert silent(gateway, bob)


def test_an_early_message_acknowledged_before_a_restart_is_not_notified_again_when_the_job_routes_it(
        broker, tmp_path):
    """bob acknowledges an early NOTIFY; the gateway restarts before the job has run; the job's
    Deliver then comes: it is the ACK read back at start-up that keeps it from bob."""
    with gateway_with_bob(broker, tmp_path) as (config, gateway, ann, bob, write):
        smuid = gateway.call(ann.publish("/news/today", "once"))
        note = gateway.call(bob.next_notification(timeout=10))
        gateway.call(note.ack())
    with GatewayThread(config) as gateway:
        bob = gateway.call(SMQPClient.open(*gateway.address, "bob", "b"))
        try:
            write = KafkaProducer(bootstrap_servers=config.kafka.bootstrap, acks="all")
            write.send(config.kafka.deliveries_topic, value=as_the_job(smuid).to_bytes()).get(timeout=30)
            write.close()
            assert silent(gateway, bob)
        finally:
            gateway.call(bob.close())


@pytest.mark.parametrize("since_offset_s, notified", [(-60, True), (60, False)])
def test_since_bounds_what_is_routed_early(broker, tmp_path, since_offset_s, notified):
    """A subscription whose SINCE lies after the message's acceptance does not admit it (spec 4.1.9.1)."""
    from datetime import datetime, timedelta, timezone
    with gateway_with_bob(broker, tmp_path) as (config, gateway, ann, bob, write):
        gateway.call(bob.subscribe("/news/*", since=datetime.now(timezone.utc) + timedelta(seconds=since_offset_s)))
        gateway.call(ann.publish("/news/today", "dated"))
        assert silent(gateway, bob) is not notified
