"""A NOTIFY MESSAGE from a peer farm, made into this farm's ``Publish`` or dropped: pure, no I/O.

The link process is an SMQP client of its peers (spec 2.3): what a peer forwards arrives as a plain
NOTIFY MESSAGE, whose ``Smuid`` names the message at its origin farm, whose ``Depth`` says how many
more farms it may reach there (absent: 0), whose ``Hops`` lists the farms it already passed (absent:
none), and whose topic line is its topic at the origin with that farm's domain
(``a.example/news/x``), or a bare local topic when the peer is the origin.  :func:`arrival` reads
those; :func:`forwarded` (a peer's forwarding) and :func:`pulled` (a remote virtual topic's pull)
say where it goes here and with which route; :func:`drop_reason` decides the loop and duplicate
drops; :func:`to_publish` makes the record the link appends to this farm's commands topic.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from gateway.protocol.headers import first_header, message_priority, to_micros
from schemas.events import Headers, Publish, Section
from schemas.timefmt import parse_date_time, parse_timeout
from schemas.topics import canonical, remote_target

#: The attributes a forwarded message's fields carry, not its headers: they are rendered from the
#: fields by the gateways of this farm (``Created`` from the message's own, when it sent one, is
#: kept only to compute its expiry).
SERVER_ATTRIBUTES = frozenset({"created", "smuid", "cmuid", "depth", "hops"})

#: Drop reasons, as the ``/metrics`` counters name them.
OWN_ORIGIN = "own-origin"  # it started here: it came back round a loop
LOOPED = "looped"  # it passed this farm already (this domain is in its Hops)
SPENT = "depth"  # Depth 0 on arrival: the peer should not have forwarded it (an older server)
SEEN = "seen"  # already appended here by another route, or before a crash (the dedup set)
MALFORMED = "malformed"  # no Smuid, a bad Depth, Hops or topic line


class Malformed(ValueError):
    """A NOTIFY that cannot be read as a message of another farm."""


@dataclass(frozen=True)
class Arrival:
    """A NOTIFY MESSAGE from a peer, read: who sent it first, where it has been, what it carries."""

    origin: str  # its SMUID at the origin farm: "a.example/123"
    origin_topic: str  # its topic at the origin farm, with that farm's domain: "a.example/news/x"
    path: str  # that topic without the domain, canonical: "/news/x"
    depth: int  # its Depth at the peer (-1: no limit)
    hops: tuple[str, ...]  # the farms it passed before the peer, oldest first
    headers: Headers  # the publisher's attributes, without :data:`SERVER_ATTRIBUTES`
    sections: list[Section]
    created: int | None  # its Created attribute (microseconds), when it had one

    @property
    def origin_domain(self) -> str:
        return self.origin.rpartition("/")[0].lower()


@dataclass(frozen=True)
class Outbound:
    """Where an arrival goes on this farm and with which route."""

    topic: str
    depth: int
    hops: tuple[str, ...]
    origin_topic: str


def arrival(topic_line: str, headers: Headers, sections: list[Section], peer_domain: str) -> Arrival:
    """Read a NOTIFY MESSAGE that ``peer_domain`` sent; :class:`Malformed` when it cannot be."""
    peer = peer_domain.lower()
    smuid = (first_header(headers, "smuid") or "").strip()
    if not smuid:
        raise Malformed("a NOTIFY MESSAGE without Smuid")
    origin = smuid if "/" in smuid else f"{peer}/{smuid}"
    try:
        target = remote_target(topic_line.strip())
        domain, path = target if target is not None else (peer, canonical(topic_line.strip()))
    except ValueError as error:
        raise Malformed(f"bad topic line {topic_line!r}: {error}") from None
    depth_text = (first_header(headers, "depth") or "0").strip()
    if not depth_text.lstrip("-").isdigit() or int(depth_text) < -1:
        raise Malformed(f"bad Depth {depth_text!r}")
    hops_text = first_header(headers, "hops") or ""
    hops = tuple(hop.strip().lower() for hop in hops_text.split(",") if hop.strip())
    created_text = first_header(headers, "created")
    try:
        created = to_micros(parse_date_time(created_text)) if created_text else None
    except ValueError:
        created = None  # the peer's own rendering; a bad one costs the message its own clock only
    kept = [(name, value) for name, value in headers if name.lower() not in SERVER_ATTRIBUTES]
    return Arrival(origin, f"{domain}{path}", path, int(depth_text), hops, kept, sections, created)


def forwarded(message: Arrival, peer_domain: str) -> Outbound:
    """A peer's forwarding (Depth): the same topic here, one farm further (spec 2.3)."""
    depth = -1 if message.depth == -1 else message.depth - 1
    return Outbound(message.path, depth, (*message.hops, peer_domain.lower()), message.origin_topic)


def pulled(message: Arrival, virtual_topic: str, target: str) -> Outbound:
    """A remote virtual topic's pull (spec 4.1.3): stored on ``virtual_topic`` here, going no further
    (Depth 0), as a message of ``target`` (``b.example/stocks/ibm``) that passed that farm."""
    domain = target.partition("/")[0].lower()
    return Outbound(virtual_topic, 0, (domain, *message.hops), target)


def dedup_key(origin: str, topic: str) -> str:
    """What the dedup set holds: a message's origin SMUID and the topic it is stored on here (two
    virtual topics linking one remote topic each store it once)."""
    return f"{origin} {topic}"


def drop_reason(message: Arrival, outbound: Outbound, own_domain: str, seen: Container[str], *,
                by_depth: bool = True) -> str | None:
    """Why ``message`` is not appended here, or None: it started here, it passed here already, its
    Depth was spent at the peer (``by_depth``: a forwarding, not a pull, which takes every message of
    its target), or it was appended here before."""
    own = own_domain.lower()
    if message.origin_domain == own:
        return OWN_ORIGIN
    if own in message.hops:
        return LOOPED
    if by_depth and message.depth == 0:
        return SPENT
    if dedup_key(message.origin, outbound.topic) in seen:
        return SEEN
    return None


def expiry(message: Arrival, now: int, server_timeout: str) -> int | None:
    """When the message dies here (microseconds): its Timeout from its Created (else from now), or
    this farm's default timeout from now; None for a state message (``Timeout: INFINITE``)."""
    text = first_header(message.headers, "timeout")
    start = message.created if text and message.created is not None else now
    try:
        timeout = parse_timeout(text or server_timeout)
    except ValueError:
        timeout = parse_timeout(server_timeout)
    return None if timeout is None else start + int(timeout.total_seconds() * 1_000_000)


def to_publish(message: Arrival, outbound: Outbound, *, smuid: int, now: int, server_timeout: str,
               delivery: str | None, peer_domain: str) -> Publish:
    """The record appended here: a fresh SMUID of this farm, published by ``peer_domain`` (its link:
    guid ``link``, the origin SMUID as CMUID), no receipts across farms; ``delivery`` is the topic's
    mode here (None: the message's own ``Delivery`` attribute, else ALL)."""
    mode = delivery or first_header(message.headers, "delivery") or "all"
    try:
        priority = message_priority(message.headers)
    except ValueError:  # a peer that does not validate it: the default
        priority = 0
    return Publish(
        smuid=smuid, topic=outbound.topic, cmuid=message.origin, account=peer_domain.lower(), guid="link",
        accepted_at=now, priority=priority, headers=list(message.headers),
        sections=list(message.sections), expires_at=expiry(message, now, server_timeout), receipt="none",
        delivery=mode.lower(), depth=outbound.depth, hops=list(outbound.hops), origin=message.origin,
        origin_topic=outbound.origin_topic)
