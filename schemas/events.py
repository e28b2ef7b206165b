"""Events on the Kafka topics, as plain dataclasses with one JSON encoding.

``smqp.commands`` (written by gateways, read by the streaming job) carries
:class:`Publish`, :class:`Subscribe`, :class:`Unsubscribe`, :class:`Ack` (in a partition of
their own, the last, by default) and :class:`Nack`,
which the job routes, and the control events the gateways' topic registry
folds (:class:`CreateTopic`, :class:`RemoveTopic`, :class:`RenameTopic`,
:class:`SetTopicKeywords`, :class:`SetLogin`, :class:`Watch`,
:class:`Unwatch`, :class:`SetServerTimeout`, :class:`Sync`), which the job
ignores, the gateways' farm-wide presence (:class:`Presence`, :class:`NodeReset`),
which the job ignores too, and the job's own :class:`Tick` (its clock), which the
gateways ignore.  Every event that changes the registry (and ``Sync``) goes to
partition 0, so all gateways fold them in one order.
``smqp.deliveries`` (written by the job, tailed by gateways) carries
:class:`Deliver`, :class:`Acked` (mostly several to a record: :class:`AckedBatch`) and
:class:`Progress`.

Every event is one JSON object with a ``type`` field.  Message data is
base64 so that binary bodies survive JSON; :mod:`schemas.spark` describes
the same objects as Spark types, so the job parses them with ``from_json``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from json.encoder import encode_basestring_ascii as _json_str
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping

Headers = list[tuple[str, str]]


@dataclass
class Section:
    """One data section of a message: its data header lines and its bytes."""

    headers: Headers
    data: bytes

    def to_json(self) -> dict:
        return {"headers": [list(h) for h in self.headers], "data": base64.b64encode(self.data).decode()}

    @classmethod
    def from_json(cls, obj: dict) -> Section:
        # a2b_base64 is what b64decode runs after turning the text into bytes
        return cls([tuple(h) for h in obj["headers"]], binascii.a2b_base64(obj["data"]))


# --------------------------------------------------------------------------
# The wire encoding, written by hand: exactly what ``json.dumps(body, separators=(",", ":"))``
# writes for the body dict :meth:`_Event.to_json` describes (``ensure_ascii``, keys in field
# order), at a fraction of its cost per message.  tests/unit/test_events_wire.py holds both
# side by side.


def _json_any(value: Any) -> str:
    """A field value as ``json.dumps`` writes it: str, int, None and bool directly, the rest
    (lists of keywords, dicts of offsets, floats) through ``json.dumps`` itself."""
    kind = type(value)
    if kind is str:
        return _json_str(value)
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    return json.dumps(value, separators=(",", ":"))


def _json_headers(headers: Headers) -> str:
    """``[["Name","value"],…]``; anything but (str, str) pairs goes through ``json.dumps``."""
    try:
        return "[" + ",".join(["[" + _json_str(name) + "," + _json_str(value) + "]"
                               for name, value in headers]) + "]"
    except (TypeError, ValueError):
        return json.dumps([list(h) for h in headers], separators=(",", ":"))


def _json_section(section: Section) -> str:
    """:meth:`Section.to_json` as JSON text (base64 text needs no escaping)."""
    data = binascii.b2a_base64(section.data, newline=False).decode("ascii")  # b64encode's own
    return '{"headers":' + _json_headers(section.headers) + ',"data":"' + data + '"}'


def _json_sections(sections: list[Section]) -> str:
    """A list of sections as JSON text."""
    return "[" + ",".join([_json_section(s) for s in sections]) + "]"


_FIELD_ENCODERS: Mapping[str, Callable[[Any], str]] = MappingProxyType({"headers": _json_headers,
                                                                         "sections": _json_sections})


@lru_cache(maxsize=None)
def _layout(cls: type) -> tuple[str, tuple[tuple[str, str, Callable[[Any], str]], ...]]:
    """(``{"type":"<TYPE>"``, then per field its ``,"name":`` key, name and value encoder)."""
    return '{"type":' + _json_str(cls.TYPE), tuple(
        (',"' + f.name + '":', f.name, _FIELD_ENCODERS.get(f.name, _json_any)) for f in fields(cls))


@dataclass
class _Event:
    """Base: JSON round trip shared by every event type."""

    TYPE: ClassVar[str] = ""

    def to_json(self) -> dict:
        """The JSON object: ``type``, then every field in order (headers as lists, sections
        as objects with base64 data)."""
        body = {"type": self.TYPE}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "sections":
                value = [s.to_json() for s in value]
            elif f.name == "headers":
                value = [list(h) for h in value]
            body[f.name] = value
        return body

    @classmethod
    def head(cls) -> bytes:
        """How every encoded event of this type begins (``{"type":"<TYPE>"``): a record's type, told
        without decoding it."""
        return _layout(cls)[0].encode()

    def to_bytes(self) -> bytes:
        """:meth:`to_json` as compact JSON (``json.dumps`` with ``separators=(",", ":")``),
        rendered by hand: the gateway encodes every message it accepts and every ACK."""
        head, layout = _layout(type(self))
        return (head + "".join([key + encode(getattr(self, name)) for key, name, encode in layout]) + "}").encode()


@dataclass
class Publish(_Event):
    """A guaranteed PUBLISH MESSAGE accepted by a gateway (not yet durable)."""

    TYPE: ClassVar[str] = "publish"
    smuid: int
    topic: str  # canonical topic
    cmuid: str
    account: str
    guid: str
    accepted_at: int  # microseconds since the epoch, gateway clock
    priority: int = 0
    headers: Headers = field(default_factory=list)  # message header attributes in order
    sections: list[Section] = field(default_factory=list)
    # when the message's timeout runs out (microseconds): its Timeout attribute, else the server
    # default, counted from acceptance; None for a state message (Timeout: INFINITE)
    expires_at: int | None = None
    receipt: str = "none"  # RECEIPT: "none" | "one" | "all" (draft-04's YES/NO read as ONE/NONE)
    # DELIVERY (2002): "all" subscribers, or "one" of them; the topic's mode (SET TOPIC DELIVERY,
    # else its configured one) overrides the message's Delivery attribute
    delivery: str = "all"
    # Federation (spec 2.3, DEPTH and the 2002 HOPS): how many more farms the message may be forwarded
    # to (0: none, -1: no limit), the domains it already passed (oldest first; empty for a local
    # publish), and for a message another farm forwarded, its SMUID there ("b.example/123") and its
    # topic there with that domain ("b.example/stocks/ibm"), which NOTIFY MESSAGE shows.
    depth: int = 0
    hops: list[str] = field(default_factory=list)
    origin: str | None = None
    origin_topic: str | None = None


@dataclass
class Subscribe(_Event):
    """SUBSCRIBE MESSAGE ``pattern`` (an exact topic or ``/a/b/*``).

    ``since`` / ``until`` (microseconds, optional): only messages accepted at
    or after ``since`` are delivered; at ``until`` the subscription ends.  A
    repeated SUBSCRIBE redefines both.
    """

    TYPE: ClassVar[str] = "subscribe"
    account: str
    guid: str
    pattern: str
    accepted_at: int
    since: int | None = None
    until: int | None = None
    request: str = ""  # the gateway's id for awaiting this event's fold


@dataclass
class Unsubscribe(_Event):
    """UNSUBSCRIBE MESSAGE ``pattern``; a wildcard ``/a/*`` ends every pattern under ``/a/``,
    ``/*`` ends them all (``UNSUB MESSAGE *``)."""

    TYPE: ClassVar[str] = "unsubscribe"
    account: str
    guid: str
    pattern: str
    accepted_at: int
    request: str = ""
    everything: bool = False  # ``UNSUB *``: topic and subscriber watches end too


@dataclass
class Ack(_Event):
    """A subscriber's ``310 ACK`` of a NOTIFY, made durable before the server's ``310 ACK``.

    Keyed by its account, it follows its message's publish in the commands log: with one commands
    partition by the log's order, with more because the gateway NOTIFYs only what the job routed."""

    TYPE: ClassVar[str] = "ack"
    account: str
    guid: str
    smuid: int
    accepted_at: int


@dataclass
class Nack(_Event):
    """A NOTIFY went unacknowledged: the subscriber's ``310 ACK`` did not come within the topic's
    retry timeout (``reason`` "timeout"; the gateway sends it again), so the job counts one retry
    and moves the message to the Trash once ``max_retries`` (the topic's, stamped by the gateway)
    are used up.  ``reason`` "disconnect": the account's last login here ended with this
    DELIVERY ONE message still locked to it.  A NACKed DELIVERY ONE message is offered to another
    subscriber instead, when there is one."""

    TYPE: ClassVar[str] = "nack"
    account: str
    guid: str
    smuid: int
    accepted_at: int
    max_retries: int
    reason: str = "timeout"


@dataclass
class CreateTopic(_Event):
    """CREATE TOPIC ``topic`` [``(keywords)``] [``> target``]; missing ancestors are created too."""

    TYPE: ClassVar[str] = "create_topic"
    request: str
    account: str
    topic: str
    accepted_at: int
    keywords: list[str] = field(default_factory=list)
    target: str | None = None  # a virtual topic's actual topic


@dataclass
class RemoveTopic(_Event):
    """REMOVE TOPIC ``topic`` (and its descendants)."""

    TYPE: ClassVar[str] = "remove_topic"
    request: str
    account: str
    topic: str
    accepted_at: int


@dataclass
class RenameTopic(_Event):
    """SET TOPIC NAME ``topic`` ``new_topic`` (descendants move along)."""

    TYPE: ClassVar[str] = "rename_topic"
    request: str
    account: str
    topic: str
    new_topic: str
    accepted_at: int


@dataclass
class SetTopicKeywords(_Event):
    """SET TOPIC KEYWORD ``topic`` ``(keywords)``: replaces the topic's keywords."""

    TYPE: ClassVar[str] = "set_topic_keywords"
    request: str
    account: str
    topic: str
    keywords: list[str]
    accepted_at: int


@dataclass
class SetTopicDelivery(_Event):
    """SET TOPIC DELIVERY ``topic`` ALL|ONE (2002 revision): the topic's delivery mode, which a
    message's ``Delivery`` attribute cannot override."""

    TYPE: ClassVar[str] = "set_topic_delivery"
    request: str
    account: str
    topic: str
    delivery: str  # "all" | "one"
    accepted_at: int


@dataclass
class SetLogin(_Event):
    """SET LOGIN ``attribute`` (name, email, address, phone, or password: ``value`` is then a hash)."""

    TYPE: ClassVar[str] = "set_login"
    request: str
    account: str
    attribute: str
    value: str
    accepted_at: int


@dataclass
class Watch(_Event):
    """SUBSCRIBE TOPIC / SUBSCRIBER ``pattern``: ``kind`` is ``topic`` or ``subscribers``."""

    TYPE: ClassVar[str] = "watch"
    request: str
    account: str
    kind: str
    pattern: str
    accepted_at: int


@dataclass
class Unwatch(_Event):
    """UNSUBSCRIBE TOPIC / SUBSCRIBER ``pattern`` (wildcards cover, as for :class:`Unsubscribe`)."""

    TYPE: ClassVar[str] = "unwatch"
    request: str
    account: str
    kind: str
    pattern: str
    accepted_at: int


@dataclass
class SetServerTimeout(_Event):
    """The administrator changed the server's default message timeout."""

    TYPE: ClassVar[str] = "set_server_timeout"
    request: str
    timeout: str
    accepted_at: int


@dataclass
class Sync(_Event):
    """A barrier: once a gateway has folded it, it has seen everything appended before it."""

    TYPE: ClassVar[str] = "sync"
    request: str


@dataclass
class Presence(_Event):
    """Gateway ``node`` has ``account`` logged in (``present``: its first login there started) or no
    longer (its last login there ended).

    Every gateway folds these into one farm-wide map (``gateway.server.presence``), so a DELIVERY ONE
    message routed to an account logged in nowhere is handed on to a subscriber who is logged in.
    No ``accepted_at``: the job's clock is read from that field, and it ignores these events."""

    TYPE: ClassVar[str] = "presence"
    node: int  # the gateway's node_id
    account: str
    present: bool


@dataclass
class NodeReset(_Event):
    """Gateway ``node`` has nobody logged in: appended when it starts (its previous incarnation's
    logins are gone, even after a crash) and when it stops cleanly."""

    TYPE: ClassVar[str] = "node_reset"
    node: int


@dataclass
class PlannedShutdown(_Event):
    """The administrator stops gateway ``node`` (``python -m gateway.admin bye``): it tells its
    clients ``NOTIFY SERVER BYE <grace>``, serves them that long, then closes.  No ``accepted_at``:
    the job ignores it, as it does presence."""

    TYPE: ClassVar[str] = "planned_shutdown"
    request: str
    node: int
    grace: str  # a timeout, as the Timeout attribute: dd:hh:mm:ss[:ff] or hh:mm:ss


@dataclass
class Tick(_Event):
    """The streaming job's clock (commands partition 0, every ``streaming.tick_interval_s``).

    Micro-batches only run when commands arrive; ticks make time-based rules
    (expiry) fire with no traffic.  A batch's "now" is the largest tick ``at``
    or ``accepted_at`` it holds, so a replayed batch decides the same way.
    Gateways ignore ticks.
    """

    TYPE: ClassVar[str] = "tick"
    at: int  # microseconds since the epoch, the job's clock

    @classmethod
    def encodes(cls, value: bytes | None) -> bool:
        """Whether a commands record's ``value`` is a tick, told without decoding it (the encoding
        opens with the type): the job's reader must not take its own clock for traffic."""
        return value is not None and value.startswith(_TICK_HEAD)


#: How every encoded :class:`Tick` begins (``{"type":"tick"``).
_TICK_HEAD = Tick.head()


@dataclass
class Deliver(_Event):
    """The job routed message ``smuid`` to ``account``: NOTIFY it until acknowledged."""

    TYPE: ClassVar[str] = "deliver"
    account: str
    smuid: int
    topic: str
    cmuid: str
    publisher: str
    publisher_guid: str
    accepted_at: int
    priority: int = 0
    headers: Headers = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    delivery: str = "all"  # "one": locked to this account until it ACKs; a disconnect NACKs it
    # when the message dies (microseconds; None: a state message, or a record without it): a gateway
    # never NOTIFYs it from then on, nor sends it again, without waiting for the job's Acked
    expires_at: int | None = None
    # the message's federation fields, as on its :class:`Publish`
    depth: int = 0
    hops: list[str] = field(default_factory=list)
    origin: str | None = None
    origin_topic: str | None = None

    def expired(self, now: int) -> bool:
        """Whether the message's expiry time has passed at ``now`` (microseconds)."""
        return self.expires_at is not None and self.expires_at <= now


@dataclass
class Acked(_Event):
    """The job settled ``account``'s delivery of ``smuid`` in Delta: gateways forget it.

    ``reason`` "acked": the subscriber acknowledged it (or it needed no ACK);
    anything else ("expired", "max_retries") means it died unacknowledged, so
    a NOTIFY of it still queued or in flight at a gateway is withdrawn.
    """

    TYPE: ClassVar[str] = "acked"
    account: str
    smuid: int
    reason: str = "acked"


@dataclass
class AckedBatch(_Event):
    """Several :class:`Acked` in one record, in order: the job's settlements of a micro-batch
    whose accounts share a deliveries partition (each stays on its account's partition, after
    that account's ``Deliver``).

    Why: an ``Acked`` per record made every gateway parse and decode a Kafka record per
    acknowledged delivery (~2.9 µs of its CPU each, against ~0.7 µs taken from a batch: as much
    as a tenth of what a gateway spends per message), and the job append one per delivery.
    ``acked`` holds each ``Acked`` as its own record's JSON object would (``{"type":"acked",...}``),
    so the job joins the ones Spark wrote.
    """

    TYPE: ClassVar[str] = "acked_batch"
    acked: list[dict]

    def events(self) -> list[Acked]:
        return [Acked(entry["account"], entry["smuid"], entry.get("reason", Acked.reason)) for entry in self.acked]

    @classmethod
    def join(cls, acked: list[str]) -> bytes:
        """The record of ``acked``, each an ``Acked``'s JSON text (the job's, from Spark)."""
        return ('{"type":"' + cls.TYPE + '","acked":[' + ",".join(acked) + "]}").encode()


@dataclass
class Progress(_Event):
    """The job committed every command below these offsets (partition -> next offset)."""

    TYPE: ClassVar[str] = "progress"
    commands_offsets: dict[str, int]


EVENT_TYPES: dict[str, type[_Event]] = {
    cls.TYPE: cls for cls in (Publish, Subscribe, Unsubscribe, Ack, Nack, CreateTopic, RemoveTopic, RenameTopic,
                              SetTopicKeywords, SetTopicDelivery, SetLogin, Watch, Unwatch, SetServerTimeout, Sync,
                              Presence, NodeReset, PlannedShutdown, Tick, Deliver, Acked, AckedBatch, Progress)
}

#: Events the gateways fold (registry and presence); they travel on commands partition 0.
CONTROL_TYPES = frozenset({Subscribe, Unsubscribe, CreateTopic, RemoveTopic, RenameTopic, SetTopicKeywords,
                           SetTopicDelivery,
                           SetLogin, Watch, Unwatch, SetServerTimeout, Sync, Presence, NodeReset,
                           PlannedShutdown})


def decode(raw: bytes | str) -> _Event:
    """Parse one JSON event; unknown types raise ``ValueError``."""
    if raw[:2] == b'{"':  # what json.loads does with such bytes, without its encoding detection
        raw = raw.decode("utf-8", "surrogatepass")
    obj = json.loads(raw)
    if _may_hold_a_surrogate(raw) and not encodes_as_utf8(json.dumps(obj, ensure_ascii=False)):
        raise ValueError(f"a string that is no UTF-8 (a lone surrogate) in {raw[:80]!r}")
    cls = EVENT_TYPES.get(obj.pop("type", None))
    if cls is None:
        raise ValueError(f"unknown event type in {raw[:80]!r}")
    if "sections" in obj:
        obj["sections"] = [Section.from_json(s) for s in obj["sections"]]
    if "headers" in obj:
        obj["headers"] = [tuple(h) for h in obj["headers"]]
    return cls(**obj)


#: A JSON escape of a UTF-16 surrogate: half of a pair (as the gateways write astral characters), or alone.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _may_hold_a_surrogate(raw: bytes | str) -> bool:
    """Whether ``raw``'s JSON may decode to a lone surrogate; the gateways' records never do (fast: one scan)."""
    if isinstance(raw, bytes):
        return True  # not an object's UTF-8: rare, checked in full
    return not raw.isascii() or _SURROGATE_ESCAPE.search(raw) is not None


def encodes_as_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: JSON's ``\\ud800`` escape decodes to a lone surrogate, which
    does not.

    Why one definition: the job drops a record holding such a string (Arrow cannot hold it:
    ``streaming.sink.decoding``), so a gateway must not fold it nor route it early (:func:`decode`);
    nor could it write it to a client."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def decode_all(raw: bytes | str) -> list[_Event]:
    """The events of one record: :func:`decode`, with an :class:`AckedBatch` taken apart."""
    event = decode(raw)
    return event.events() if isinstance(event, AckedBatch) else [event]


def to_dict(event: _Event) -> dict:
    """The event as a plain dict (sections keep raw bytes)."""
    return asdict(event)
