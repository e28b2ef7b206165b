"""SMQP topic paths: validation, canonical form and wildcard matching.

Spec 2.2: topics are hierarchical, case-insensitive, ``/``-rooted, contain
no spaces, do not start with a digit, are alphanumeric, and each level is at
most 32 characters.  ``Trash`` is reserved at every level (spec 2.2.1: every
topic's dead messages live in its child ``<topic>/Trash``, which only
LIST/GET/COUNT MESSAGE read, see :func:`trash_of`).  A trailing
``/*`` is a wildcard covering every descendant; ``/*`` alone (the whole
tree) is refused.  Underscores are accepted inside a level because the spec's
own examples use them (``/stocks/quotes/big_blue``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

MAX_LEVEL_LENGTH = 32
TRASH = "trash"
TRASH_LEVEL = "Trash"  # as the streaming job writes it in the trash table's ``trash_topic``
ACCOUNTS_ROOT = "/accounts"
_LEVEL = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
#: A whole topic every level of which :data:`_LEVEL` matches, none longer than the limit:
#: :func:`canonical`'s fast path (anything else takes the level-by-level checks and their errors).
_VALID_TOPIC = re.compile(r"(?:/[A-Za-z][A-Za-z0-9_]{0,%d})+" % (MAX_LEVEL_LENGTH - 1))


class TopicError(ValueError):
    """A topic path that breaks the spec's rules; ``reason`` names which."""

    def __init__(self, topic: str, reason: str, too_long: bool = False):
        super().__init__(f"bad topic {topic!r}: {reason}")
        self.topic = topic
        self.reason = reason
        self.too_long = too_long


class RootWildcardError(TopicError):
    """``/*``: a subscription to everything, which spec 4.1.9.1 forbids."""


def canonical(topic: str) -> str:
    """Validate a concrete topic path and return its canonical (lower-case) form."""
    if _VALID_TOPIC.fullmatch(topic) is not None:  # the usual case, in one regex
        lowered = topic.lower()
        if "/trash/" not in lowered + "/":
            return lowered
    if not topic.startswith("/"):
        raise TopicError(topic, "must start with '/'")
    levels = topic[1:].split("/")
    if topic == "/" or any(level == "" for level in levels):
        raise TopicError(topic, "empty level")
    for level in levels:
        if len(level) > MAX_LEVEL_LENGTH:
            raise TopicError(topic, f"level {level!r} longer than {MAX_LEVEL_LENGTH}", too_long=True)
        if not _LEVEL.match(level):
            raise TopicError(topic, f"level {level!r} must be alphanumeric and not start with a digit")
        if level.lower() == TRASH:
            raise TopicError(topic, "'Trash' is reserved")
    return topic.lower()


@dataclass(frozen=True)
class TopicPattern:
    """A subscription target: an exact topic, or every descendant of ``prefix``."""

    text: str  # canonical form as shown to clients, e.g. "/stocks/*"
    wildcard: bool

    @property
    def prefix(self) -> str:
        """For ``/stocks/*`` the prefix ``/stocks/``; for an exact topic the topic itself."""
        return self.text[:-1] if self.wildcard else self.text

    def matches(self, topic: str) -> bool:
        """True when the canonical ``topic`` is covered by this pattern."""
        return topic.startswith(self.prefix) if self.wildcard else topic == self.text


def parse_pattern(text: str) -> TopicPattern:
    """Parse ``/a/b`` or ``/a/b/*``; ``/*`` raises :class:`RootWildcardError`."""
    if text in ("/*", "*"):
        raise RootWildcardError(text, "subscribing to the whole tree is not allowed")
    if text.endswith("/*"):
        return TopicPattern(canonical(text[:-2]) + "/*", wildcard=True)
    return TopicPattern(canonical(text), wildcard=False)


def account_topic(account: str) -> str:
    """The account topic created with every login account (spec 2.2.2)."""
    return f"{ACCOUNTS_ROOT}/{account.lower()}"


def account_topic_owner(topic: str) -> str | None:
    """The account owning canonical ``topic`` when it is ``/accounts/<name>``, in lower case; else None
    (descendants of an account topic are nobody's).  The job's rule in SQL is
    ``streaming.routing.route.account_topic_owner_sql``."""
    head, _, name = topic.lower().rpartition("/")
    return name if head == ACCOUNTS_ROOT and name else None


def covers(ending: str, pattern: str) -> bool:
    """True when UNSUBSCRIBE ``ending`` ends the subscription ``pattern``.

    Equal patterns, or ``ending`` is a wildcard ``/a/*`` whose prefix ``/a/``
    starts ``pattern``; ``/*`` ends everything.  The streaming job applies the
    same rule in SQL (``streaming.routing.subscriptions._covers``).
    """
    return ending == pattern or (ending.endswith("/*") and pattern.startswith(ending[:-1]))


def parent(topic: str) -> str:
    """``/a/b`` → ``/a``; ``/a`` → ``/``."""
    head = topic.rsplit("/", 1)[0]
    return head or "/"


def ancestors(topic: str) -> list[str]:
    """Proper ancestors below the root, outermost first: ``/a/b/c`` → ``["/a", "/a/b"]``."""
    levels = topic[1:].split("/")
    return ["/" + "/".join(levels[:i]) for i in range(1, len(levels))]


