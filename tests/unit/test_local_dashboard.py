"""smqp-local's dashboard: a port the launch chose, taken by another process meanwhile, is chosen again."""

from __future__ import annotations

import socket
import subprocess
import sys

from deploy.local import start_dashboard

#: A stand-in dashboard: binds its port as the real one does, exits at once when it is taken.
LISTENER = "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(60)"


def launcher(launched: list[int], processes: list[subprocess.Popen]):
    def launch(port: int) -> subprocess.Popen:
        launched.append(port)
        processes.append(subprocess.Popen([sys.executable, "-c", LISTENER, str(port)], stderr=subprocess.DEVNULL))
        return processes[-1]
    return launch


def held_port() -> socket.socket:
    """A port another process holds, as a JVM that bound it first would."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    return held


def test_a_chosen_port_another_process_took_first_is_chosen_again():
    launched, processes = [], []
    with held_port() as held:
        taken = held.getsockname()[1]
        try:
            dashboard, port = start_dashboard(launcher(launched, processes), "127.0.0.1", taken, chosen=True)
            assert port != taken and launched == [taken, port]
            assert dashboard.poll() is None  # it listens on the new port
            assert processes[0].wait(10) != 0  # the first one found its port taken
        finally:
            for process in processes:
                process.kill()


def test_a_configured_port_is_never_changed():
    launched, processes = [], []
    with held_port() as held:
        taken = held.getsockname()[1]
        try:
            dashboard, port = start_dashboard(launcher(launched, processes), "127.0.0.1", taken, chosen=False)
            assert port == taken and launched == [taken]
            assert dashboard.wait(10) != 0  # it could not run there; the launch says so and goes on
        finally:
            for process in processes:
                process.kill()
