"""SMQP command frames for fuzzing, as hypothesis strategies and as a seeded mutator.

The strategies are what ``tests/gateway/test_fuzz.py`` feeds the sans-I/O core; ``deploy.adversary``
draws a pool from the same strategies and multiplies it with :class:`Mutator` (bit flips, cuts,
duplications, splices of two frames) to send a million frames to a running gateway, which
hypothesis alone would take hours to generate.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

#: one valid example of every verb and resource (the spec's own examples where it has one)
VALID = [
    b"COUNT TOPIC /news\r\n", b"COUNT MESSAGE /stocks/quotes/ibm\r\n", b"COUNT SUB /stocks/*\r\n",
    b"LIST TOPIC /\r\n", b"LIST MESSAGES /stocks/quotes/ibm\r\n", b"LIST SUBSCRIPTIONS\r\n",
    b"CREATE TOPIC /stocks/ibm (IBM,BIG BLUE) > /stocks/quotes/ibm\r\n", b"CREATE TOPIC /x/y\r\n",
    b"REMOVE TOPIC /x/y\r\n", b"REM TOPIC /news\r\n", b"SET TOPIC NAME /chat /talk\r\n",
    b"SET TOPIC KEYWORD /news (A,B)\r\n", b"SET LOGIN NAME Jayne Smith\r\n", b"SET LOGIN PASSWORD CLEAR/1.0\r\n",
    b"rowe7kuy\r\n", b"SET NOTIFY SUSPEND\r\n", b"SET NOTIFY RESUME /news\r\n", b"SET NOTIFY PORT 7000\r\n",
    b"FIND TOPIC /stocks/* BLUE\r\n", b"GET MESSAGE /stocks/quotes/ibm 1845-1890,1905\r\n",
    b"GET TOPIC KEYWORDS /news\r\n", b"SUB MESSAGE /stocks/quotes/ibm SINCE D20010915T080000\r\n",
    b"SUB TOPIC /stocks/*\r\n", b"SUB SUB /news\r\n", b"SUB SERVER TIMEOUT\r\n", b"UNSUB MESSAGE *\r\n",
    b"UNSUB TOPIC /stocks/*\r\n", b"UNSUB *\r\n", b"310 ACK\r\n", b"NOOP\r\n", b"QUIT\r\n",
    b"PUB MESSAGE /stocks/quotes/ibm A1\r\nPriority: 3\r\n\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nabc\r\n.\r\n",
    b"PUB REPLY /news R1\r\nCmuid: jtegen/g/A1\r\n\r\n.\r\n",
    b"\r\n",
]

#: what an insertion puts in: the bytes the grammar turns on
TOKENS = [b"\r\n", b" ", b"/*", b"-", b",", b"(", b">", b".\r\n", b"\x00"]
EDITS = ["flip", "cut", "double", "case", "insert"]


@st.composite
def mutated(draw) -> bytes:
    """A valid command with a few bytes flipped, cut, doubled or case-swapped."""
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(EDITS))
        if kind == "flip":
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:]
        elif kind == "double":
            data[at:at] = data[at:]
        elif kind == "case":
            data[at:at + 1] = bytes(data[at:at + 1]).swapcase()
        else:
            data[at:at] = draw(st.sampled_from(TOKENS))
    return bytes(data)


#: one fuzz frame: a mutated command or a few random bytes
frames = st.one_of(mutated(), st.binary(max_size=24))


def frame_pool(size: int, pool_seed: int = 0) -> list[bytes]:
    """``size`` frames drawn from :data:`frames` by hypothesis itself (seeded, generation only:
    no shrinking, no example database), the same list for the same seed."""
    pool: list[bytes] = []

    @seed(pool_seed)
    @settings(max_examples=size, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(frames)
    def collect(frame: bytes) -> None:
        pool.append(frame)

    collect()
    return pool


class Mutator:
    """Seeded byte-level mutations of pool frames: the same seed and pool give the same frames.

    Each frame is a pool frame, sent as it is or after 1-3 edits: a bit flipped, cut short,
    a slice duplicated, spliced with another pool frame, or a grammar token inserted."""

    def __init__(self, pool: list[bytes], mutation_seed: int = 0):
        if not pool:
            raise ValueError("the pool of frames is empty")
        self.pool = pool
        self.random = random.Random(mutation_seed)

    def frame(self) -> bytes:
        data = bytearray(self.random.choice(self.pool))
        for _ in range(self.random.randint(0, 3)):
            self._edit(data)
        return bytes(data)

    def _edit(self, data: bytearray) -> None:
        pick = self.random
        kind = pick.choice(("flip", "truncate", "duplicate", "splice", "insert"))
        if kind == "splice" or not data:
            other = pick.choice(self.pool)
            data[pick.randint(0, len(data)):] = other[pick.randint(0, len(other)):]
        elif kind == "flip":
            at = pick.randrange(len(data))
            data[at] ^= 1 << pick.randrange(8)
        elif kind == "truncate":
            del data[pick.randrange(len(data)):]
        elif kind == "duplicate":
            start = pick.randrange(len(data))
            end = pick.randint(start, min(len(data), start + 64))
            data[end:end] = data[start:end]
        else:
            at = pick.randint(0, len(data))
            data[at:at] = pick.choice(TOKENS)
