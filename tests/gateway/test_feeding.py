"""Shared helpers for the gateway tests (imported by the other modules), and
tests of the line reader they all rest on.

``feed_three_ways`` is h11's trick: every input is fed whole, one byte at a
time, and split at random points; all three must produce the same actions.
"""

from __future__ import annotations

import itertools
import random
import textwrap
from datetime import datetime, timezone
from typing import Callable

from gateway.protocol.actions import AuthResult, Consult, Control, Durable, ReadMessages, Send
from gateway.protocol.framing import LineBuffer, Need
from gateway.protocol.session import Session
from gateway.registry import Registry
from schemas.config import GatewayConfig
from schemas.events import CreateTopic

#: 4.1.1's example: ``Time: D20010823T14451246Z``.
SPEC_TIME = datetime(2001, 8, 23, 14, 45, 12, 460000, tzinfo=timezone.utc)
FIRST_SMUID = 2001083408341156
PASSWORDS = {"jtegen": "rowe7kuy", "guest": ""}


def make_config(**overrides) -> GatewayConfig:
    """The gateway configuration the spec's examples imply."""
    values = dict(server_ident="OmicronSoft SMQP Server/1.0 (c) 2001", server_host="www.host.com",
                  default_timeout="00:24:00:00")
    values.update(overrides)
    return GatewayConfig(**values)


def authenticate(user: str, password: str) -> AuthResult:
    if user not in PASSWORDS:
        return AuthResult.UNKNOWN_ACCOUNT
    return AuthResult.OK if PASSWORDS[user] == password else AuthResult.BAD_PASSWORD


#: Topics the spec's examples publish and subscribe to, created before each test.
SPEC_TOPICS = ("/stocks/quotes/ibm", "/stocks/quotes/msft", "/stocks/quotes/sony", "/stocks/ibm/quote",
               "/weather/us/ca/san/forecast", "/news", "/chat", "/a", "/t")


def make_registry(topics=SPEC_TOPICS) -> Registry:
    registry = Registry(is_account=lambda name: name in PASSWORDS, server_timeout="00:24:00:00")
    for offset, topic in enumerate(topics):
        registry.apply(CreateTopic("setup", "admin", topic, 0), offset)
    return registry


def make_session(config: GatewayConfig | None = None, registry: Registry | None = None, **options) -> Session:
    """A session with a fixed clock, ``<user>0456`` GUIDs, SMUIDs counting up, request ids
    ``r1, r2, …`` and a registry holding :data:`SPEC_TOPICS` (``session.registry``)."""
    smuids = itertools.count(FIRST_SMUID)
    requests = itertools.count(1)
    registry = registry or make_registry()
    session = Session(config or make_config(), authenticate, clock=lambda: SPEC_TIME,
                      new_guid=lambda user: f"{user}0456", new_smuid=lambda: next(smuids),
                      registry=registry, new_request=lambda: f"r{next(requests)}",
                      hash_password=lambda password: f"hashed:{password}", **options)
    session.registry = registry  # for the test driver
    session.stored = {}  # topic -> [StoredMessage], what ReadMessages finds
    return session


def resolve(session: Session, actions: list) -> list:
    """Carry out the registry's part of ``actions`` as the gateway would, in order:
    a Consult is decided (final: the test registry is complete), a Control is folded at the
    next offset and followed by the Send of its outcome, a ReadMessages reads ``session.stored``
    (only the SMUIDs of its span, and only their SMUIDs when it asks no more, as the gateway's store
    reads them)."""
    registry = session.registry
    done = []
    for action in actions:
        if isinstance(action, Consult):
            done += resolve(session, action.decide(True))
        elif isinstance(action, Control):
            registry.expect(action.event.request)
            registry.apply(action.event, registry.applied + 1)
            done += [action, Send(registry.outcome(action.event.request).to_bytes())]
        elif isinstance(action, ReadMessages):
            low, high = action.span or (0, float("inf"))
            found = [m for t in action.topics for m in session.stored.get(t, []) if low <= m.smuid <= high]
            if action.smuids_only:
                found = sorted({m.smuid for m in found})
            done += resolve(session, action.render(found))
        else:
            done.append(action)
    return done


LOGIN = b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n\r\n"


def logged_in(config: GatewayConfig | None = None) -> Session:
    session = make_session(config)
    session.receive_data(LOGIN)
    assert session.logged_in
    return session


def run(session: Session, chunks) -> list:
    actions = []
    for chunk in chunks:
        actions += resolve(session, session.receive_data(chunk))
    return actions


def random_chunks(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    if len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(1, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def feed_three_ways(data: bytes, factory: Callable[[], Session] = logged_in, seeds=range(4)) -> list:
    """Feed ``data`` whole, byte by byte and randomly split into fresh sessions;
    assert every way gives the same actions and return them."""
    whole = run(factory(), [data])
    assert run(factory(), [data[i:i + 1] for i in range(len(data))]) == whole, "byte-at-a-time differs"
    for seed in seeds:
        assert run(factory(), random_chunks(data, seed)) == whole, f"random split {seed} differs"
    return whole


def wire(actions) -> bytes:
    """What the client would read, with every Durable append succeeding."""
    return b"".join(a.data if isinstance(a, Send) else a.reply if isinstance(a, Durable) else b""
                    for a in actions)


def transcript(text: str) -> tuple[bytes, bytes]:
    """A spec example (``C:``/``S:`` lines) → (client bytes, server bytes).

    Trailing spaces are the draft's typesetting and are dropped; ``S:``
    alone is an empty line.
    """
    client, server = [], []
    for raw in textwrap.dedent(text).strip("\n").splitlines():
        who, _, rest = raw.strip().partition(":")
        line = (rest[1:] if rest.startswith(" ") else rest).rstrip().encode() + b"\r\n"
        (client if who.upper() == "C" else server).append(line)
    return b"".join(client), b"".join(server)


# -- the line reader


def read_all(buffer: LineBuffer) -> list:
    out = []
    while (line := buffer.read_line()) is not Need.DATA:
        out.append(line)
    return out


def lines_three_ways(data: bytes, limit: int) -> list:
    def collect(chunks):
        buffer, out = LineBuffer(limit), []
        for chunk in chunks:
            buffer.feed(chunk)
            out += read_all(buffer)
        return out
    whole = collect([data])
    assert collect([data[i:i + 1] for i in range(len(data))]) == whole
    assert collect(random_chunks(data, 1)) == whole
    return whole


def test_lines_end_with_crlf_or_bare_lf():
    assert lines_three_ways(b"NOOP\r\nQUIT\n\r\nlast", 100) == [b"NOOP", b"QUIT", b""]


def test_overlong_line_is_reported_once_and_dropped_up_to_its_lf():
    data = b"x" * 50 + b"\r\nNOOP\r\n" + b"y" * 11 + b"\nA" * 3 + b"\n"
    assert lines_three_ways(data, 10) == [Need.LINE_TOO_LONG, b"NOOP", Need.LINE_TOO_LONG, b"A", b"A", b"A"]


def test_line_of_exactly_the_limit_is_accepted():
    assert lines_three_ways(b"x" * 10 + b"\r\n" + b"y" * 11 + b"\r\n", 10) == [b"x" * 10, Need.LINE_TOO_LONG]


def test_overlong_line_is_not_buffered():
    buffer = LineBuffer(10)
    for _ in range(1000):
        buffer.feed(b"z" * 1000)
        buffer.read_line()
        assert len(buffer) <= 1000
    buffer.feed(b"\r\nNOOP\r\n")
    assert read_all(buffer) == [b"NOOP"]
