"""``smqp-link`` as a process: its --help, its configuration file, its signals; smqp-local starts it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace

import pytest

from deploy.broker import free_port
from deploy.local import child_modules, with_link_status_port
from gateway.metrics import parse
from schemas.config import FederationConfig, LinkConfig, SMQPConfig
from tests.e2e.stack import GatewayThread, create_smqp_topics
from tests.federation.farms import (LINK_ENV, farm_config, holds, received, nothing_more, publish, subscriber,
                                    until)

A, B = "a.example", "b.example"


def test_smqp_local_starts_the_link_process_only_when_links_are_configured():
    linked = replace(SMQPConfig(), federation=FederationConfig(links=(LinkConfig("a.example", "127.0.0.1:7720"),)))
    assert ("federation link", "federation") in child_modules(linked)
    assert [name for name, _ in child_modules(SMQPConfig())] == ["streaming job", "gateway"]
    assert with_link_status_port(linked).federation.status_port > 0  # the local dashboard shows the links
    assert with_link_status_port(SMQPConfig()).federation.status_port == 0


def test_help_names_the_configuration():
    done = subprocess.run([sys.executable, "-m", "federation", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "[[federation.links]]" in done.stdout and "--config" in done.stdout


def toml_of(config: SMQPConfig, link_port: int, status_port: int) -> str:
    """The link process's configuration file for farm B of ``config``."""
    return (f'[kafka]\nbootstrap = "{config.kafka.bootstrap}"\ncommands_topic = "{config.kafka.commands_topic}"\n'
            f'deliveries_topic = "{config.kafka.deliveries_topic}"\n'
            f'[gateway]\nserver_host = "{B}"\n'
            f'[federation]\nstatus_port = {status_port}\nretry_initial_s = 0.1\nretry_max_s = 1.0\n'
            f'[[federation.links]]\ndomain = "{A}"\naddress = "127.0.0.1:{link_port}"\naccount = "blink"\n'
            'password_env = "LINK_PASSWORD"\n')


@pytest.mark.e2e
def test_the_process_forwards_serves_metrics_and_stops_on_sigterm(broker, tmp_path):
    a_config = farm_config(broker, tmp_path, A, peers=[B])
    b_config = farm_config(broker, tmp_path, B, users=["bob"])
    status_port = free_port()
    path = tmp_path / "link.toml"
    with GatewayThread(a_config) as a_gateway, GatewayThread(b_config) as b_gateway:
        path.write_text(toml_of(b_config, a_gateway.address[1], status_port))
        env = {**os.environ, **LINK_ENV}
        env.pop("SMQP_CONFIG", None)
        link = subprocess.Popen([sys.executable, "-m", "federation", "--config", str(path)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            async def scenario() -> None:
                for gateway in (a_gateway, b_gateway):
                    await create_smqp_topics(gateway.address, "/news/x")
                bob = await subscriber(b_gateway.address, "bob", "/news/*")
                await until(holds(a_gateway, "blink", "/news/*"), "the link process subscribed on A", 90)
                await publish(a_gateway.address, "/news/x", "via the process", depth=1)
                assert [n.data for n in await received(bob, 1)] == [b"via the process"]
                await nothing_more(bob, 1.0)
                await bob.quit()

            started = time.time()
            asyncio.run(scenario())
            with urllib.request.urlopen(f"http://127.0.0.1:{status_port}/metrics", timeout=5) as page:
                text = page.read().decode()
            assert f'smqp_link_forwarded_total{{link="{A}"}} 1' in text
            # the message's age when B appended it: from A's Created (to the second) to B's append
            lag = parse(text)["smqp_link_lag_seconds"].samples
            assert [labels for _, labels, _ in lag] == [{"link": A}]
            assert 0 < lag[0][2] < time.time() - started + 1
            link.send_signal(signal.SIGTERM)
            out, err = link.communicate(timeout=30)
            assert link.returncode == 0, err
            assert f"SMQP link of {B} running (links: {A})" in out
            assert "logged in at" in err  # its log
        finally:
            if link.poll() is None:
                link.kill()
                link.communicate(timeout=10)


def test_a_link_process_that_cannot_reach_kafka_says_so_and_exits_1(tmp_path):
    path = tmp_path / "link.toml"
    path.write_text(f'[kafka]\nbootstrap = "127.0.0.1:{free_port()}"\n')
    env = {name: value for name, value in os.environ.items() if not name.startswith("SMQP_")}
    done = subprocess.run([sys.executable, "-m", "federation", "--config", str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "smqp-link could not start" in done.stderr
