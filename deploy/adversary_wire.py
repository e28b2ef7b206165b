"""What the adversarial run's clients share: its accounts and topics, raw SMQP connections, and
the counting of replies on them (``python -m deploy.adversary``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import struct


LEGIT_TOPIC = "/adversary/legit"
SLOW_TOPIC = "/adversary/slow"
NOOP_TIMEOUT_S = 5.0  # a legitimate NOOP unanswered by then counts as not served
PASSWORDS = {"legit": "legit-pw-1", "legit_pub": "legit-pw-2", "legit_sub": "legit-pw-3", "victim": "victim-pw-4"}


# -- raw connections

async def open_raw(address, timeout: float = 10.0, limit: int = 1 << 20):
    """A plain TCP connection that closes with a reset (SO_LINGER 0): thousands of closes leave no
    TIME_WAIT behind on either side."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*address, limit=limit), timeout)
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return reader, writer


def abort(writer) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()


class ReplyCounter:
    """Counts server frames (``<code> …`` or ``NOTIFY …`` lines up to an empty line) by their
    first word, from bytes as they come; frames are told apart by the empty line that ends each."""

    def __init__(self, by_line: bool = False):
        self.by_line = by_line  # count whole first lines ("401 Unauthorized (…)"), not codes
        self.codes: collections.Counter = collections.Counter()
        self.last_line = b""
        self.changed = asyncio.Event()  # set at every frame counted and at the end (see _read_into)
        self._tail = b""

    def feed(self, data: bytes) -> None:
        chunks = (self._tail + data).split(b"\r\n\r\n")
        self._tail = chunks.pop()[-65536:]
        for chunk in chunks:
            line = chunk.lstrip(b"\r\n").split(b"\r\n", 1)[0]
            if line:
                word = line[:3] if line[:3].isdigit() else line.split(b" ", 1)[0]
                if not (word.isdigit() or word in (b"+", b"NOTIFY")):
                    word = b"(inside a NOTIFY's data)"  # a data section's own empty lines
                self.codes[(line[:80] if self.by_line else word).decode("ascii", "replace")] += 1
                self.last_line = line[:120]
                self.changed.set()

    @property
    def frames(self) -> int:
        return sum(self.codes.values())


def error_name(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno:
        return f"{type(error).__name__}[{os.strerror(error.errno)}]"
    return type(error).__name__
