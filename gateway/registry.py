"""The topic and subscription registry every gateway answers from: a fold over the log.

Topics, keywords, virtual links, subscriptions, watches, login settings and
the server's default timeout are control state.  Gateways append control
events to partition 0 of the commands topic and every gateway folds that one
partition in offset order into a :class:`Registry`, so all of them hold the
same state and decide the same way.  The fold, not the gateway that accepted
a command, decides its outcome (a second CREATE of one topic is refused
wherever it came from): the accepting gateway waits until its own fold has
reached the event's offset and replies with the outcome recorded for the
event's ``request`` id.

Plain data, no I/O: the gateway's Kafka tail feeds :meth:`Registry.apply`.
What the fold changes is returned as :class:`TopicChanged` /
:class:`SubscribersChanged` / :class:`ServerTimeoutChanged` so the gateway
can send NOTIFY TOPIC / SUBSCRIBERS / SERVER TIMEOUT to its watchers.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, NamedTuple, Union

from gateway.replies import CONFLICT, NOT_ALLOWED, NOT_FOUND, RESOURCE_TOO_LARGE, Reply
from schemas.events import (
    CreateTopic,
    RemoveTopic,
    RenameTopic,
    SetLogin,
    SetServerTimeout,
    SetTopicDelivery,
    SetTopicKeywords,
    Subscribe,
    Sync,
    Unsubscribe,
    Unwatch,
    Watch,
)
from schemas.topics import (TopicError, account_topic_owner, admits, ancestors, candidate_patterns, covers,
                            is_account_topic, parent, parse_pattern, recipients, remote_target)

#: Watch kinds and how UNSUBSCRIBE replies name them (4.1.10).
TOPIC_WATCH = "topic"
SUBSCRIBERS_WATCH = "subscribers"
_UNSUB_LABEL = {TOPIC_WATCH: "TOPIC", SUBSCRIBERS_WATCH: "SUB"}


@dataclass(frozen=True)
class Topic:
    """One topic; ``target`` makes it virtual; ``removed`` ones drain their pending deliveries."""

    path: str
    keywords: tuple[str, ...] = ()
    target: str | None = None
    removed: bool = False
    delivery: str | None = None  # SET TOPIC DELIVERY: "all" | "one"; None: not set
    linked_by: str | None = None  # a remote link's creating account: the link process pulls as it

    @property
    def remote(self) -> bool:
        """A virtual topic on another farm (``> b.example/stocks/ibm``, spec 4.1.3): its messages are
        pulled by the link process and stored here, on the virtual topic itself."""
        return self.target is not None and not self.target.startswith("/")


class RemoteLink(NamedTuple):
    """A live remote virtual topic, as the link process pulls it (:meth:`Registry.remote_links`)."""

    topic: str  # the local virtual topic, e.g. /quotes/ibm, where the pulled messages are published
    domain: str  # the farm it links to, e.g. b.example (a [[federation.links]] domain)
    remote_path: str  # the topic there, e.g. /stocks/ibm
    account: str  # the account that created it: the pull logs in as it when the link names it, else as guest


@dataclass(frozen=True)
class Subscription:
    """An account's SUBSCRIBE MESSAGE, with its optional SINCE/UNTIL (microseconds)."""

    pattern: str
    since: int | None = None
    until: int | None = None


@dataclass(frozen=True)
class TopicChanged:
    """NOTIFY TOPIC ``topic`` with ``Action: <action>``."""

    topic: str
    action: str


@dataclass(frozen=True)
class SubscribersChanged:
    """NOTIFY SUBSCRIBERS ``topic`` with ``COUNT: <count>``."""

    topic: str
    count: int


@dataclass(frozen=True)
class ServerTimeoutChanged:
    timeout: str


Change = Union[TopicChanged, SubscribersChanged, ServerTimeoutChanged]


def _remote(target: str) -> tuple[str, str] | None:
    """(domain, topic) of a remote link target, None when it is not one (a bad one in the log included)."""
    try:
        return remote_target(target)
    except TopicError:
        return None


