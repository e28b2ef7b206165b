"""Child processes that die with their launcher, and who holds a port.

``smqp-local`` starts Kafka, the streaming job, a gateway and the dashboard, each in a session of
its own (Ctrl-C in the terminal reaches the launcher alone, which stops them in order).  Killed
any other way (SIGKILL, the OOM killer), the launcher's ``finally`` never runs: without
:func:`dying_with` each child would go on holding its port.  A launch that finds a port taken
says which process holds it (:func:`port_holder`) instead of failing half way.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import signal
import socket
from pathlib import Path
from typing import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def dying_with(parent_pid: int, signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``signum`` when ``parent_pid``
    (the process calling Popen, from its main thread) ends, however it ends.  Linux only;
    elsewhere it does nothing.  A parent that died between the fork and the ``prctl`` is caught
    by the ``getppid`` check.  SIGTERM, not SIGKILL: each child stops cleanly (the gateway says
    NOTIFY SERVER BYE, Kafka closes its log, the job's JVM ends with its driver)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True) \
        if os.uname().sysname == "Linux" else None

    def preexec() -> None:
        if libc is None:
            return
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signum)
    return preexec


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (a bind with SO_REUSEADDR fails only then, not
    for the TIME_WAIT connections a stopped run leaves behind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on ``port`` (any address), from /proc/net/tcp and tcp6."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(inode)
    return inodes


def port_holder(port: int) -> str | None:
    """"pid 1234 (java … kafka.Kafka …)" for the process listening on ``port``, when /proc lets
    us see it (another user's processes are hidden); None otherwise."""
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not sockets:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in sockets:
                        command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                        command = command.strip()
                        return f"pid {proc.name} ({command[:120] + ' …' if len(command) > 120 else command})"
    return None


def taken_ports(ports: dict[str, tuple[str, int]]) -> list[str]:
    """One line per port of ``ports`` (what it is for → host, port) that something listens on,
    naming the process when it can be found."""
    lines = []
    for purpose, (host, port) in ports.items():
        if port and port_in_use(host, port):
            holder = port_holder(port)
            lines.append(f"port {port} ({purpose}) on {host} is in use"
                         + (f" by {holder}" if holder else " (by a process this user cannot see)"))
    return lines