@lru_cache(maxsize=4096)
def candidate_patterns(topic: str) -> tuple[str, ...]:
    """The subscription patterns that match canonical ``topic``: itself and the wildcard of each
    proper ancestor, ``/a/b/c`` → ``("/a/b/c", "/a/*", "/a/b/*")``.  Routing looks a publish's
    subscribers up by these (:func:`recipients`); the job's SQL form is
    ``streaming.routing.route.candidate_patterns_sql``.  Cached: a gateway asks for every publish it
    reads back."""
    return (topic, *(f"{ancestor}/*" for ancestor in ancestors(topic)))


def admits(since: int | None, until: int | None, accepted_at: int | None) -> bool:
    """Whether a subscription's SINCE/UNTIL (µs, None: open) admit a message accepted at
    ``accepted_at`` (µs): ``since <= accepted_at < until`` (spec 4.1.9.1).  A message of unknown
    time is admitted by open bounds only, as SQL's comparisons with null decide."""
    if accepted_at is None:
        return since is None and until is None
    return (since is None or since <= accepted_at) and (until is None or accepted_at < until)


def forwards(peer_domain: str, depth: int, hops: Iterable[str]) -> bool:
    """Whether a message may go on to the peer farm ``peer_domain`` (spec 2.3): its ``depth`` (how many
    more farms it may reach; 0 none, -1 no limit) is not spent, and it has not passed that farm
    already (``hops``, the 2002 HOPS attribute).  A message that passed it by another route is
    dropped there too, by its origin SMUID (``federation``)."""
    return depth != 0 and peer_domain.lower() not in {hop.lower() for hop in hops}


def recipients(topic: str, accepted_at: int | None,
               subscribers: Callable[[str], Iterable[tuple[str, int | None, int | None]]],
               depth: int = 0, hops: Iterable[str] = (), peers: Mapping[str, str] = MappingProxyType({})) -> set[str]:
    """The accounts a DELIVERY ALL message of canonical ``topic`` accepted at ``accepted_at`` reaches:
    each account subscribed to one of its :func:`candidate_patterns` whose SINCE/UNTIL admit it
    (``subscribers(pattern)``: its (account, since, until)), and the owner of an account topic.

    The one rule of the gateways' early routing (``gateway.registry.Registry.recipients``) and the
    job's simple batches (``streaming.simple_batch``); the job's routing query states it in SQL
    (``streaming.routing.route.route_all_sql``), proven equal by ``tests/streaming/test_simple_batch.py``.

    No rule here follows virtual topics or asks the UAL: a publish or SUB MESSAGE through a virtual
    topic is recorded on its target by the gateway, so routing sees real topics only, and it goes
    by subscription alone.  The read right on what a subscription reaches is enforced by the gateway
    before each NOTIFY (``gateway.server.notifying.Notifying.send_next``), where the UAL of today applies."""
    reached = {account for pattern in candidate_patterns(topic) for account, since, until in subscribers(pattern)
               if account and admits(since, until, accepted_at)}
    if owner := account_topic_owner(topic):
        reached.add(owner)
    if peers:  # another farm's link (``[federation] peers``) gets what may be forwarded to it only
        hops = tuple(hops)
        reached = {account for account in reached if may_receive(account, depth, hops, peers)}
    return reached


def may_receive(account: str, depth: int, hops: Iterable[str], peers: Mapping[str, str]) -> bool:
    """Whether ``account`` may get a message of ``depth`` and ``hops``: any account but another farm's
    link (``[federation] peers``: account → domain), which only when :func:`forwards` allows."""
    return account not in peers or forwards(peers[account], depth, hops)


_DOMAIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?$")


def remote_target(target: str) -> tuple[str, str] | None:
    """``b.example/stocks/ibm`` → ``("b.example", "/stocks/ibm")`` (domain lower case, topic canonical):
    a virtual topic's target on another farm (spec 4.1.3).  None for a local target (``/…``); a bad
    domain or topic raises :class:`TopicError`."""
    if target.startswith("/"):
        return None
    domain, slash, path = target.partition("/")
    if not slash or not _DOMAIN.match(domain):
        raise TopicError(target, "a remote target is <domain>/<topic>")
    return domain.lower(), canonical("/" + path)


def is_account_topic(topic: str) -> bool:
    """``/accounts`` and everything below it: created with accounts, never by clients."""
    return topic == ACCOUNTS_ROOT or topic.startswith(ACCOUNTS_ROOT + "/")


def trash_topic(topic: str) -> str:
    """The Trash path of canonical ``topic``: ``/a/b`` → ``/a/b/Trash`` (the trash table's ``trash_topic``)."""
    return f"{topic}/{TRASH_LEVEL}"


def trash_of(path: str) -> str | None:
    """For ``<topic>/Trash`` (``Trash`` in any case, as the last level only) the canonical
    ``<topic>`` whose Trash it names; None when ``path`` is no Trash path.

    ``/Trash`` (the root has no Trash) and ``/a/Trash/b`` are no Trash paths, so
    :func:`canonical` goes on refusing them; a bad ``<topic>`` raises :class:`TopicError`.
    """
    head, slash, last = path.rpartition("/")
    if not slash or not head or last.lower() != TRASH:
        return None
    return canonical(head)
