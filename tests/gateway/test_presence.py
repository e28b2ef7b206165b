"""Farm-wide presence at one gateway, with a real Kafka node and no streaming job: the test plays
the job (it writes ``Deliver`` events to the deliveries topic) and the other gateways of the farm
(it writes their ``Presence`` / ``NodeReset`` events to commands partition 0), and reads the NACKs
the gateway appends."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from kafka import KafkaProducer

from gateway.client import SMQPClient
from schemas.events import Deliver, Nack, NodeReset, Presence, decode
from tests.e2e.stack import GatewayThread, commands_records, create_smqp_topics, hashed, stack_config

OTHER_NODE = 7  # a gateway of the farm the test speaks for


def commands(config) -> list:
    """Every event on the commands topic so far (all partitions)."""
    return [decode(r.value) for records in commands_records(config).values() for r in records]


def handed_on(config, account: str, smuid: int) -> list[Nack]:
    return [e for e in commands(config) if isinstance(e, Nack) and (e.account, e.smuid) == (account, smuid)]


def wait_for_nack(config, account: str, smuid: int, timeout: float = 20) -> list[Nack]:
    deadline = time.monotonic() + timeout
    while not (nacks := handed_on(config, account, smuid)):
        assert time.monotonic() < deadline, f"no NACK of {smuid} for {account}"
        time.sleep(0.2)
    return nacks


def deliver(account: str, smuid: int, topic: str = "/q/jobs", delivery: str = "one") -> Deliver:
    return Deliver(account=account, smuid=smuid, topic=topic, cmuid=f"c{smuid}", publisher="pub", publisher_guid="g",
                   accepted_at=int(time.time() * 1_000_000), delivery=delivery)


@pytest.fixture
def farm(broker, tmp_path):
    """A gateway (node 1) where bob is logged in and subscribed to /q/jobs; ann and cat subscribed
    to it too, then logged out before the gateway restarted; a producer writing as the job and as
    the farm's other gateways."""
    config = stack_config(broker, tmp_path, accounts=hashed(ann="a", bob="b", cat="c", dan="d"), node_id=1)
    producer = KafkaProducer(bootstrap_servers=config.kafka.bootstrap, acks="all")

    def write(topic: str, *events, partition: int | None = None) -> None:
        for event in events:
            producer.send(topic, value=event.to_bytes(), partition=partition).get(timeout=30)

    async def subscribe_and_leave(address, name: str) -> None:
        async with await SMQPClient.open(*address, name, name[0]) as client:
            await client.subscribe("/q/jobs")

    with GatewayThread(config) as before_restart:
        asyncio.run(create_smqp_topics(before_restart.address, "/q/jobs", "/q/other"))
        for name in ("ann", "cat"):
            asyncio.run(subscribe_and_leave(before_restart.address, name))
    with GatewayThread(config) as gateway:  # restarted: ann and cat never logged in at this one
        bob = gateway.call(SMQPClient.open(*gateway.address, "bob", "b"))
        gateway.call(bob.subscribe("/q/jobs"))
        try:
            yield config, gateway, write, bob
        finally:
            with contextlib.suppress(Exception):
                gateway.call(bob.close())
            producer.close()


def test_a_one_message_routed_to_an_account_logged_in_nowhere_is_handed_on(farm):
    """ann is logged in at no gateway, bob (who could take the message) is logged in here."""
    config, gateway, write, bob = farm
    write(config.kafka.deliveries_topic, deliver("ann", 101))
    [nack] = wait_for_nack(config, "ann", 101)
    assert nack.reason == "disconnect"


def test_an_account_logged_in_at_another_gateway_keeps_its_message_until_that_gateway_restarts(farm):
    """cat is logged in at node 7 (as far as the farm's presence says): its ONE message is its own.
    Node 7 then starts again (its reset: cat's login there is gone): the message is handed on."""
    config, gateway, write, bob = farm
    write(config.kafka.commands_topic, Presence(OTHER_NODE, "cat", True), partition=0)
    time.sleep(0.5)  # folded
    write(config.kafka.deliveries_topic, deliver("cat", 202), deliver("ann", 203))
    wait_for_nack(config, "ann", 203)  # the gateway has read both deliveries
    assert handed_on(config, "cat", 202) == []
    write(config.kafka.commands_topic, NodeReset(OTHER_NODE), partition=0)
    [nack] = wait_for_nack(config, "cat", 202)
    assert nack.reason == "disconnect"


def test_nothing_is_handed_on_without_a_taker_here_nor_for_delivery_all(farm):
    """A NACK with nobody to release to would count a retry against the message: not sent."""
    config, gateway, write, bob = farm
    write(config.kafka.deliveries_topic, deliver("ann", 301, topic="/q/other"), deliver("ann", 302, delivery="all"),
          deliver("ann", 303))
    wait_for_nack(config, "ann", 303)  # read after the two before it
    assert handed_on(config, "ann", 301) == handed_on(config, "ann", 302) == []


def logged_out(gateway, account: str, timeout: float = 10) -> None:
    """Wait until ``account`` has no login left at ``gateway``."""
    deadline = time.monotonic() + timeout
    while gateway.gateway.sessions.get(account):
        assert time.monotonic() < deadline, f"{account} still logged in"
        time.sleep(0.05)


def read_and_kept(gateway, account: str, smuid: int, timeout: float = 10) -> None:
    """Wait until ``gateway`` has read ``account``'s delivery of ``smuid`` into its book, and check
    that it decided there to hand it on to nobody (the decision is made as the delivery is read;
    its NACK, if any, would follow in Kafka)."""
    deadline = time.monotonic() + timeout
    while not gateway.gateway.book.knows(account, smuid):
        assert time.monotonic() < deadline, f"{account}'s {smuid} never read"
        time.sleep(0.02)
    gateway.call(asyncio.sleep(0))  # a turn of the gateway's loop: the callback that read it has ended
    assert smuid not in gateway.gateway.handed_on.get(account, ())


def test_a_login_here_takes_over_what_is_locked_to_an_account_logged_in_nowhere(farm):
    """A ONE message locked to ann while nobody who could take it is logged in waits for ann;
    once cat (subscribed, logged out) logs in here, it is handed on."""
    config, gateway, write, bob = farm
    gateway.call(bob.close())
    logged_out(gateway, "bob")
    write(config.kafka.deliveries_topic, deliver("ann", 401))
    read_and_kept(gateway, "ann", 401)  # nobody here could take it
    assert handed_on(config, "ann", 401) == []
    cat = gateway.call(SMQPClient.open(*gateway.address, "cat", "c"))  # subscribed to /q/jobs already
    try:
        [nack] = wait_for_nack(config, "ann", 401)
        assert nack.reason == "disconnect"
    finally:
        gateway.call(cat.close())


def test_a_login_here_that_subscribes_takes_over_what_is_locked_to_an_account_logged_in_nowhere(farm):
    """dan is logged in but not subscribed when ann's message arrives (bob gone): it waits; once
    dan subscribes to its topic, it is handed on."""
    config, gateway, write, bob = farm
    gateway.call(bob.close())
    dan = gateway.call(SMQPClient.open(*gateway.address, "dan", "d"))
    try:
        logged_out(gateway, "bob")
        write(config.kafka.deliveries_topic, deliver("ann", 501))
        read_and_kept(gateway, "ann", 501)  # nobody here could take it
        assert handed_on(config, "ann", 501) == []
        gateway.call(dan.subscribe("/q/jobs"))
        [nack] = wait_for_nack(config, "ann", 501)
        assert nack.reason == "disconnect"
    finally:
        gateway.call(dan.close())
