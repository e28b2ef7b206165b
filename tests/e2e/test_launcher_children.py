"""``smqp-local``'s children die with it (issue 32, item 13): killed with SIGKILL, or its output
pipe closed, the launcher leaves no Kafka, Spark JVM, gateway or dashboard holding a port; and a
launch whose port is taken says which process holds it.

The launcher runs as a user runs it (``python -m deploy.local``), each test bounded: it does not
wait for the streaming job's first micro-batch, only until every child (the job's JVM included)
is running and the gateway listens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.children import port_in_use
from tests.e2e.test_local_launcher import Launcher, _commands

pytestmark = pytest.mark.e2e

CHILDREN = {"Kafka": "kafka.Kafka", "streaming job": "-m streaming.job", "Spark JVM": "org.apache.spark.deploy.SparkSubmit",
            "gateway": "-m gateway.server", "dashboard": "-m deploy.dashboard"}


def _launch(launcher: Launcher, stdout) -> None:
    launcher.process = subprocess.Popen([sys.executable, "-m", "deploy.local", *launcher.arguments], env=launcher.env,
                                        stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True)


def _running_children(launcher: Launcher, timeout: float = 180) -> dict[int, str]:
    """Once every child of :data:`CHILDREN` runs and the gateway listens: pid -> command line of
    everything under the launcher."""
    deadline = time.monotonic() + timeout
    while True:
        assert launcher.process.poll() is None, f"the launcher exited with {launcher.process.returncode}"
        tree = dict(_commands(launcher.process.pid))
        del tree[launcher.process.pid]
        missing = [name for name, mark in CHILDREN.items() if not any(mark in command for command in tree.values())]
        if not missing and port_in_use("127.0.0.1", launcher.gateway_port):
            return tree
        assert time.monotonic() < deadline, f"not running after {timeout} s: {missing}"
        time.sleep(0.5)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _assert_all_gone(children: dict[int, str], ports: dict[str, int], within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        left = {pid: command[:100] for pid, command in children.items() if _alive(pid)}
        held = {name: port for name, port in ports.items() if port_in_use("127.0.0.1", port)}
        if not left and not held:
            return
        if time.monotonic() > deadline:
            for pid in left:  # leave nothing behind for the next test
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            pytest.fail(f"{within:g} s after the launcher died: still running {left}, ports held {held}")
        time.sleep(0.2)


def _ports(launcher: Launcher) -> dict[str, int]:
    return {"gateway": launcher.gateway_port, "Kafka": launcher.broker_port,
            "controller": int(launcher.env["SMQP_LOCAL_KAFKA_CONTROLLER_PORT"]),
            "dashboard": int(launcher.env["SMQP_DASHBOARD_PORT"])}


@pytest.mark.timeout(420)
def test_children_die_with_a_launcher_killed_by_sigkill(tmp_path):
    launcher = Launcher(tmp_path)
    try:
        with open(launcher.log_path, "ab") as log:
            _launch(launcher, log)
        children = _running_children(launcher)
        launcher.process.send_signal(signal.SIGKILL)
        launcher.process.wait(10)
        _assert_all_gone(children, _ports(launcher), within=60)
    finally:
        launcher.kill()


@pytest.mark.timeout(420)
def test_children_are_stopped_when_the_launchers_output_pipe_closes_and_it_is_interrupted(tmp_path):
    """``smqp-local | tee log`` and Ctrl-C: the reader of the pipe is gone before the launcher
    prints "stopping …"; it must stop its children all the same."""
    launcher = Launcher(tmp_path)
    read_end, write_end = os.pipe()
    try:
        _launch(launcher, write_end)
        os.close(write_end)
        reader = os.fdopen(read_end, "rb", buffering=0)
        children = _running_children(launcher)
        reader.close()  # tee ended
        launcher.interrupt()
        assert launcher.process.wait(120) is not None
        _assert_all_gone(children, _ports(launcher), within=60)
    finally:
        launcher.kill()


def test_a_launch_whose_port_is_taken_names_the_port_and_its_holder(tmp_path):
    launcher = Launcher(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", launcher.gateway_port))
        holder.listen()
        result = subprocess.run([sys.executable, "-m", "deploy.local", *launcher.arguments], env=launcher.env,
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"port {launcher.gateway_port} (SMQP gateway)" in result.stderr, result.stderr
    assert f"pid {os.getpid()} (" in result.stderr, result.stderr  # this test holds it
    assert "Traceback" not in result.stdout + result.stderr
    assert not port_in_use("127.0.0.1", launcher.broker_port), "started Kafka anyway"
