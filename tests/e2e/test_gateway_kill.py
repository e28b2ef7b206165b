"""Faults with real processes (issue 6): a gateway killed with SIGKILL while a NOTIFY awaits the
client's ``310 ACK``, and again right after the server's ``310 ACK``.

Property 3: a message whose two-phase ACK completed never comes again; one whose ACK did
not complete comes again after the restart.  The gateway runs as its own process
(``python -m gateway.server``), the streaming job in the test's Spark session.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from deploy.broker import wait_for_port
from gateway.accounts import hash_password
from gateway.client import SMQPClient
from tests.e2e.stack import Router, stack_config
from tests.e2e.test_walking_skeleton import wait_for_acked

pytestmark = pytest.mark.e2e


class GatewayProcess:
    """``python -m gateway.server`` configured by a TOML file and SMQP_* variables."""

    def __init__(self, config, config_file):
        self.config = config
        self.env = dict(os.environ, SMQP_CONFIG=str(config_file), SMQP_DATA_DIR=config.data_dir,
                        SMQP_KAFKA_BOOTSTRAP=config.kafka.bootstrap,
                        SMQP_KAFKA_COMMANDS_TOPIC=config.kafka.commands_topic,
                        SMQP_KAFKA_DELIVERIES_TOPIC=config.kafka.deliveries_topic,
                        SMQP_GATEWAY_PORT=str(config.gateway.port))
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "gateway.server"], env=self.env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port("127.0.0.1", self.config.gateway.port, timeout=90)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def test_sigkill_before_and_after_the_two_phase_ack(broker, spark, tmp_path):
    accounts = {"alice": "alice-pw", "bob": "bob-pw"}
    config_file = tmp_path / "smqp.toml"
    config_file.write_text("[accounts]\n" + "".join(
        f'{name} = "{hash_password(password, iterations=1000)}"\n' for name, password in accounts.items()))
    config = stack_config(broker, tmp_path)
    address = ("127.0.0.1", config.gateway.port)
    gateway = GatewayProcess(config, config_file)

    async def login(account):
        client = await SMQPClient.connect(*address)
        await client.login(account, accounts[account])
        return client

    async def before_kill():
        alice, bob = await login("alice"), await login("bob")
        await alice.create_topic("/k/t")
        await bob.subscribe("/k/t")
        smuids = [await alice.publish("/k/t", f"m{i}") for i in range(3)]
        first = await bob.next_notification(90)
        assert first.smuid == smuids[0]  # ... and bob does not ACK it
        return smuids

    async def after_first_kill(smuids):
        bob = await login("bob")
        again = await bob.next_notification(90)
        assert again.smuid == smuids[0]  # its ACK never happened: delivered again
        await again.ack()
        second = await bob.next_notification(90)
        assert second.smuid == smuids[1]
        await second.ack()  # returns once the server's 310 ACK arrived: both phases done

    async def after_second_kill(smuids):
        bob = await login("bob")
        third = await bob.next_notification(90)
        assert third.smuid == smuids[2]  # never the two acknowledged ones again
        await third.ack()
        with pytest.raises(asyncio.TimeoutError):
            await bob.next_notification(2)
        await bob.quit()

    with Router(spark, config):
        try:
            gateway.start()
            smuids = asyncio.run(before_kill())
            gateway.kill()
            gateway.start()
            asyncio.run(after_first_kill(smuids))
            gateway.kill()
            gateway.start()
            asyncio.run(after_second_kill(smuids))
        finally:
            gateway.stop()
        assert wait_for_acked(config, 3) == (3, 3, 3)
