"""The whole engine as child processes on 127.0.0.1, for scripts (benchmark, soak run).

``running_stack(accounts)`` starts a one-node Kafka, the streaming job and one
gateway (each its own process, logs in a work directory; the gateway's
Prometheus page on ``config.gateway.status_port``), waits until the job has
routed its first micro-batch (as ``smqp-local`` does before its banner), yields
a :class:`Stack`,
and stops them all (SIGTERM, then SIGKILL) however the block ends, a SIGTERM to the
script itself included (:func:`stopping_on_sigterm`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from deploy.broker import KafkaBroker, create_topics, free_port, wait_for_port
from deploy.local import job_has_routed
from gateway.accounts import hash_password
from schemas.config import SMQPConfig, load_config


@dataclass
class Stack:
    config: SMQPConfig
    workdir: str
    children: dict[str, subprocess.Popen]
    broker: KafkaBroker

    @property
    def address(self) -> tuple[str, int]:
        return self.config.gateway.host, self.config.gateway.port


def process_tree(pid: int) -> Iterator[int]:
    """``pid`` and all its descendants living now (the job's JVM and Python workers)."""
    pending = [pid]
    while pending:
        current = pending.pop()
        yield current
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]


def _tree_status_kb(pid: int, field: str) -> int:
    """``field`` of /proc/<pid>/status (a ``kB`` figure) summed over ``pid`` and all its descendants."""
    total_kb = 0
    for current in process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    total_kb += int(line.split()[1])
    return total_kb


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) used so far by ``pid`` and its living descendants, plus what their
    reaped children used: the difference of two readings is the CPU a workload cost them."""
    ticks = 0
    for current in process_tree(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()
            ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def host_cpu_ticks() -> tuple[int, int]:
    """The machine's CPU ticks so far, from ``/proc/stat``: (all, stolen).  Stolen ticks are time the
    hypervisor gave this VM's vCPUs to someone else; two readings' difference says how much of a run
    the host took away (:func:`steal_percent`)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:8]), fields[7]  # user nice system idle iowait irq softirq steal (guest is in user)


def steal_percent(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the CPU time between two :func:`host_cpu_ticks` readings that was stolen, in %.

    Why: this host's speed drifts about 2x from minute to minute, and most of that drift is steal
    (31 % of a 5-s window once, beside 2 % at other times); a run's figure says which runs to trust."""
    total, stolen = after[0] - before[0], after[1] - before[1]
    return round(100 * stolen / total, 1) if total > 0 else 0.0


def peak_memory_mb(pid: int) -> float:
    """Peak resident memory (VmHWM) of ``pid`` and all its descendants (the job's JVM), in MiB."""
    return round(_tree_status_kb(pid, "VmHWM") / 1024, 1)


def resident_memory_mb(pid: int) -> float:
    """Resident memory now (VmRSS) of ``pid`` and all its descendants, in MiB."""
    return round(_tree_status_kb(pid, "VmRSS") / 1024, 1)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def stopping_on_sigterm() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``KeyboardInterrupt``, so ``finally`` blocks still stop
    what the script started: Python's default for SIGTERM ends the process at once, and the
    children (each in its own session) would keep running, holding ports and CPU, after a
    ``timeout``, a CI job or systemd stopped the script.  The previous handler is put back after.
    Outside the main thread (where signal handlers cannot be set) this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: How long a stack waits for its job's first micro-batch (Spark's start and the routing query's warm-up).
JOB_START_TIMEOUT_S = 300


def wait_for_first_batch(config: SMQPConfig, job: subprocess.Popen, log: str,
                         timeout: float = JOB_START_TIMEOUT_S) -> float:
    """Seconds until the job has routed, committed and announced its first micro-batch.

    Why: the gateway listens within seconds, the job routes 20-70 s later.  A benchmark that began at
    the gateway's port measured its first workload against the job's start (Spark's session and the
    routing query's warm-up on the same two cores): the first ingest run's job CPU was 73-119 µs a
    message where the later runs' was 28-32, its backlog stored 24-66 s after it, not 2-3."""
    started = time.monotonic()
    while not job_has_routed(config, 0):
        if job.poll() is not None:
            raise RuntimeError(f"the streaming job exited with code {job.returncode} before its first batch; "
                               f"see {log}")
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"the streaming job routed no batch within {timeout:g} s; see {log}")
        time.sleep(0.5)
    return time.monotonic() - started


@contextlib.contextmanager
def running_stack(accounts: Mapping[str, str], *, iterations: int = 1000) -> Iterator[Stack]:
    """Broker, job and gateway with ``accounts`` (name → password, hashed here)."""
    with stopping_on_sigterm():
        yield from _running_stack(accounts, iterations)


def _running_stack(accounts: Mapping[str, str], iterations: int) -> Iterator[Stack]:
    workdir = tempfile.mkdtemp(prefix="smqp-stack-")
    # [local_kafka] from the environment (SMQP_LOCAL_KAFKA_FLUSH_EVERY_MESSAGE=true: fsync each append)
    broker = KafkaBroker(f"{workdir}/kafka", settings=load_config().local_kafka).start()
    children: dict[str, subprocess.Popen] = {}
    try:
        listeners = {broker.port, broker.controller_port}
        gateway_port = free_port(avoid=listeners)
        config = load_config(env={}, data_dir=f"{workdir}/data", kafka={"bootstrap": broker.bootstrap},
                             gateway={"port": gateway_port, "status_port": free_port(avoid=listeners | {gateway_port})})
        create_topics(config.kafka)
        config_file = Path(workdir, "smqp.toml")
        config_file.write_text("[accounts]\n" + "".join(
            f'{name} = "{hash_password(password, iterations=iterations)}"\n' for name, password in accounts.items()))
        env = dict(os.environ, SMQP_CONFIG=str(config_file), SMQP_DATA_DIR=config.data_dir,
                   SMQP_KAFKA_BOOTSTRAP=broker.bootstrap, SMQP_GATEWAY_PORT=str(config.gateway.port),
                   SMQP_GATEWAY_STATUS_PORT=str(config.gateway.status_port), PYSPARK_PYTHON=sys.executable)
        for name, module in (("job", "streaming.job"), ("gateway", "gateway.server")):
            children[name] = subprocess.Popen([sys.executable, "-m", module], env=env,
                                              stdout=open(f"{workdir}/{name}.log", "wb"),
                                              stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(config.gateway.host, config.gateway.port, 90)
        wait_for_first_batch(config, children["job"], f"{workdir}/job.log")
        yield Stack(config, workdir, children, broker)
    finally:
        for child in reversed(list(children.values())):
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        broker.stop()
