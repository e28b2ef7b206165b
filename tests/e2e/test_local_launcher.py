"""``smqp-local`` (the README's run command) starts broker, job and gateway; Ctrl-C stops them,
after telling connected clients ``NOTIFY SERVER BYE``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.broker import free_port
from deploy.stack import process_tree
from gateway.client import SMQPClient

pytestmark = pytest.mark.e2e


def test_local_launcher_runs_the_system_and_stops_cleanly(tmp_path):
    gateway_port, broker_port = free_port(), free_port()
    env = dict(os.environ, SMQP_GATEWAY_PORT=str(gateway_port), SMQP_KAFKA_BOOTSTRAP=f"127.0.0.1:{broker_port}",
               PYTHONUNBUFFERED="1")
    env.pop("SMQP_CONFIG", None)
    log = open(tmp_path / "local.log", "w+b")
    launcher = subprocess.Popen([sys.executable, "-m", "deploy.local", "--data-dir", str(tmp_path / "data")],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while b"Press Ctrl-C to stop." not in Path(log.name).read_bytes():
            assert launcher.poll() is None, Path(log.name).read_text()
            assert time.monotonic() < deadline, "launcher did not come up"
            time.sleep(0.2)
        banner = Path(log.name).read_text()
        assert f"127.0.0.1:{gateway_port}" in banner and f"127.0.0.1:{broker_port}" in banner
        assert str(tmp_path / "data" / "tables") in banner
        niceness = _niceness(launcher.pid)  # the job's Spark (JVM) yields the CPU to the gateway
        assert {nice for command, nice in niceness if "java" in command} == {10}, niceness
        assert {nice for command, nice in niceness if "gateway.server" in command} == {0}, niceness
        if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            # the kernel shares the CPU between sessions first: the job's own session must yield too
            assert _session_nice(launcher.pid, "streaming.job") == 10
            assert _session_nice(launcher.pid, "gateway.server") == 0

        async def scenario():
            sub = await SMQPClient.connect("127.0.0.1", gateway_port)
            await sub.login("guest")
            await sub.create_topic("/demo/hello")
            assert await sub.subscribe("/demo/*") == ["/demo/hello"]
            published = await asyncio.to_thread(  # the reference command line publishes
                subprocess.run, [sys.executable, "-m", "gateway.cli", "--port", str(gateway_port),
                                 "pub", "/demo/hello", "hi there"], capture_output=True, text=True, timeout=60)
            assert published.returncode == 0, published.stderr
            smuid = int(published.stdout)
            note = await sub.next_notification(120)
            assert (note.topic, note.smuid, note.data) == ("/demo/hello", smuid, b"hi there")
            await note.ack()
            os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C in the launcher's terminal
            bye = await sub.next_notification(30)
            assert (bye.resource.upper(), bye.topic.upper()) == ("SERVER", "BYE")
            await asyncio.wait_for(sub.closed.wait(), 30)
            await sub.close()

        asyncio.run(scenario())
        assert launcher.wait(90) == 0
        assert b"stopped." in Path(log.name).read_bytes()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        log.close()


def _session_nice(pid: int, module: str) -> int:
    """The nice value of the scheduling group (autogroup) of the process under ``pid`` running ``module``."""
    [child] = [current for current, command in _commands(pid) if module in command]
    return int(Path(f"/proc/{child}/autogroup").read_text().split()[-1])


def _niceness(pid: int) -> list[tuple[str, int]]:
    """(command line, nice) of ``pid`` and every process under it."""
    found = []
    for current, command in _commands(pid):
        with contextlib.suppress(OSError):  # ended meanwhile
            found.append((command, int(Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()[16])))
    return found


def _commands(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of ``pid`` and every process under it still running."""
    found = []
    for current in process_tree(pid):
        with contextlib.suppress(OSError):  # ended meanwhile
            found.append((current, Path(f"/proc/{current}/cmdline").read_bytes().replace(b"\0", b" ").decode()))
    return found
