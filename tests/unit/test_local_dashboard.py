"""smqp-local's dashboard: a port the launch chose, taken by another process meanwhile, is chosen again."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from deploy.local import start_dashboard

#: A stand-in dashboard: binds its port as the real one does, exits at once when it is taken.
LISTENER = "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(60)"


@pytest.fixture
def launched():
    """A launch of stand-in dashboards, with the ports it was given and the processes it started;
    every one is killed at the end."""
    ports, processes = [], []

    def launch(port: int) -> subprocess.Popen:
        ports.append(port)
        processes.append(subprocess.Popen([sys.executable, "-c", LISTENER, str(port)], stderr=subprocess.DEVNULL))
        return processes[-1]

    yield launch, ports, processes
    for process in processes:
        process.kill()


@pytest.fixture
def taken():
    """A port another process holds, as a JVM that bound it first would."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_chosen_port_another_process_took_first_is_chosen_again(launched, taken):
    launch, ports, processes = launched
    dashboard, port = start_dashboard(launch, "127.0.0.1", taken, chosen=True)
    assert port != taken and ports == [taken, port]
    assert dashboard.poll() is None  # it listens on the new port
    assert processes[0].wait(10) != 0  # the first one found its port taken


def test_a_configured_port_is_never_changed(launched, taken):
    launch, ports, _ = launched
    dashboard, port = start_dashboard(launch, "127.0.0.1", taken, chosen=False)
    assert port == taken and ports == [taken]
    assert dashboard.wait(10) != 0  # it could not run there; the launch says so and goes on
