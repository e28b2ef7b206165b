"""A session's state between commands: its phase, and a PUBLISH whose body is still arriving."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gateway.protocol.framing import MessageFramer
from gateway.replies import Reply


class Phase(enum.Enum):
    """Per-connection state; per-frame state lives in :class:`OpenPublish`."""

    NEW = "awaiting LOGIN"
    AUTHENTICATING = "awaiting PASS"
    READY = "logged in"
    CLOSED = "closed"


@dataclass
class OpenPublish:
    """A PUBLISH whose body is still being read."""

    framer: MessageFramer
    topic: str
    cmuid: str
    error: Reply | None  # decided by the command line, sent after the body
    reply: bool = False  # PUB REPLY
