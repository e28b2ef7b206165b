"""A Spark standalone cluster and a spark-submit of the routing job, as child processes on 127.0.0.1.

:class:`StandaloneCluster` starts one master and N workers from the pip-installed
pyspark package (``SPARK_HOME`` = its directory; it ships ``bin/spark-class`` but
no ``sbin/start-master.sh``).  :class:`SubmittedJob` runs
``deploy/spark-submit.sh`` against it.  Both are context managers that stop
every process they started, by process group, however the block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark

from deploy.broker import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_env(workdir: Path) -> dict[str, str]:
    """Environment for every Spark process here: loopback only, small daemons, scratch under ``workdir``."""
    local_dirs = workdir / "local"
    local_dirs.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
                SPARK_LOCAL_HOSTNAME="127.0.0.1", SPARK_DAEMON_MEMORY="256m",
                SPARK_LOCAL_DIRS=str(local_dirs), PYSPARK_PYTHON=sys.executable)


def get_json(url: str, timeout: float = 30.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log, for assertion messages."""
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"({path} unreadable)"


def stop_group(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM ``process``'s process group, SIGKILL it after ``grace`` seconds."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


class StandaloneCluster:
    """One master and ``workers`` workers of ``cores`` cores and ``memory`` each."""

    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
                 start_timeout: float = 180.0):
        self.workdir = workdir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.start_timeout = start_timeout
        self.port = free_port()
        self.webui_port = free_port()
        self.processes: list[tuple[str, subprocess.Popen]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict:
        """The master's JSON status page: workers, active and completed applications."""
        return get_json(f"http://127.0.0.1:{self.webui_port}/json/")

    def _spawn(self, name: str, *args: str) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / f"{name}.log", "wb")
        process = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=spark_env(self.workdir),
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.processes.append((name, process))

    def __enter__(self) -> StandaloneCluster:
        try:
            self._spawn("master", MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port),
                        "--webui-port", str(self.webui_port))
            wait_for_port("127.0.0.1", self.port, self.start_timeout)
            for index in range(1, self.workers + 1):
                self._spawn(f"worker{index}", WORKER_CLASS, self.url, "--host", "127.0.0.1",
                            "--port", str(free_port()), "--webui-port", str(free_port()),
                            "--cores", str(self.cores), "--memory", self.memory,
                            "--work-dir", str(self.workdir / f"worker{index}"))
            self._wait_for_workers()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            with contextlib.suppress(OSError, ValueError):
                state = self.state()
                if state["status"] == "ALIVE" and state["aliveworkers"] == self.workers:
                    return
            for name, process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}:\n"
                                       f"{tail(self.workdir / f'{name}.log')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.workers} workers not registered with {self.url} after "
                                   f"{self.start_timeout:.0f}s:\n{tail(self.workdir / 'master.log')}")
            time.sleep(0.5)

    def __exit__(self, *exc) -> None:
        for _, process in reversed(self.processes):  # workers first: they stop their executors
            stop_group(process, grace=20)
        self.processes.clear()


class SubmittedJob:
    """``deploy/spark-submit.sh SPARK_ARGS -- JOB_ARGS`` in its own session, logging to ``log``."""

    def __init__(self, spark_args: list[str], job_args: list[str], log: Path, env: dict[str, str]):
        self.command = [str(ROOT / "deploy" / "spark-submit.sh"), *spark_args, "--", *job_args]
        self.log = log
        self.env = env
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> SubmittedJob:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=ROOT, start_new_session=True)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM the script (it forwards to the job's Python driver); its exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def __exit__(self, *exc) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        spark_submit = _children(self.process.pid)  # the JVM runs in a process group of its own
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.stop(timeout=60)
            return
        for pid in spark_submit:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        stop_group(self.process, grace=5)


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(child) for child in (task / "children").read_text().split()]
    return children