@dataclass
class Registry:
    """Control state folded from commands partition 0."""

    is_account: Callable[[str], bool]
    server_timeout: str
    max_children: int = 1000
    pending_for_topic: Callable[[str], int] = lambda topic: 0
    topics: dict[str, Topic] = field(default_factory=dict)
    subscriptions: dict[str, dict[str, Subscription]] = field(default_factory=dict)
    watches: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    profiles: dict[str, dict[str, str]] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict)
    applied: int = -1  # the last partition-0 offset folded
    # pattern -> the accounts subscribed to it: the index :meth:`recipients` looks candidates up in
    _by_pattern: dict[str, set[str]] = field(default_factory=dict)
    # (until, account, pattern) of each SUBSCRIBE with an UNTIL, earliest first: :meth:`end_subscriptions`'
    # agenda (an entry a later SUBSCRIBE or UNSUBSCRIBE overtook is skipped when it comes up)
    _untils: list[tuple[int, str, str]] = field(default_factory=list)
    _expected: set[str] = field(default_factory=set)
    _outcomes: dict[str, Reply] = field(default_factory=dict)

    # -- awaiting outcomes

    def expect(self, request: str) -> None:
        """Keep the outcome of ``request`` when it is folded (this gateway appended it)."""
        self._expected.add(request)

    def forget(self, request: str) -> None:
        self._expected.discard(request)
        self._outcomes.pop(request, None)

    def outcome(self, request: str) -> Reply | None:
        """The folded outcome of an expected request (once), None if not folded yet."""
        reply = self._outcomes.pop(request, None)
        if reply is not None:
            self._expected.discard(request)
        return reply

    # -- the fold

    def apply(self, event, offset: int) -> list[Change]:
        """Fold one partition-0 event; returns what watchers should be told."""
        self.applied = max(self.applied, offset)
        handler = self._FOLDS.get(type(event))
        if handler is None:
            return []
        outcome, changes = handler(self, event)
        request = getattr(event, "request", "")
        if request in self._expected:
            self._outcomes[request] = outcome
        return changes

    def _create(self, event: CreateTopic) -> tuple[Reply, list[Change]]:
        path = event.topic
        if is_account_topic(path):
            return Reply.error(NOT_ALLOWED, "account topics are created with their accounts"), []
        if self.live(path):
            return Reply.error(CONFLICT, f"{path} exists"), []
        remote = event.target is not None and not event.target.startswith("/")
        if remote and _remote(event.target) is None:
            return Reply.error(NOT_ALLOWED, f"topic link bad: {event.target} is not <domain>/<topic>"), []
        if event.target is not None and not remote:  # a remote one the gateway checked with its farm
            if is_account_topic(event.target):  # as the gateway refuses it; never a way in to one
                return Reply.error(NOT_ALLOWED, "topic link bad: an account topic is never a link target"), []
            target = self.topics.get(event.target)
            if target is not None and target.target is not None and not target.removed:
                return Reply.error(NOT_ALLOWED, "topic link bad: the target is itself virtual"), []
            if not self.live(event.target):
                return Reply.error(NOT_FOUND, f"destination topic {event.target}"), []
        missing = [p for p in [*ancestors(path), path] if not self.live(p)]
        for created in missing:
            if len(self.children(parent(created))) >= self.max_children:
                return Reply.error(RESOURCE_TOO_LARGE, f"too many topics under {parent(created)}"), []
        changes: list[Change] = []
        for created in missing:
            last = created == path
            self.topics[created] = Topic(created, tuple(event.keywords) if last else (),
                                         event.target if last else None,
                                         linked_by=event.account if last and remote else None)
            changes.append(TopicChanged(created, "ADDED"))
        return Reply.ok(), changes

    def _remove(self, event: RemoveTopic) -> tuple[Reply, list[Change]]:
        path = event.topic
        if is_account_topic(path):
            return Reply.error(NOT_ALLOWED, "account topics cannot be removed"), []
        if not self.live(path):
            return Reply.error(NOT_FOUND, path), []
        gone = [p for p in self._subtree(path) if self.live(p)]
        for removed in gone:
            self.topics[removed] = replace(self.topics[removed], removed=True)
        pending = sum(self.pending_for_topic(p) for p in gone)
        return Reply.ok(f"{pending} messages pending"), [TopicChanged(p, "DELETED") for p in gone]

    def _rename(self, event: RenameTopic) -> tuple[Reply, list[Change]]:
        old, new = event.topic, event.new_topic
        if is_account_topic(old) or is_account_topic(new):
            return Reply.error(NOT_ALLOWED, "account topics cannot be renamed"), []
        if not self.live(old):
            return Reply.error(NOT_FOUND, old), []
        if new == old or self.live(new):
            return Reply.error(CONFLICT, f"{new} exists"), []
        if new.startswith(old + "/"):
            return Reply.error(CONFLICT, "a topic cannot move below itself"), []
        changes: list[Change] = []
        for ancestor in ancestors(new):
            if not self.live(ancestor):
                self.topics[ancestor] = Topic(ancestor)
                changes.append(TopicChanged(ancestor, "ADDED"))
        for moved in [p for p in self._subtree(old) if self.live(p)]:
            renamed = new + moved[len(old):]
            self.topics[renamed] = replace(self.topics[moved], path=renamed)
            self.topics[moved] = replace(self.topics[moved], removed=True)
            changes.append(TopicChanged(moved, f"RENAME {renamed}"))
        return Reply.ok(), changes

    def _set_delivery(self, event: SetTopicDelivery) -> tuple[Reply, list[Change]]:
        if not self.live(event.topic) or is_account_topic(event.topic):
            return Reply.error(NOT_FOUND, event.topic), []
        self.topics[event.topic] = replace(self.topics[event.topic], delivery=event.delivery)
        return Reply.ok(), []

    def delivery(self, topic: str) -> str | None:
        """The delivery mode SET TOPIC DELIVERY gave ``topic`` (None: never set)."""
        found = self.topics.get(topic)
        return found.delivery if found else None

    def _set_keywords(self, event: SetTopicKeywords) -> tuple[Reply, list[Change]]:
        if not self.live(event.topic) or is_account_topic(event.topic):
            return Reply.error(NOT_FOUND, event.topic), []
        self.topics[event.topic] = replace(self.topics[event.topic], keywords=tuple(event.keywords))
        return Reply.ok(), [TopicChanged(event.topic, f"KEYWORDS {','.join(event.keywords)}")]

    def _set_login(self, event: SetLogin) -> tuple[Reply, list[Change]]:
        if event.attribute == "password":
            self.passwords[event.account] = event.value
        else:
            self.profiles.setdefault(event.account, {})[event.attribute] = event.value
        return Reply.ok(), []

    def _subscribe(self, event: Subscribe) -> tuple[Reply, list[Change]]:
        before = self._counts_touched(event.pattern)
        self.subscriptions.setdefault(event.account, {})[event.pattern] = Subscription(
            event.pattern, event.since, event.until)
        self._by_pattern.setdefault(event.pattern, set()).add(event.account)
        if event.until is not None:
            heapq.heappush(self._untils, (event.until, event.account, event.pattern))
        pattern = parse_pattern(event.pattern)
        lines = sorted(self.matching(pattern.text)) if pattern.wildcard else [event.pattern]
        return Reply.ok(*lines), self._count_changes(before)

    def _unsubscribe(self, event: Unsubscribe) -> tuple[Reply, list[Change]]:
        mine = self.subscriptions.get(event.account, {})
        ended = sorted(p for p in mine if covers(event.pattern, p))
        before = {t: n for p in ended for t, n in self._counts_touched(p).items()}
        for pattern in ended:
            self._end_subscription(event.account, pattern)
        lines = [f"MESSAGE {p}" for p in ended]
        if event.everything:
            lines += self._end_watches(event.account, TOPIC_WATCH, "/*")
            lines += self._end_watches(event.account, SUBSCRIBERS_WATCH, "/*")
        if not lines:
            return Reply.error(NOT_FOUND, f"no subscription matches {event.pattern}"), []
        return Reply.ok(*lines), self._count_changes(before)

    def _watch(self, event: Watch) -> tuple[Reply, list[Change]]:
        self.watches.setdefault(event.account, set()).add((event.kind, event.pattern))
        return Reply.ok(event.pattern), []

    def _unwatch(self, event: Unwatch) -> tuple[Reply, list[Change]]:
        lines = self._end_watches(event.account, event.kind, event.pattern)
        if not lines:
            return Reply.error(NOT_FOUND, f"no subscription matches {event.pattern}"), []
        return Reply.ok(*lines), []

    def _end_watches(self, account: str, kind: str, ending: str) -> list[str]:
        mine = self.watches.get(account, set())
        ended = sorted(p for k, p in mine if k == kind and covers(ending, p))
        mine -= {(kind, p) for p in ended}
        return [f"{_UNSUB_LABEL[kind]} {p}" for p in ended]

    def _set_server_timeout(self, event: SetServerTimeout) -> tuple[Reply, list[Change]]:
        self.server_timeout = event.timeout
        return Reply.ok(), [ServerTimeoutChanged(event.timeout)]

    def _sync(self, event: Sync) -> tuple[Reply, list[Change]]:
        return Reply.ok(), []

    _FOLDS = {
        CreateTopic: _create, RemoveTopic: _remove, RenameTopic: _rename, SetTopicKeywords: _set_keywords,
        SetTopicDelivery: _set_delivery,
        SetLogin: _set_login, Subscribe: _subscribe, Unsubscribe: _unsubscribe, Watch: _watch,
        Unwatch: _unwatch, SetServerTimeout: _set_server_timeout, Sync: _sync,
    }

    # -- UNTIL: subscriptions that end by themselves (spec 4.1.9.1)

    def next_until(self) -> int | None:
        """The earliest UNTIL (µs) of a subscription still on: when :meth:`end_subscriptions` has
        something to end next (the gateway's timer wakes then); None: no subscription has one."""
        while self._untils and not self._ends_at(*self._untils[0]):
            heapq.heappop(self._untils)
        return self._untils[0][0] if self._untils else None

    def end_subscriptions(self, now: int) -> list[Change]:
        """End every subscription whose UNTIL is at or before ``now`` (µs); the subscriber counts
        that drop, for NOTIFY SUBSCRIBERS.

        Why no event in the log: the end is already in it.  Every gateway folds the same SUBSCRIBE
        with the same UNTIL, so each ends the subscription by its own clock when it passes, and all
        of them agree, up to their clocks' skew; none waits for another to say so, and no gateway's
        crash can leave a subscription on for ever.  Routing does not hang on the moment either:
        the job and the early routing admit a message by its acceptance time against UNTIL
        (:func:`schemas.topics.admits`), the same at every gateway.  What the clock does decide
        locally is the outcome of a control event folded meanwhile (an UNSUBSCRIBE of the ended
        subscription is 404 once it ended here), and only the gateway that appended it answers."""
        before: dict[str, int] = {}
        while (until := self.next_until()) is not None and until <= now:
            _, account, pattern = heapq.heappop(self._untils)
            for topic, count in self._counts_touched(pattern).items():
                before.setdefault(topic, count)
            self._end_subscription(account, pattern)
        return self._count_changes(before)

    def _ends_at(self, until: int, account: str, pattern: str) -> bool:
        """``account``'s subscription to ``pattern`` is on and ends at ``until``."""
        subscription = self.subscriptions.get(account, {}).get(pattern)
        return subscription is not None and subscription.until == until

    def _end_subscription(self, account: str, pattern: str) -> None:
        """Forget ``account``'s subscription to ``pattern`` (UNSUBSCRIBE, or its UNTIL passed)."""
        del self.subscriptions[account][pattern]
        accounts = self._by_pattern.get(pattern, set())
        accounts.discard(account)
        if not accounts:
            self._by_pattern.pop(pattern, None)

    # -- subscriber counts

    def _counts_touched(self, pattern: str) -> dict[str, int]:
        """Subscriber counts of the topics ``pattern`` reaches, before a change."""
        reached = self.matching(pattern) if pattern.endswith("/*") else [pattern]
        return {topic: self.subscriber_count(topic) for topic in reached}

    def _count_changes(self, before: dict[str, int]) -> list[Change]:
        changes: list[Change] = []
        for topic, count in sorted(before.items()):
            now = self.subscriber_count(topic)
            if now != count:
                changes.append(SubscribersChanged(topic, now))
        return changes

    # -- reads

    def live(self, path: str) -> bool:
        """A topic that exists now: created and not removed, or an account's own topic."""
        topic = self.topics.get(path)
        if topic is not None and not topic.removed:
            return True
        return self._is_account_topic_of_known_account(path)

    def _is_account_topic_of_known_account(self, path: str) -> bool:
        name = path[len("/accounts/"):]
        return path.startswith("/accounts/") and "/" not in name and bool(name) and self.is_account(name)

    def resolve(self, path: str) -> str | None:
        """The actual topic messages for ``path`` go to (a virtual topic's target), None if none."""
        if not self.live(path):
            return None
        topic = self.topics.get(path)
        if topic is None or topic.target is None or topic.remote:  # a remote link's messages are stored on it
            return path
        return topic.target if self.live(topic.target) else None

    def remote_link(self, path: str) -> bool:
        """``path`` is a live virtual topic on another farm (PUB to it is refused)."""
        topic = self.topics.get(path)
        return topic is not None and topic.remote and not topic.removed

    def remote_links(self) -> list[RemoteLink]:
        """Every live remote virtual topic, by path: what the link process pulls (it folds a registry
        of its own and calls this after each change)."""
        links = []
        for path in sorted(self.topics):
            topic = self.topics[path]
            if topic.remote and not topic.removed:
                domain, remote_path = _remote(topic.target)
                links.append(RemoteLink(path, domain, remote_path, topic.linked_by or ""))
        return links

    def readable(self, path: str) -> bool:
        """Messages can be listed and read: a live topic, or a removed one until its last
        pending delivery went out (REMOVE TOPIC, 4.1.5)."""
        return self.live(path) or (path in self.topics and self.pending_for_topic(path) > 0)

    def visible(self, path: str) -> bool:
        """Shown by LIST/COUNT/FIND: live, not an account topic."""
        return not is_account_topic(path) and self.live(path)

    def children(self, path: str) -> list[str]:
        """Visible direct children of ``path`` ("/" for the root), sorted."""
        return sorted(p for p in self.topics if parent(p) == path and p != path and self.visible(p))

    def descendants(self, path: str) -> list[str]:
        """Visible topics strictly below ``path``, sorted."""
        prefix = "/" if path == "/" else path + "/"
        return sorted(p for p in self.topics if p.startswith(prefix) and self.visible(p))

    def matching(self, pattern: str) -> list[str]:
        """Visible topics a pattern covers: ``/a/*`` → every descendant of ``/a``; ``/a`` → itself."""
        if pattern.endswith("/*"):
            return self.descendants(pattern[:-2] or "/")
        return [pattern] if self.visible(pattern) else []

    def _subtree(self, path: str) -> list[str]:
        return [p for p in self.topics if p == path or p.startswith(path + "/")]

    def subscriber_count(self, topic: str) -> int:
        """Accounts whose SUBSCRIBE MESSAGE patterns reach ``topic``."""
        return sum(1 for subs in self.subscriptions.values()
                   if any(parse_pattern(p).matches(topic) for p in subs))

    def subscribers_in_scope(self, pattern: str, shown: Callable[[str], bool] = lambda topic: True) -> int:
        """COUNT SUBSCRIBERS: accounts subscribed to any topic ``pattern`` covers (a wildcard leaf
        traverses all descendants), or to a pattern inside that scope; only the topics (and the
        patterns' bases) ``shown`` admits count, so a count never reveals a topic LIST would hide."""
        topics = [t for t in (self.matching(pattern) if pattern.endswith("/*") else [pattern]) if shown(t)]
        prefix = pattern[:-1] if pattern.endswith("/*") else None
        count = 0
        for subs in self.subscriptions.values():
            parsed = [parse_pattern(p) for p in subs]
            if any(s.matches(t) for s in parsed for t in topics) or (prefix and any(
                    s.text.startswith(prefix) and shown(s.text.removesuffix("/*")) for s in parsed)):
                count += 1
        return count

    def admits(self, account: str, topic: str, accepted_at: int) -> bool:
        """Whether ``account`` could be handed a DELIVERY ONE message of ``topic`` accepted at
        ``accepted_at`` (microseconds): a subscription of its covers the topic and its SINCE/UNTIL
        admit the message — the subscribers the job picks from when it hands one on."""
        return any(parse_pattern(s.pattern).matches(topic) and admits(s.since, s.until, accepted_at)
                   for s in self.subscriptions.get(account, {}).values())

    def may_reach(self, topic: str) -> bool:
        """Whether a message of canonical ``topic`` may have recipients (:meth:`recipients` before
        SINCE/UNTIL): the cheap test a publish passes before it is decoded."""
        return (any(pattern in self._by_pattern for pattern in candidate_patterns(topic))
                or account_topic_owner(topic) is not None)

    def recipients(self, topic: str, accepted_at: int, depth: int = 0, hops: Iterable[str] = (),
                   peers: Mapping[str, str] = MappingProxyType({})) -> list[str]:
        """The accounts the job routes a DELIVERY ALL message of canonical ``topic`` accepted at
        ``accepted_at`` (microseconds) to, as far as the fold has got (:func:`schemas.topics.recipients`,
        the job's rule): another farm's link (an account of ``peers``, ``[federation] peers``) only
        when the message's ``depth`` and ``hops`` let it go there."""
        return sorted(recipients(topic, accepted_at, self._subscribers_of, depth=depth, hops=hops, peers=peers))

    def _subscribers_of(self, pattern: str) -> list[tuple[str, int | None, int | None]]:
        """(account, since, until) of each subscription to exactly ``pattern``."""
        found = []
        for account in self._by_pattern.get(pattern, ()):
            subscription = self.subscriptions[account][pattern]
            found.append((account, subscription.since, subscription.until))
        return found

    def account_subscriptions(self, account: str) -> list[Subscription]:
        return sorted(self.subscriptions.get(account, {}).values(), key=lambda s: s.pattern)

    def subscribed(self, account: str, pattern: str) -> bool:
        """True when an UNSUBSCRIBE MESSAGE ``pattern`` would end something of ``account``'s."""
        return any(covers(pattern, p) for p in self.subscriptions.get(account, {}))

    def watching(self, account: str, kind: str, pattern: str) -> bool:
        return any(k == kind and covers(pattern, p) for k, p in self.watches.get(account, ()))

    def watchers(self, kind: str, topic: str) -> set[str]:
        """Accounts watching ``topic`` (exactly or through a wildcard) for ``kind``."""
        return {account for account, watched in self.watches.items()
                if any(k == kind and parse_pattern(p).matches(topic) for k, p in watched)}

    def find(self, pattern: str, keywords: Iterable[str] = ()) -> list[Topic]:
        """FIND TOPIC: topics ``pattern`` covers whose keywords contain any of ``keywords`` (substring,
        case-insensitive); without keywords, every covered topic."""
        wanted = [k.lower() for k in keywords if k]
        found = []
        for path in self.matching(pattern):
            topic = self.topics[path]
            if not wanted or any(w in k.lower() for w in wanted for k in topic.keywords):
                found.append(topic)
        return found

