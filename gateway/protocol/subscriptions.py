"""SUBSCRIBE, UNSUBSCRIBE and the ACK (310) of a NOTIFY MESSAGE (spec 4.1.9, 4.1.12, 4.2)."""

from __future__ import annotations

from gateway.protocol.actions import Action, Durable, Send
from gateway.protocol.headers import to_micros
from gateway.protocol.rendering import render_server_timeout_notify
from gateway.protocol.vocabulary import MESSAGE_WORDS, SERVER_WORDS, SUBSCRIBER_WORDS, TOPIC_WORDS
from gateway.registry import SUBSCRIBERS_WATCH, TOPIC_WATCH
from gateway.replies import BAD_REQUEST, CONFLICT, FORBIDDEN, NOT_FOUND, RESOURCE_TOO_LARGE, Reply
from schemas.events import Ack, Subscribe, Unsubscribe, Unwatch, Watch
from schemas.timefmt import parse_date_time


class SubscriptionVerbs:
    """The SUBSCRIBE, UNSUBSCRIBE and the ACK handlers of :class:`gateway.protocol.session.Session`.

    A mixin: it uses the session's state and shared helpers (``self._reply``, ``self._consult``,
    ``self._may``...), defined in :mod:`gateway.protocol.session`.
    """

    def smqp_SUBSCRIBE(self, verb: str, args: list[str]) -> list[Action]:
        """``SUB MESSAGE <topic> [SINCE d] [UNTIL d]``, ``SUB TOPIC|SUBSCRIBER <topic>``,
        ``SUB SERVER TIMEOUT``."""
        resource = args[0].upper() if args else ""
        if resource in SERVER_WORDS:
            if [a.upper() for a in args[1:]] != ["TIMEOUT"]:
                return self._usage("SUBSCRIBE SERVER TIMEOUT")
            self.watches_server_timeout = True
            return [Send(Reply.ok().to_bytes()),
                    Send(render_server_timeout_notify(self._registry.server_timeout))]
        if resource in MESSAGE_WORDS:
            return self._subscribe_message(args[1:])
        if resource in TOPIC_WORDS | SUBSCRIBER_WORDS and len(args) == 2:
            error, pattern = self._pattern(args[1])
            if error is not None:
                return self._error(error)
            watch = Watch(self._new_request(), self._account,
                          TOPIC_WATCH if resource in TOPIC_WORDS else SUBSCRIBERS_WATCH, pattern, self._now())
            if not self._own_or_public(pattern):  # as SUB MESSAGE: nobody watches another's account topic
                return self._reply(Reply.error(FORBIDDEN, "another account's topic"))
            if not self._may("subscribe", pattern):
                return self._denied("subscribe", pattern)
            return self._consult(lambda: self._control(watch) if self._exists(pattern) else None, pattern)
        return self._usage("SUBSCRIBE MESSAGE|TOPIC|SUBSCRIBER <topic> | SUBSCRIBE SERVER TIMEOUT")

    def _subscribe_message(self, args: list[str]) -> list[Action]:
        if not args:
            return self._usage("SUBSCRIBE MESSAGE <topic> [SINCE <date-time>] [UNTIL <date-time>]")
        error, pattern = self._pattern(args[0])
        if error is not None:
            return self._error(error)
        bounds: dict[str, int] = {}
        rest = args[1:]
        while rest:
            keyword = rest[0].upper()
            if keyword not in ("SINCE", "UNTIL") or keyword in bounds or len(rest) < 2:
                return self._usage("SUBSCRIBE MESSAGE <topic> [SINCE <date-time>] [UNTIL <date-time>]")
            try:
                bounds[keyword] = to_micros(parse_date_time(rest[1]))
            except ValueError:
                return self._bad(Reply.error(BAD_REQUEST, f"bad {keyword} date-time"))
            rest = rest[2:]
        since, until = bounds.get("SINCE"), bounds.get("UNTIL")
        if since is not None and until is not None and until < since:
            return self._reply(Reply.error(CONFLICT, "UNTIL time precedes SINCE time"))

        request, now = self._new_request(), self._now()

        def decide() -> list[Action] | None:
            if not self._own_or_public(pattern):
                return self._reply(Reply.error(FORBIDDEN, "another account's topic"))
            if not self._may("subscribe", pattern):
                return self._denied("subscribe", pattern)
            target = pattern if pattern.endswith("/*") else self._registry.resolve(pattern)
            if target is None or not self._exists(pattern):
                return None
            refused = self._subscription_limits(target)
            if refused is not None:
                return self._reply(refused)
            return self._control(Subscribe(self._account, self._guid, target, now, since, until, request))
        return self._consult(decide, pattern)

    def _subscription_limits(self, pattern: str) -> Reply | None:
        """5.1 (7) and (8): topics one request may reach, subscriptions per account: both 414
        (4.1.9.1 "cannot subscribe to any more"); 510 is for ``SUB MESSAGE /*`` alone."""
        reached = len(self._registry.matching(pattern)) if pattern.endswith("/*") else 1
        if reached > self._config.max_topics_per_subscribe:
            return Reply.error(RESOURCE_TOO_LARGE, f"{pattern} reaches {reached} topics, "
                                                   f"more than {self._config.max_topics_per_subscribe}")
        mine = self._registry.subscriptions.get(self._account, {})
        if pattern not in mine and len(mine) >= self._config.max_subscriptions:
            return Reply.error(RESOURCE_TOO_LARGE, f"cannot subscribe to any more: {len(mine)} subscriptions "
                                                   f"already, the most one account may have")
        return None

    def smqp_UNSUBSCRIBE(self, verb: str, args: list[str]) -> list[Action]:
        """``UNSUB MESSAGE|TOPIC|SUBSCRIBER <topic>|<topic>/*|*``, ``UNSUB SERVER TIMEOUT``, ``UNSUB *``."""
        resource = args[0].upper() if args else ""
        if resource == "*" and len(args) == 1:
            return self._control(Unsubscribe(self._account, self._guid, "/*", self._now(), self._new_request(),
                                             everything=True))
        if resource in SERVER_WORDS and [a.upper() for a in args[1:]] == ["TIMEOUT"]:
            self.watches_server_timeout = False
            return self._reply(Reply.ok("SERVER TIMEOUT"))
        if len(args) != 2 or resource not in MESSAGE_WORDS | TOPIC_WORDS | SUBSCRIBER_WORDS:
            return self._usage("UNSUBSCRIBE MESSAGE|TOPIC|SUBSCRIBER <topic>|<topic>/*|* | UNSUBSCRIBE *")
        error, pattern = self._pattern(args[1], star_is_all=True)
        if error is not None:
            return self._error(error)
        registry, account, request, now = self._registry, self._account, self._new_request(), self._now()
        if resource in MESSAGE_WORDS:
            def decide() -> list[Action] | None:
                if not registry.subscribed(account, pattern):
                    return None
                return self._control(Unsubscribe(account, self._guid, pattern, now, request))
        else:
            kind = TOPIC_WATCH if resource in TOPIC_WORDS else SUBSCRIBERS_WATCH

            def decide() -> list[Action] | None:
                if not registry.watching(account, kind, pattern):
                    return None
                return self._control(Unwatch(request, account, kind, pattern, now))
        return self._consult(decide, f"not subscribed to {pattern}")

    # the rest

    def smqp_ACK(self, verb: str, args: list[str]) -> list[Action]:
        """The client's ``310 ACK`` of a NOTIFY awaiting it: durable Ack, then ``310 ACK``.

        ``310 ACK`` (the spec's form) acknowledges the oldest NOTIFY awaiting one: the only one
        at window 1.  ``310 ACK <smuid>`` (our extension, any window) names the NOTIFY by its
        ``Smuid:`` value verbatim and is answered ``310 ACK <smuid>``; one naming a NOTIFY that
        awaits no ACK (never sent, already acknowledged, withdrawn) gets 404 and acknowledges nothing."""
        if not args or args[0].upper() != "ACK" or len(args) > 2:
            return self._usage("310 ACK [smuid]")
        if len(args) == 2:
            smuid, reply = self._named_smuid(args[1]), Reply.ack(args[1])
            if smuid not in self._awaiting:
                return self._reply(Reply.error(NOT_FOUND, f"no NOTIFY of Smuid {args[1]} awaits acknowledgement"))
        elif self._awaiting:
            smuid, reply = next(iter(self._awaiting)), Reply.ack()
        else:
            return self._bad(Reply.error(BAD_REQUEST, "no NOTIFY awaits acknowledgement"))
        del self._awaiting[smuid]
        event = Ack(account=self._account, guid=self._guid, smuid=smuid, accepted_at=self._now())
        return [Durable(event, self._account.encode("utf-8"), reply.to_bytes())]

    def _named_smuid(self, text: str) -> int | None:
        """The SMUID of the NOTIFY a ``Smuid:`` value names as this server renders it: ``<server_host>/<number>``,
        or the origin (``b.example/123``) a message another farm forwarded is shown under, which names
        the delivery awaiting its ACK here that came from there."""
        host, _, number = text.rpartition("/")
        if host.lower() == self._server_host and number.isascii() and number.isdigit():
            return int(number)
        return next((smuid for smuid, origin in self._awaiting.items() if origin == text), None)
