"""Command arguments: SMUID ranges, keyword lists, account names, addresses, base64 lines,
and the reply a malformed topic gets.
"""

from __future__ import annotations

import base64
import ipaddress
from dataclasses import dataclass

from gateway.replies import BAD_REQUEST, MAX_QUANTITIES_EXCEEDED, Reply, TOPIC_TOO_LONG
from gateway.scram import ScramError
from schemas.topics import RootWildcardError, TopicError, account_topic, canonical


def topic_error(error: TopicError) -> Reply:
    """510 for ``/*`` (4.1.9.1), 402 for an overlong level, else 400."""
    if isinstance(error, RootWildcardError):
        return Reply.error(MAX_QUANTITIES_EXCEEDED)
    if error.too_long:
        return Reply.error(TOPIC_TOO_LONG, error.reason)
    return Reply.error(BAD_REQUEST, error.reason)


def to_base64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def from_base64(line: bytes) -> str:
    try:
        return base64.b64decode(line.strip(), validate=True).decode("utf-8")
    except ValueError as error:
        raise ScramError("not base64") from error


def same_address(host: str) -> str:
    """``host`` in one spelling per address (``::ffff:10.0.0.5`` is ``10.0.0.5``); names lower-cased."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower()
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def valid_account(name: str) -> bool:
    """An account owns the topic ``/accounts/<name>``, so its name must make one."""
    try:
        canonical(account_topic(name))
    except TopicError:
        return False
    return "/" not in name


@dataclass(frozen=True)
class SmuidRanges:
    """The SMUIDs a GET MESSAGE asks for: a membership test, and their span, which lets a read skip
    the stored files that hold none of them."""

    bounds: tuple[tuple[int, int], ...] = ()  # (first, last) each; none: every SMUID (``*``)

    def __call__(self, smuid: int) -> bool:
        return not self.bounds or any(low <= smuid <= high for low, high in self.bounds)

    @property
    def span(self) -> tuple[int, int] | None:
        """The lowest and the highest SMUID asked for; None: any."""
        if not self.bounds:
            return None
        return min(low for low, _ in self.bounds), max(high for _, high in self.bounds)


def parse_ranges(text: str) -> SmuidRanges | None:
    """``*``, ``1865``, ``1845-1890,1905`` → the SMUIDs they name; None if malformed."""
    if text == "*":
        return SmuidRanges()
    bounds: list[tuple[int, int]] = []
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not (first.isascii() and first.isdigit()) or (dash and not (last.isascii() and last.isdigit())):
            return None
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            return None
        bounds.append((low, high))
    return SmuidRanges(tuple(bounds))


def parse_keywords(text: str) -> list[str] | None:
    """``(IBM,STOCKS,BIG BLUE)`` → the keywords; None when not parenthesised."""
    text = text.strip()
    if not (text.startswith("(") and text.endswith(")")):
        return None
    return [k.strip() for k in text[1:-1].split(",") if k.strip()]
