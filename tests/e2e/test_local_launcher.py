"""``smqp-local`` (the README's run command) starts Kafka, job and gateway; Ctrl-C stops them,
after telling connected clients ``NOTIFY SERVER BYE``; started again on the same data directory,
it goes on where it stopped."""

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
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deploy.broker import free_port
from deploy.stack import process_tree
from gateway.accounts import hash_password
from gateway.client import SMQPClient
from schemas.spark import MESSAGES_TABLE, arrow_schema

pytestmark = pytest.mark.e2e


class Launcher:
    """``python -m deploy.local`` on free ports, as a user runs it; its output in ``log_path``."""

    def __init__(self, tmp_path: Path, config: Path | None = None):
        self.data_dir = tmp_path / "data"
        ports: list[int] = []
        for _ in range(4):  # four listeners of one start: no two on one port
            ports.append(free_port(avoid=ports))
        self.gateway_port, self.broker_port, controller_port, dashboard_port = ports
        self.env = dict(os.environ, SMQP_GATEWAY_PORT=str(self.gateway_port),
                        SMQP_KAFKA_BOOTSTRAP=f"127.0.0.1:{self.broker_port}",
                        SMQP_LOCAL_KAFKA_CONTROLLER_PORT=str(controller_port), SMQP_DASHBOARD_PORT=str(dashboard_port),
                        PYTHONUNBUFFERED="1")
        self.env.pop("SMQP_CONFIG", None)
        self.arguments = ["--data-dir", str(self.data_dir)] + (["--config", str(config)] if config else [])
        self.log_path = tmp_path / "local.log"
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.gateway_port

    def spawn(self) -> None:
        """Start it without waiting; its output is appended to the log."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "deploy.local", *self.arguments], env=self.env,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout: float = 180) -> str:
        """Start it and wait for its banner (returned); the log is appended to across starts."""
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.spawn()
        deadline = time.monotonic() + timeout
        while b"Press Ctrl-C to stop." not in self.log_path.read_bytes()[offset:]:
            assert self.process.poll() is None, self.log_path.read_text()
            assert time.monotonic() < deadline, "launcher did not come up"
            time.sleep(0.2)
        return self.log_path.read_bytes()[offset:].decode()

    def interrupt(self) -> None:
        """Ctrl-C in the launcher's terminal."""
        os.killpg(self.process.pid, signal.SIGINT)

    def wait(self, timeout: float = 90) -> int:
        return self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL it and everything it started (each child leads a session of its own)."""
        if self.process is not None and self.process.poll() is None:
            for current, _ in reversed(_commands(self.process.pid)):
                with contextlib.suppress(OSError):
                    os.kill(current, signal.SIGKILL)
            self.process.wait(10)


def test_local_launcher_runs_the_system_and_stops_cleanly(tmp_path):
    launcher = Launcher(tmp_path)
    gateway_port, broker_port = launcher.gateway_port, launcher.broker_port
    try:
        banner = launcher.start()
        # "running" only once the job routes: its query has planned a micro-batch (Spark's offset log)
        # and announced it, not as soon as the gateway listens while Spark is still starting cold
        assert "routed its first batch" in banner
        assert list((tmp_path / "data" / "checkpoints" / "smqp-router" / "offsets").glob("[0-9]*")), banner
        assert f"127.0.0.1:{gateway_port}" in banner and f"127.0.0.1:{broker_port}" in banner
        assert str(tmp_path / "data" / "tables") in banner
        assert str(tmp_path / "data" / "kafka") in banner
        niceness = _niceness(launcher.process.pid)  # the job's Spark (JVM) yields the CPU to the gateway
        assert {nice for command, nice in niceness if "java" in command and "kafka.Kafka" not in command} == {10}, \
            niceness
        assert {nice for command, nice in niceness if "gateway.server" in command} == {0}, niceness
        # Kafka answers the gateway's every append: it does not yield
        assert {nice for command, nice in niceness if "kafka.Kafka" in command} == {0}, niceness
        if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            # the kernel shares the CPU between sessions first: the job's own session must yield too
            assert _session_nice(launcher.process.pid, "streaming.job") == 10
            assert _session_nice(launcher.process.pid, "gateway.server") == 0
        [job] = [pid for pid, command in _commands(launcher.process.pid) if "-m streaming.job" in command]
        os.killpg(job, signal.SIGKILL)  # the job dies (with its JVM): the launcher starts it again
        deadline = time.monotonic() + 60
        while not [pid for pid, command in _commands(launcher.process.pid)
                   if "-m streaming.job" in command and pid != job]:
            assert time.monotonic() < deadline, "the streaming job was not started again"
            time.sleep(0.2)
        assert b"streaming job exited with code -9; starting it again" in launcher.log_path.read_bytes()

        async def scenario():
            sub = await SMQPClient.connect("127.0.0.1", gateway_port)
            await sub.login("guest")
            await sub.create_topic("/demo/hello")
            assert await sub.subscribe("/demo/*") == ["/demo/hello"]
            published = await asyncio.to_thread(  # the reference command line publishes
                subprocess.run, [sys.executable, "-m", "gateway.client.cli", "--port", str(gateway_port),
                                 "pub", "/demo/hello", "hi there"], capture_output=True, text=True, timeout=60)
            assert published.returncode == 0, published.stderr
            smuid = int(published.stdout)
            note = await sub.next_notification(120)
            assert (note.topic, note.smuid, note.data) == ("/demo/hello", smuid, b"hi there")
            await note.ack()
            launcher.interrupt()
            bye = await sub.next_notification(30)
            assert (bye.resource.upper(), bye.topic.upper()) == ("SERVER", "BYE")
            await asyncio.wait_for(sub.closed.wait(), 30)
            await sub.close()

        asyncio.run(scenario())
        assert launcher.wait(90) == 0
        assert b"stopped." in launcher.log_path.read_bytes()
    finally:
        launcher.kill()


PRIORITIES = 5  # 0..4, higher sent first (2002 revision)
RECEIPTED = 1  # the message of the 200 that asks for a receipt


@pytest.mark.timeout(900)  # two launcher start-ups (a Kafka JVM and a Spark job each) on a loaded 2-core machine
def test_a_restart_on_the_same_data_directory_loses_nothing(tmp_path):
    """What a newcomer does first: publish to a subscriber that is offline, Ctrl-C, ``run-local.sh``
    again, log the subscriber in.  It gets every unexpired message once, highest priority first;
    what it acknowledged before the restart never comes again; the topic, its keywords and the
    subscription are still there; the expired messages are in the topic's Trash; the receipt owed
    for one of them reaches its publisher; and the Delta history holds each message once."""
    config = tmp_path / "smqp.toml"
    config.write_text("[accounts]\n" + "".join(f'{name} = "{hash_password(name, iterations=1000)}"\n'
                                                for name in ("ann", "bob")))
    launcher = Launcher(tmp_path, config)
    try:
        launcher.start()
        before = asyncio.run(_before_the_restart(launcher.address))
        _wait_for_rows(launcher.data_dir / "tables" / "messages", 220)  # the job has routed them: its checkpoint moved
        launcher.interrupt()
        assert launcher.wait(120) == 0
        launcher.start()
        after = asyncio.run(_after_the_restart(launcher.address, before))
        launcher.interrupt()
        assert launcher.wait(120) == 0
    finally:
        launcher.kill()

    unexpired = [smuid for smuid, _, doomed in before["published"] if not doomed]
    priority = {smuid: p for smuid, p, _ in before["published"]}
    assert after["received"] == sorted(unexpired, key=lambda smuid: (-priority[smuid], smuid))
    assert sorted(after["trash"]) == sorted(smuid for smuid, _, doomed in before["published"] if doomed)
    assert (after["keywords"], after["subscriptions"]) == (["IBM", "quotes"], ["/r/quotes"])
    receipted = before["published"][RECEIPTED][0]
    assert after["receipt"] == ("/accounts/ann", "ALL", str(receipted), "1/1")
    messages = DeltaTable(str(launcher.data_dir / "tables" / "messages")).to_pyarrow_table(columns=["smuid"])
    stored = messages.column("smuid").to_pylist()
    everything = before["acknowledged"] + [smuid for smuid, _, _ in before["published"]]
    assert len(stored) == len(set(stored)) and set(everything) <= set(stored)
    # the job went on from its checkpoint: one query, two runs, batch numbers going on
    batches = DeltaTable(str(launcher.data_dir / "tables" / "metrics")).to_pyarrow_table(
        columns=["query_id", "run_id", "batch_id"]).to_pylist()
    runs: dict[str, list[int]] = {}
    for row in batches:
        runs.setdefault(row["run_id"], []).append(row["batch_id"])
    first, second = sorted(runs.values(), key=min)
    assert len({row["query_id"] for row in batches}) == 1 and len(runs) == 2
    assert min(second) >= max(first) and min(second) > 0


def _wait_for_rows(table: Path, count: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not (table / "_delta_log").exists() or DeltaTable(str(table)).to_pyarrow_table(columns=["smuid"]).num_rows < count:
        assert time.monotonic() < deadline, f"{table} has fewer than {count} rows after {timeout} s"
        time.sleep(1)


async def _before_the_restart(address) -> dict:
    """bob subscribes and acknowledges 20 messages, then QUITs (his subscription stays); ann then
    publishes 200 of mixed priorities, one in five with a 3 s Timeout, one asking for a receipt."""
    async with await SMQPClient.open(*address, "ann", "ann") as ann, \
            await SMQPClient.open(*address, "bob", "bob") as bob:
        await ann.create_topic("/r/quotes", ["IBM", "quotes"])
        await bob.subscribe("/r/quotes")
        acknowledged = [await ann.publish("/r/quotes", f"early {n}") for n in range(20)]
        for expected in acknowledged:
            note = await bob.next_notification(120)
            assert note.smuid == expected
            await note.ack()
    async with await SMQPClient.open(*address, "ann", "ann") as ann:
        published = []
        for n in range(200):
            doomed, priority = n % 5 == 0, n * 7 % PRIORITIES
            headers = [("Priority", str(priority)), ("Timeout", "00:00:00:03" if doomed else "INFINITE")]
            smuid = await ann.publish("/r/quotes", f"m{n}", headers=headers + [("Receipt", "ALL")] * (n == RECEIPTED))
            published.append((smuid, priority, doomed))
    return {"acknowledged": acknowledged, "published": published}


async def _after_the_restart(address, before: dict) -> dict:
    doomed = sorted(smuid for smuid, _, gone in before["published"] if gone)
    async with await SMQPClient.open(*address, "ann", "ann") as ann:
        deadline = time.monotonic() + 240
        while sorted(trash := await ann.list_messages("/r/quotes/Trash")) != doomed:  # the job's ticks expire them
            assert time.monotonic() < deadline, f"{len(trash)} of {len(doomed)} expired messages in the Trash"
            await asyncio.sleep(1)
    async with await SMQPClient.open(*address, "bob", "bob") as bob:
        received = []
        wanted = len(before["published"]) - len(doomed)
        while len(received) < wanted:
            note = await bob.next_notification(120)
            received.append(note.smuid)
            await note.ack()
        with pytest.raises(TimeoutError):  # nothing twice, nothing acknowledged before the restart
            await bob.next_notification(5)
        state = {"received": received, "trash": trash, "keywords": sorted(await bob.get_keywords("/r/quotes")),
                 "subscriptions": await bob.list_subscriptions()}
    async with await SMQPClient.open(*address, "ann", "ann") as ann:  # the job writes the receipt once bob ACKed
        receipt = await ann.next_notification(120)
        await receipt.ack()
        state["receipt"] = (receipt.topic, receipt.header("Receipt"), receipt.header("Receipt-For"), receipt.data.decode())
    return state


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


def test_a_job_refusing_its_checkpoint_is_not_started_again(tmp_path):
    """Tables that hold batch 3 of the job's query, and no checkpoint (it was deleted): the job refuses
    to start and says why, and the launcher stops at once rather than starting it five more times."""
    launcher = Launcher(tmp_path)
    write_deltalake(str(launcher.data_dir / "tables" / "messages"), arrow_schema(MESSAGES_TABLE).empty_table(),
                    commit_properties=CommitProperties(app_transactions=[Transaction("smqp-router:messages", 3)]))
    launcher.spawn()
    try:
        assert launcher.wait(timeout=150) == 1
    finally:
        launcher.kill()
    output = launcher.log_path.read_text()
    assert "hold batch 3 of query 'smqp-router', but its checkpoint" in output
    assert "streaming job exited with code 2; stopping" in output and "starting it again" not in output
