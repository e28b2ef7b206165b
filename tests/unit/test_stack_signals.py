"""A script killed with SIGTERM still stops what it started (deploy.stack.stopping_on_sigterm)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from deploy.stack import stopping_on_sigterm


def test_sigterm_runs_the_finally_blocks_and_the_old_handler_comes_back():
    previous = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(KeyboardInterrupt):
        with stopping_on_sigterm():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                cleaned.append("stopped")
    assert cleaned == ["stopped"]
    assert signal.getsignal(signal.SIGTERM) is previous


def test_outside_the_main_thread_nothing_changes():
    seen = []

    def run():
        with stopping_on_sigterm():
            seen.append(signal.getsignal(signal.SIGTERM))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert seen == [signal.getsignal(signal.SIGTERM)]


def test_a_script_killed_by_timeout_stops_its_child(tmp_path):
    """What `timeout 600 python script.py` does: without the conversion the child outlives it."""
    marker = tmp_path / "child.pid"
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        from deploy.stack import stopping_on_sigterm
        with stopping_on_sigterm():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
            open({str(marker)!r}, "w").write(str(child.pid))
            try:
                time.sleep(60)
            finally:
                child.terminate()
                child.wait(10)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))
    script_process = subprocess.Popen([sys.executable, str(script)], env=env)
    for _ in range(200):
        if marker.exists() and marker.read_text():
            break
        time.sleep(0.05)
    child_pid = int(marker.read_text())
    script_process.send_signal(signal.SIGTERM)
    assert script_process.wait(20) != 0
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)
