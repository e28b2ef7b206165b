"""What a :class:`gateway.protocol.session.Session` asks its I/O layer to do.

The session never touches a socket, a timer or Kafka: each command returns a list of these,
which the asyncio edge (:mod:`gateway.server`) carries out in order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Union

from gateway.replies import Reply
from schemas.events import Ack, Publish, Subscribe, Unsubscribe


class AuthResult(enum.Enum):
    """What the account store says about a user/password pair."""

    OK = "ok"
    UNKNOWN_ACCOUNT = "unknown account"
    BAD_PASSWORD = "bad password"
    THROTTLED = "too many failed logins"


class SessionMisuse(RuntimeError):
    """We, not the peer, broke the protocol (h11's LocalProtocolError), e.g. a
    second NOTIFY while the first still awaits its ``310 ACK``."""


# --------------------------------------------------------------------------
# Actions


@dataclass(frozen=True)
class Send:
    """Write these bytes now."""

    data: bytes


@dataclass(frozen=True)
class Durable:
    """Append ``event`` to Kafka under ``key`` (acks=all), then write ``reply``."""

    event: Publish | Subscribe | Unsubscribe | Ack
    key: bytes
    reply: bytes


@dataclass(frozen=True)
class LoggedIn:
    """The session authenticated as ``account``; ``guid`` names this login."""

    account: str
    guid: str


@dataclass(frozen=True)
class Close:
    """Close the connection once the actions before it are done."""


@dataclass(frozen=True)
class Control:
    """Append ``event`` (a control event) to commands partition 0, wait until this gateway's
    registry has folded it, then write the outcome the fold recorded for ``event.request``."""

    event: object


@dataclass(frozen=True)
class Consult:
    """Answer from the registry, in command order, once this connection's earlier
    :class:`Control` events are folded.  ``decide(final)`` returns the actions to carry
    out, or None when what it looked for is missing: the I/O layer then appends a
    ``Sync`` barrier, waits until it is folded (so it has seen every gateway's writes
    acknowledged before) and calls ``decide(True)``, which must answer."""

    decide: Callable[[bool], "list[Action] | None"]


@dataclass(frozen=True)
class ReadMessages:
    """Load the stored messages of ``topics`` (off the event loop), then carry out
    ``render(messages)``, in command order; ``smuids_only``: their SMUIDs are enough (a count, a listing).
    ``now`` (microseconds, the session's clock): only the messages live then, neither expired nor
    trashed (spec 2.4); a Trash path reads the dead ones whatever it says; None: every message.
    ``span``: (first, last), when only the messages of SMUIDs between them are wanted (GET MESSAGE
    of given SMUIDs), so the read skips the stored files that hold none."""

    topics: tuple[str, ...]
    render: Callable[[list], "list[Action]"]
    smuids_only: bool = False
    now: int | None = None
    span: tuple[int, int] | None = None


@dataclass(frozen=True)
class ConnectNotify:
    """SET NOTIFY PORT: connect to the client's listener (``host`` None: the peer's
    address), send notifications there, and reply 200, or 404/408 when it cannot."""

    host: str | None
    port: int


@dataclass(frozen=True)
class CheckRemote:
    """CREATE TOPIC ``/x > <domain><topic>`` (spec 4.1.4): log in to the linked farm ``domain``
    (its ``[[federation.links]]``) as ``account`` when the link names it, else as guest, and see
    whether that login may read ``topic`` there; then carry out ``then(outcome)``, ``outcome``
    being 200 (it may), 401 (login refused, or no read right there) or 404 (no such topic there,
    or the farm not reachable), with a text saying which."""

    domain: str
    topic: str
    account: str
    then: Callable[[Reply], "list[Action]"]


@dataclass(frozen=True)
class Wake:
    """Notification state changed (RESUME): offer the next NOTIFY if one is due."""


Action = Union[Send, Durable, LoggedIn, Close, Control, Consult, ReadMessages, ConnectNotify, CheckRemote, Wake]
