"""A planned shutdown (issue 32, item 12): ``NOTIFY SERVER BYE <timeout>`` (spec 4.1.11.4.2) ahead
of the close, and the reference client moving to another gateway of the farm.

The gateways run as ``python -m gateway.server`` processes (their signal handling is what is
tested), or in the test's thread (the farm's second gateway).  The farm's test runs the streaming
job: only through it does the second gateway learn of an ACK the first one took.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from deploy.broker import free_port
from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, Router, create_smqp_topics, stack_config
from tests.e2e.test_gateway_kill import GatewayProcess
from tests.e2e.test_walking_skeleton import ACCOUNTS, wait_for_acked

pytestmark = pytest.mark.e2e


def gateway_process(config, tmp_path, grace_s: float) -> GatewayProcess:
    """A gateway process of ``config`` whose SIGTERM gives clients ``grace_s`` seconds."""
    config_file = tmp_path / f"gateway-{config.gateway.node_id}.toml"
    config_file.write_text("[accounts]\n" + "".join(f'{name} = "{hashed}"\n' for name, hashed in ACCOUNTS.items()))
    gateway = GatewayProcess(config, config_file)
    gateway.env.update(SMQP_GATEWAY_NODE_ID=str(config.gateway.node_id),
                       SMQP_GATEWAY_SHUTDOWN_GRACE_S=str(grace_s))
    return gateway


async def bye(client: SMQPClient, within: float):
    """The NOTIFY SERVER BYE ``client`` gets within ``within`` seconds (other notifications skipped)."""
    deadline = time.monotonic() + within
    while True:
        note = await client.next_notification(max(0.01, deadline - time.monotonic()))
        if note.resource == "SERVER" and note.action == "BYE":
            return note


async def moved(client: SMQPClient, address: tuple[str, int], within: float) -> None:
    """Wait until ``client`` is connected to ``address``."""
    deadline = time.monotonic() + within
    while client.address != address:
        assert time.monotonic() < deadline, f"still on {client.address}, not moved to {address}"
        await asyncio.sleep(0.02)


def test_sigterm_announces_bye_with_the_grace_then_closes_after_it(broker, tmp_path):
    config = stack_config(broker, tmp_path, ACCOUNTS)
    gateway = gateway_process(config, tmp_path, grace_s=3)
    address = ("127.0.0.1", config.gateway.port)
    gateway.start()
    try:
        async def scenario() -> None:
            bob = await SMQPClient.open(*address, "bob", "bob-pw")
            gateway.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            note = await bye(bob, within=2)
            assert note.timeout == "00:00:00:03"  # the grace, ahead of the close
            await bob.noop()  # still served during the grace
            with pytest.raises(OSError):  # but no new session: clients go to another gateway
                await SMQPClient.open(*address, "alice", "alice-pw", timeout=2)
            await asyncio.wait_for(bob.closed.wait(), 10)
            assert time.monotonic() - signalled >= 2.5, "closed before the grace it announced"
        asyncio.run(scenario())
        assert gateway.process.wait(30) == 0
    finally:
        gateway.stop()


def test_ctrl_c_during_the_grace_closes_at_once(broker, tmp_path):
    config = stack_config(broker, tmp_path, ACCOUNTS)
    gateway = gateway_process(config, tmp_path, grace_s=300)
    gateway.start()
    try:
        async def scenario() -> None:
            bob = await SMQPClient.open("127.0.0.1", config.gateway.port, "bob", "bob-pw")
            gateway.process.send_signal(signal.SIGTERM)
            assert (await bye(bob, within=5)).timeout == "00:00:05:00"
            gateway.process.send_signal(signal.SIGINT)
            await asyncio.wait_for(bob.closed.wait(), 10)
        asyncio.run(scenario())
        assert gateway.process.wait(30) == 0
    finally:
        gateway.stop()


def test_admin_bye_shuts_down_the_named_gateway_after_its_grace(broker, tmp_path):
    config = stack_config(broker, tmp_path, ACCOUNTS, node_id=5)
    gateway = gateway_process(config, tmp_path, grace_s=0)
    address = ("127.0.0.1", config.gateway.port)
    gateway.start()
    try:
        async def scenario() -> None:
            bob = await SMQPClient.open(*address, "bob", "bob-pw")
            admin = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.admin", "bye", "--node", "5", "00:00:02", env=gateway.env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            output, _ = await asyncio.wait_for(admin.communicate(), 60)
            assert admin.returncode == 0, output.decode()
            asked = time.monotonic()
            note = await bye(bob, within=15)
            assert note.timeout == "00:00:00:02"
            await bob.noop()
            await asyncio.wait_for(bob.closed.wait(), 10)
            assert time.monotonic() - asked >= 1.5
        asyncio.run(scenario())
        assert gateway.process.wait(30) == 0
    finally:
        gateway.stop()


def test_admin_bye_refuses_a_bad_timeout(broker, tmp_path):
    config = stack_config(broker, tmp_path, ACCOUNTS)
    env = dict(os.environ, SMQP_KAFKA_BOOTSTRAP=config.kafka.bootstrap,
               SMQP_KAFKA_COMMANDS_TOPIC=config.kafka.commands_topic)
    result = subprocess.run([sys.executable, "-m", "gateway.admin", "bye", "--node", "0", "soon"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "bad timeout 'soon'" in result.stderr


def test_a_client_given_the_farm_moves_to_another_gateway_on_bye_and_keeps_its_messages(broker, spark, tmp_path):
    config = stack_config(broker, tmp_path, ACCOUNTS, node_id=1)
    leaving = gateway_process(config, tmp_path, grace_s=2)
    staying_config = replace(config, gateway=replace(config.gateway, port=free_port(), node_id=2))
    first, second = ("127.0.0.1", config.gateway.port), ("127.0.0.1", staying_config.gateway.port)
    leaving.start()
    router = Router(spark, config).start()
    try:
        with GatewayThread(staying_config) as staying:
            async def settled() -> None:
                """The job recorded bob's ACK and the second gateway folded it: nothing pending for bob."""
                await asyncio.to_thread(wait_for_acked, config, 1)
                while await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(pending(), staying.loop)):
                    await asyncio.sleep(0.05)

            async def pending() -> int:
                return staying.gateway.book.pending_count("bob")

            async def scenario() -> None:
                await create_smqp_topics(second, "/farm/t")
                bob = await SMQPClient.open(*first, "bob", "bob-pw", farm=[first, second])
                assert bob.address == first
                await bob.subscribe("/farm/t")
                async with await SMQPClient.open(*second, "alice", "alice-pw") as alice:
                    before = await alice.publish("/farm/t", "before the bye")
                    note = await bob.next_notification(30)
                    assert note.smuid == before
                    await note.ack()
                    await asyncio.wait_for(settled(), 120)
                    leaving.process.send_signal(signal.SIGTERM)
                    assert (await bye(bob, within=5)).timeout == "00:00:00:02"
                    await moved(bob, second, within=1.5)  # well inside the grace
                    await bob.noop()
                    after = await alice.publish("/farm/t", "after the bye")
                    note = await bob.next_notification(30)
                    assert (note.smuid, note.data) == (after, b"after the bye")
                    await note.ack()
                    assert await bob.list_subscriptions() == ["/farm/t"]
                    await alice.quit()
                assert leaving.process.wait(30) == 0
                assert not bob.closed.is_set()  # the gateway that left closed its connection, not ours
                await bob.quit()
            asyncio.run(scenario())
    finally:
        router.stop()
        leaving.stop()
