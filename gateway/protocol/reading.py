"""COUNT, LIST, FIND and GET (spec 4.1.3, 4.1.8, 4.1.10): reading topics, subscriptions and
stored messages, each filtered by what the login may see.
"""

from __future__ import annotations

from gateway.protocol.actions import Action, Consult, ReadMessages, Send
from gateway.protocol.arguments import parse_ranges
from gateway.protocol.framing import CRLF
from gateway.protocol.rendering import format_ranges, render_stored
from gateway.protocol.vocabulary import MESSAGE_WORDS, SUBSCRIBER_WORDS, TOPIC_WORDS
from gateway.replies import NOT_FOUND, Reply
from schemas.topics import trash_of


class ReadingVerbs:
    """The COUNT, LIST, FIND and GET handlers of :class:`gateway.protocol.session.Session`.

    A mixin: it uses the session's state and shared helpers (``self._reply``, ``self._consult``,
    ``self._may``...), defined in :mod:`gateway.protocol.session`.
    """

    def smqp_COUNT(self, verb: str, args: list[str]) -> list[Action]:
        """``COUNT TOPIC|MESSAGE|SUBSCRIBERS <topic>``; a wildcard leaf counts every descendant."""
        resource = args[0].upper() if args else ""
        if len(args) != 2 or resource not in TOPIC_WORDS | MESSAGE_WORDS | SUBSCRIBER_WORDS:
            return self._usage("COUNT TOPIC|MESSAGE|SUBSCRIBERS <topic>")
        error, pattern = (self._message_path(args[1], wildcard=True) if resource in MESSAGE_WORDS
                          else self._pattern(args[1], star_is_all=resource in TOPIC_WORDS))
        if error is not None:
            return self._error(error)
        registry = self._registry

        def counted(found: list) -> list[Action]:
            return self._reply(Reply.ok(str(len(found))))

        def decide() -> list[Action] | None:
            if trash_of(pattern) is not None:
                if not self._messages_readable(pattern):
                    return None
                return [ReadMessages((pattern,), counted, smuids_only=True, now=self._now())]
            if not self._exists(pattern) or not self._own_or_public(pattern) or not self._may("subscribe", pattern):
                return None
            if resource in TOPIC_WORDS:
                count = len(self._seen(registry.descendants(pattern[:-2] or "/") if pattern.endswith("/*")
                                       else registry.children(pattern)))
            elif resource in SUBSCRIBER_WORDS:
                count = registry.subscribers_in_scope(pattern, shown=lambda topic: self._may("subscribe", topic))
            else:
                topics = registry.matching(pattern) if pattern.endswith("/*") else [pattern]
                return [ReadMessages(self._message_topics(topics), counted, smuids_only=True, now=self._now())]
            return self._reply(Reply.ok(str(count)))
        return self._consult(decide, pattern)

    def smqp_LIST(self, verb: str, args: list[str]) -> list[Action]:
        """``LIST TOPIC <topic>``, ``LIST MESSAGE <topic>``, ``LIST SUBSCRIPTIONS``."""
        resource = args[0].upper() if args else ""
        if resource in ("SUBSCRIPTIONS", "SUBSCRIOTIONS", "SUB") and len(args) == 1:
            return [Consult(lambda final: self._reply(Reply.ok(
                *[s.pattern for s in self._registry.account_subscriptions(self._account)])))]
        if len(args) != 2 or resource not in TOPIC_WORDS | MESSAGE_WORDS:
            return self._usage("LIST TOPIC <topic> | LIST MESSAGE <topic> | LIST SUBSCRIPTIONS")
        if resource in TOPIC_WORDS and args[1] == "/":
            return [Consult(lambda final: self._reply(Reply.ok(
                *self._topic_lines(self._seen(self._registry.children("/"))))))]
        error, topic = self._message_path(args[1]) if resource in MESSAGE_WORDS else self._topic(args[1])
        if error is not None:
            return self._error(error)
        registry = self._registry

        def decide() -> list[Action] | None:
            if resource in TOPIC_WORDS:
                if not registry.visible(topic) or not self._may("subscribe", topic):
                    return None
                return self._reply(Reply.ok(*self._topic_lines(self._seen(registry.children(topic)))))
            if not self._messages_readable(topic):
                return None
            return [ReadMessages(self._message_topics([topic]), self._render_list, smuids_only=True,
                                 now=self._now())]
        return self._consult(decide, topic)

    def _topic_lines(self, paths: list[str]) -> list[str]:
        """``/path`` or, for a virtual topic, ``/path > /target`` (4.1.3.1)."""
        topics = self._registry.topics
        return [f"{p} > {topics[p].target}" if topics[p].target else p for p in paths]

    def _render_list(self, smuids: list[int]) -> list[Action]:
        """LIST MESSAGE's reply: only the SMUIDs, so only that column is read (a quarter less than
        whole messages, measured on a 150-file Trash)."""
        ranges = format_ranges(smuids)
        return self._reply(Reply.ok(ranges) if ranges else Reply.ok())

    def smqp_FIND(self, verb: str, args: list[str]) -> list[Action]:
        """``FIND TOPIC <topic>|<topic>/* [keyword[,keyword]…]``: topics with their keywords."""
        if len(args) < 2 or args[0].upper() not in TOPIC_WORDS:
            return self._usage("FIND TOPIC <topic> [keyword[,keyword]...]")
        error, pattern = self._pattern(args[1])
        if error is not None:
            return self._error(error)
        keywords = [k.strip() for k in self._rest(3).split(",") if k.strip()]
        registry = self._registry

        def decide() -> list[Action] | None:
            if not self._exists(pattern):
                return None
            scope = [pattern] if pattern.endswith("/*") or not keywords else [pattern, pattern + "/*"]
            found = {t.path: t for s in scope for t in registry.find(s, keywords) if self._may("subscribe", t.path)}
            if not found:
                return None
            return self._reply(Reply.ok(*[
                f"{path} ({','.join(found[path].keywords)})" if found[path].keywords else path
                for path in sorted(found)]))
        return self._consult(decide, f"no topic matches {pattern} {','.join(keywords)}".strip())

    def smqp_GET(self, verb: str, args: list[str]) -> list[Action]:
        """``GET MESSAGE <topic> <smuid|ranges|*>`` (non-destructive), ``GET TOPIC KEYWORDS <topic>``."""
        resource = args[0].upper() if args else ""
        if resource in TOPIC_WORDS and len(args) == 3 and args[1].upper() in ("KEYWORDS", "KEYWORD", "KEY"):
            error, topic = self._topic(args[2])
            if error is not None:
                return self._error(error)
            return self._consult(lambda: self._reply(Reply.ok(",".join(self._registry.topics[topic].keywords)))
                                 if self._registry.visible(topic) and self._may("subscribe", topic) else None, topic)
        if resource not in MESSAGE_WORDS or len(args) != 3:
            return self._usage("GET MESSAGE <topic> <smuid|ranges|*> | GET TOPIC KEYWORDS <topic>")
        error, topic = self._message_path(args[1])
        if error is not None:
            return self._error(error)
        wanted = parse_ranges(args[2])
        if wanted is None:
            return self._usage("GET MESSAGE <topic> <smuid|first-last[,...]|*>")

        def render(messages: list) -> list[Action]:
            chosen = [m for m in messages if wanted(m.smuid)]
            if not chosen:
                return self._reply(Reply.error(NOT_FOUND, f"no such message in {topic}"))
            body = b"".join(render_stored(m, self._config.server_host) for m in chosen)
            return [Send(b"200 OK\r\n" + body + CRLF)]

        def decide() -> list[Action] | None:
            if not self._messages_readable(topic):
                return None
            return [ReadMessages(self._message_topics([topic]), render, now=self._now(), span=wanted.span)]
        return self._consult(decide, topic)

    # CREATE, REMOVE, SET: control
