"""SMQP date-time and timeout formats (spec section 7, revision 2002).

``date-time`` is ``D<yyyy><mm><dd>T<hh><mm><ss>[<ff>]Z`` in GMT, where the
optional ``ff`` is hundredths of a second (``D20010823T14451246Z``).
``timeout`` is ``dd:hh:mm:ss[:ff]``; the spec's own examples also use
``hh:mm:ss`` (``00:01:00``), accepted as such.  ``INFINITE``/``INF`` or a
negative value means a state message that never expires (``None`` here).
"""

from __future__ import annotations

import re
import time
from functools import lru_cache
from datetime import datetime, timedelta, timezone

_DATE_TIME = re.compile(r"^D(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})(\d{2})?Z?$", re.IGNORECASE)


def format_date_time(moment: datetime) -> str:
    """Render a UTC moment as ``DyyyymmddThhmmssffZ`` (hundredths of a second)."""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("D%Y%m%dT%H%M%S") + f"{moment.microsecond // 10000:02d}Z"


def now_micros() -> int:
    """The wall clock in microseconds since the epoch: the unit of every moment in our events."""
    return time.time_ns() // 1000


def format_micros(micros: int) -> str:
    """:func:`format_date_time` of a moment in microseconds since the epoch (UTC), as every
    NOTIFY renders its ``Created``: the text of each second is made once."""
    seconds, fraction = divmod(micros, 1_000_000)
    return f"{_format_second(seconds)}{fraction // 10000:02d}Z"


@lru_cache(maxsize=256)
def _format_second(seconds: int) -> str:
    """``DyyyymmddThhmmss`` of a whole second since the epoch."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("D%Y%m%dT%H%M%S")


def parse_date_time(text: str) -> datetime:
    """Parse a spec date-time; a missing trailing ``Z`` is tolerated (spec examples omit it)."""
    match = _DATE_TIME.match(text.strip())
    if not match:
        raise ValueError(f"bad date-time {text!r}: expected DyyyymmddThhmmss[ff]Z")
    year, month, day, hour, minute, second, hundredths = match.groups()
    return datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second),
        int(hundredths or 0) * 10000, tzinfo=timezone.utc,
    )


@lru_cache(maxsize=1024)
def parse_timeout(text: str) -> timedelta | None:
    """Parse a timeout; ``None`` means infinite (a state message).  Cached: every publish
    reads its topic's default, and a timedelta is immutable."""
    text = text.strip()
    if text.upper() in ("INFINITE", "INF") or text.startswith("-"):
        return None
    parts = text.split(":")
    if not all(part.isdigit() for part in parts) or len(parts) not in (3, 4, 5):
        raise ValueError(f"bad timeout {text!r}: expected dd:hh:mm:ss[:ff] or INFINITE")
    numbers = [int(part) for part in parts]
    if len(numbers) == 3:
        numbers = [0, *numbers]
    days, hours, minutes, seconds = numbers[:4]
    hundredths = numbers[4] if len(numbers) == 5 else 0
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds, milliseconds=10 * hundredths)


def format_timeout(value: timedelta | None) -> str:
    """Render a timeout as ``dd:hh:mm:ss`` (``INFINITE`` for ``None``)."""
    if value is None:
        return "INFINITE"
    total = int(value.total_seconds())
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{seconds:02d}"
