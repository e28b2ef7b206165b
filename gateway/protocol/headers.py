"""Message headers: the checks a PUBLISH's headers must pass (spec 4.1.5) and the attributes the
server acts on (Guarantee, Receipt, Priority, Timeout), plus the microsecond clock they are stored in.
"""

from __future__ import annotations

from datetime import datetime, timezone
from types import MappingProxyType
from typing import Callable

from gateway.replies import BAD_REQUEST, Reply
from schemas.events import Headers
from schemas.timefmt import parse_date_time, parse_timeout


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def to_micros(moment: datetime) -> int:
    """Microseconds since the epoch, exactly (no float rounding)."""
    delta = moment - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    return datetime.fromtimestamp(micros // 1_000_000, timezone.utc).replace(microsecond=micros % 1_000_000)


# --------------------------------------------------------------------------
# Header checks for PUBLISH


def _is_count(value: str) -> bool:
    return value.isascii() and value.isdigit()


def _parses(parse: Callable[[str], object]) -> Callable[[str], bool]:
    def check(value: str) -> bool:
        try:
            parse(value)
        except ValueError:
            return False
        return True
    return check


def _is_boolean(value: str) -> bool:
    return value.upper() in ("YES", "NO")


#: RECEIPT values (2002 revision) and draft-04's YES/NO, as the mode the job acts on.
_RECEIPT_MODES = MappingProxyType({"NONE": "none", "ONE": "one", "ALL": "all", "NO": "none", "YES": "one"})


#: The 2002 revision: "limited to one line of no more than 128 characters" (a header is one line).
MAX_NAME_CHARS = 128

#: What a bad value breaks, where "bad <attribute> value" would not say.
_HEADER_RULES = MappingProxyType({
    "name": f"Name is limited to one line of at most {MAX_NAME_CHARS} characters",
    "depth": "Depth is a whole number of servers: 0 (this one only, the default), n, or -1 (no limit)",
    "hops": "Hops is set by the servers a message passes, never by its publisher",
})


def message_depth(headers: Headers) -> int:
    """``Depth`` (already validated): how many more farms the message may be forwarded to, 0 when absent."""
    return next((int(v) for n, v in headers if n.lower() == "depth"), 0)


def _is_depth(value: str) -> bool:
    return value == "-1" or _is_count(value)

#: Message header attributes whose values the gateway validates.
_HEADER_CHECKS = MappingProxyType({
    "priority": _is_count,
    "pri": _is_count,
    "guarantee": _is_boolean,
    "guar": _is_boolean,
    "timeout": _parses(parse_timeout),
    "created": _parses(parse_date_time),
    "receipt": lambda value: value.upper() in _RECEIPT_MODES,
    "delivery": lambda value: value.upper() in ("ALL", "ONE"),
    "name": lambda value: len(value) <= MAX_NAME_CHARS,
    "depth": _is_depth,
    "hops": lambda value: False,  # the route is the servers' to write (the 2002 HOPS)
})


def check_message_headers(headers: Headers) -> Reply | None:
    """400 naming the first attribute with a bad value, else None."""
    for name, value in headers:
        check = _HEADER_CHECKS.get(name.lower())
        if check is not None and not check(value):
            return Reply.error(BAD_REQUEST, _HEADER_RULES.get(name.lower(), f"bad {name} value"))
    return None


#: Header attributes (lower case) that decide how a message is handled, for :func:`acted_on`.
_ACTED_ON = frozenset({"guarantee", "guar", "receipt", "priority", "pri", "timeout", "delivery", "depth"})


def acted_on(headers: Headers) -> Headers:
    """The attributes among ``headers`` that :func:`guaranteed`, :func:`receipt_mode`,
    :func:`message_priority` and a message's timeout and delivery read, names lower-cased, in
    order: those helpers give the same answers on them, without scanning the others each."""
    return [(name.lower(), value) for name, value in headers if name.lower() in _ACTED_ON]


def first_header(headers: Headers, name: str) -> str | None:
    """The value of the first attribute called ``name`` (lower case), None if there is none."""
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def guaranteed(headers: Headers) -> bool:
    """``Guarantee``/``Guar`` (2002 revision): YES unless it says NO.  A non-guaranteed
    message gets no reply to its PUB and no two-phase ACK of its NOTIFY."""
    return all(v.upper() != "NO" for n, v in headers if n.lower() in ("guarantee", "guar"))


def receipt_mode(headers: Headers) -> str:
    """``Receipt`` (already validated): "none" (the default), "one" or "all"; draft-04's YES is ONE."""
    return next((_RECEIPT_MODES[v.upper()] for n, v in headers if n.lower() == "receipt"), "none")


def message_priority(headers: Headers) -> int:
    """``Priority``/``Pri`` (already validated), 0 when absent."""
    return next((int(v) for n, v in headers if n.lower() in ("priority", "pri")), 0)
