"""Per-topic queue parameters (spec section 6): the administrator's knobs, inherited like UALs.

Spec section 6 gives each topic/queue its own parameters, set by the
administrator, not by SMQP commands: expiration timeout, retry timeout,
maximum retries, maximum message count, maximum message size and maximum
queue size; the 2002 revision adds the delivery mode (``SET TOPIC
DELIVERY``).  They live in the configuration file::

    [topics."/"]                 # server-wide values
    retry_timeout_s = 30
    max_retries = 5

    [topics."/jobs"]             # a work queue: each message to one subscriber
    delivery = "one"
    max_in_flight = 10
    timeout = "00:00:10:00"

A topic without a value for a parameter inherits its parent's, up to the
root, then the built-in default of :class:`QueueParameters`.  Both the
gateways (which stamp the effective values into each ``Publish``) and the
streaming job read them from the same :class:`schemas.config.SMQPConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from schemas.timefmt import parse_timeout

DELIVERY_MODES = ("all", "one")


@dataclass(frozen=True)
class QueueParameters:
    """The effective parameters of one topic's queue (built-in defaults here)."""

    timeout: str | None = None  # default message Timeout (dd:hh:mm:ss / INFINITE); None: the server default
    retry_timeout_s: float = 30.0  # a NOTIFY not acknowledged within this is sent again
    max_retries: int = 5  # NOTIFYs of one message to one subscriber left unacknowledged before it goes to Trash
    delivery: str | None = None  # "all" | "one": the topic's mode, which a message's Delivery cannot override
    max_in_flight: int = 10  # DELIVERY ONE: messages locked to one subscriber at a time
    max_messages: int = 0  # messages waiting in the topic's queue; 0 = no limit
    max_queue_bytes: int = 0  # their total data size; 0 = no limit
    max_message_bytes: int = 0  # one message's data; 0 = the gateway's max_message_bytes

    def __post_init__(self) -> None:
        if self.timeout is not None:
            parse_timeout(self.timeout)  # raises ValueError on a bad value
        if self.delivery is not None and self.delivery.lower() not in DELIVERY_MODES:
            raise ValueError(f"delivery must be one of {DELIVERY_MODES}, not {self.delivery!r}")
        if self.max_retries < 0 or self.retry_timeout_s <= 0 or self.max_in_flight < 1:
            raise ValueError("max_retries >= 0, retry_timeout_s > 0 and max_in_flight >= 1 are required")


_NAMES = frozenset(f.name for f in fields(QueueParameters))


@dataclass(frozen=True)
class TopicSettings:
    """``[topics."/path"]`` entries of the configuration, resolved per topic with inheritance."""

    entries: Mapping[str, Mapping[str, Any]]

    def __post_init__(self) -> None:
        for topic, values in self.entries.items():
            unknown = set(values) - _NAMES
            if not topic.startswith("/") or unknown:
                raise ValueError(f"bad [topics.{topic!r}]: " + (f"unknown keys {sorted(unknown)}" if unknown
                                                                 else "the topic must start with '/'"))
            self.resolve(topic)  # validate the values now, not at the first publish

    def resolve(self, topic: str) -> QueueParameters:
        """The parameters of ``topic``: for each, the nearest entry from the topic up to the root."""
        chain = []
        path = topic.lower()
        while True:
            chain.append(self.entries.get(path, {}))
            if path == "/":
                break
            path = path.rsplit("/", 1)[0] or "/"
        values: dict[str, Any] = {}
        for entry in reversed(chain):  # the root first, the topic's own entry last (it wins)
            values.update(entry)
        return replace(QueueParameters(), **values)
