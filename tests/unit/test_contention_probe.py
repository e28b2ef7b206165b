"""The contention probe puts the job's whole process tree in the mode it measures, then back."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.contention_probe import _job_as, _signal_tree
from deploy.stack import process_tree

# a parent with a child and a grandchild, as the job's driver has its JVM and the JVM its Python workers
TREE = ("import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', "
        "\"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "time.sleep(60)\"]); time.sleep(60)")


def _states(pid: int) -> dict[int, str]:
    return {p: Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()[0] for p in process_tree(pid)}


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _policies(pid: int) -> set[int]:
    return {os.sched_getscheduler(int(thread)) for p in process_tree(pid) for thread in os.listdir(f"/proc/{p}/task")}


@pytest.fixture
def tree():
    root = subprocess.Popen([sys.executable, "-c", TREE])
    try:
        assert _wait_for(lambda: len(list(process_tree(root.pid))) == 3), "the tree did not start"
        yield root.pid
    finally:
        _signal_tree(root.pid, signal.SIGKILL)
        root.wait(10)


def test_every_process_of_the_tree_is_stopped_then_continued(tree):
    with _job_as("stopped", tree):
        assert _wait_for(lambda: set(_states(tree).values()) == {"T"}), _states(tree)
    assert _wait_for(lambda: "T" not in _states(tree).values()), _states(tree)


def test_every_thread_of_the_tree_runs_idle_then_as_before(tree):
    assert _policies(tree) == {os.SCHED_OTHER}
    with _job_as("idle", tree):
        assert _policies(tree) == {os.SCHED_IDLE}
        assert "T" not in _states(tree).values()
    assert _policies(tree) == {os.SCHED_OTHER}
