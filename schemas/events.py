"""Events on the Kafka topics, as plain dataclasses with one JSON encoding.

``smqp.commands`` (written by gateways, read by the streaming job) carries
:class:`Publish`, :class:`Subscribe`, :class:`Unsubscribe` and :class:`Ack`.
``smqp.deliveries`` (written by the job, tailed by gateways) carries
:class:`Deliver`, :class:`Acked` and :class:`Progress`.

Every event is one JSON object with a ``type`` field.  Message data is
base64 so that binary bodies survive JSON; :mod:`schemas.spark` describes
the same objects as Spark types, so the job parses them with ``from_json``.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

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
        return cls([tuple(h) for h in obj["headers"]], base64.b64decode(obj["data"]))


@dataclass
class _Event:
    """Base: JSON round trip shared by every event type."""

    TYPE: ClassVar[str] = ""

    def to_bytes(self) -> bytes:
        body = {"type": self.TYPE}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "sections":
                value = [s.to_json() for s in value]
            elif f.name == "headers":
                value = [list(h) for h in value]
            body[f.name] = value
        return json.dumps(body, separators=(",", ":")).encode()


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


@dataclass
class Subscribe(_Event):
    """SUBSCRIBE MESSAGE ``pattern`` (an exact topic or ``/a/b/*``)."""

    TYPE: ClassVar[str] = "subscribe"
    account: str
    guid: str
    pattern: str
    accepted_at: int


@dataclass
class Unsubscribe(_Event):
    """UNSUBSCRIBE MESSAGE ``pattern``."""

    TYPE: ClassVar[str] = "unsubscribe"
    account: str
    guid: str
    pattern: str
    accepted_at: int


@dataclass
class Ack(_Event):
    """A subscriber's ``310 ACK`` of a NOTIFY, made durable before the server's ``310 ACK``."""

    TYPE: ClassVar[str] = "ack"
    account: str
    guid: str
    smuid: int
    accepted_at: int


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


@dataclass
class Acked(_Event):
    """The job recorded ``account``'s acknowledgement of ``smuid`` in Delta."""

    TYPE: ClassVar[str] = "acked"
    account: str
    smuid: int


@dataclass
class Progress(_Event):
    """The job committed every command below these offsets (partition -> next offset)."""

    TYPE: ClassVar[str] = "progress"
    commands_offsets: dict[str, int]


EVENT_TYPES: dict[str, type[_Event]] = {
    cls.TYPE: cls for cls in (Publish, Subscribe, Unsubscribe, Ack, Deliver, Acked, Progress)
}


def decode(raw: bytes | str) -> _Event:
    """Parse one JSON event; unknown types raise ``ValueError``."""
    obj = json.loads(raw)
    cls = EVENT_TYPES.get(obj.pop("type", None))
    if cls is None:
        raise ValueError(f"unknown event type in {raw[:80]!r}")
    if "sections" in obj:
        obj["sections"] = [Section.from_json(s) for s in obj["sections"]]
    if "headers" in obj:
        obj["headers"] = [tuple(h) for h in obj["headers"]]
    return cls(**obj)


def to_dict(event: _Event) -> dict:
    """The event as a plain dict (sections keep raw bytes)."""
    return asdict(event)
