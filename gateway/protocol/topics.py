"""CREATE TOPIC and REMOVE TOPIC (spec 4.1.4, 4.1.6), virtual topics (links) included, local and on
other farms."""

from __future__ import annotations

from gateway.protocol.actions import Action, CheckRemote
from gateway.protocol.arguments import parse_keywords, topic_error
from gateway.protocol.vocabulary import ACCOUNT_LINK, CREATE_ARGS, TOPIC_WORDS
from gateway.replies import CONFLICT, NOT_ALLOWED, NOT_FOUND, OK, Reply, UNAUTHORIZED
from schemas.events import CreateTopic, RemoveTopic
from schemas.topics import TopicError, is_account_topic, remote_target


class TopicVerbs:
    """The CREATE TOPIC and REMOVE TOPIC handlers of :class:`gateway.protocol.session.Session`.

    A mixin: it uses the session's state and shared helpers (``self._reply``, ``self._consult``,
    ``self._may``...), defined in :mod:`gateway.protocol.session`.
    """

    def smqp_CREATE(self, verb: str, args: list[str]) -> list[Action]:
        """``CREATE TOPIC <topic> [(keyword,…)] [> <target>]``."""
        match = CREATE_ARGS.match(self._rest(2)) if args and args[0].upper() == "TOPIC" else None
        if match is None:
            return self._usage("CREATE TOPIC <topic> [(keyword,...)] [> <target-topic>]")
        error, topic = self._topic(match["topic"])
        if error is not None:
            return self._error(error)
        if topic.startswith("/accounts"):
            return self._reply(Reply.error(NOT_ALLOWED, "account topics are created with their accounts"))
        target = match["target"]
        keywords = parse_keywords(match["keywords"]) if match["keywords"] else []
        if target is not None:
            if not target.startswith("/"):
                return self._create_remote(topic, keywords, target)
            error, target = self._topic(target)
            if error is not None:
                return self._error(error)
            if target == topic:
                return self._reply(Reply.error(CONFLICT, "a topic cannot link to itself"))
            if is_account_topic(target):
                return self._reply(Reply.error(NOT_ALLOWED, ACCOUNT_LINK))
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        if target is not None and not self._may_link_to(target):
            return self._reply(Reply.error(UNAUTHORIZED, f"no subscribe or publish permission on {target}"))
        return self._control(CreateTopic(self._new_request(), self._account, topic, self._now(), keywords, target))

    def _create_remote(self, topic: str, keywords: list[str], target: str) -> list[Action]:
        """``CREATE TOPIC /x > b.example/stocks/ibm``: a virtual topic on another farm (spec 4.1.4).

        It needs the ``remote`` right (spec 6(6): reaching remote servers is a right of its own) and
        the admin right here, a ``[[federation.links]]`` for the domain (404 otherwise: this farm
        reaches no other), then the I/O layer's :class:`CheckRemote` (4.1.4: it succeeds "if either
        the current account or guest" may log in there and access the topic).  The link process
        pulls its messages, as the same login, and stores them here on ``/x``."""
        try:
            domain, path = remote_target(target)
        except TopicError as error:
            return self._error(topic_error(error))
        if not self._may("remote", topic):
            return self._denied("remote", topic)
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        if self._federation.link(domain) is None:
            return self._reply(Reply.error(NOT_FOUND, f"{domain}: no link to that farm is configured here"))
        event = CreateTopic(self._new_request(), self._account, topic, self._now(), keywords, f"{domain}{path}")

        def checked(outcome: Reply) -> list[Action]:
            return self._control(event) if outcome.code == OK else self._reply(outcome)
        return [CheckRemote(domain, path, self._account, checked)]

    def _may_link_to(self, target: str) -> bool:
        """A local virtual topic is made only by a login that may reach its target itself, as the
        spec asks of a remote one (4.1.4: "permission to access the remote topic"): it holds the
        subscribe or the publish right there.  Each use of the link is judged again (:meth:`_may`)."""
        return self._access.allows(self._account, "subscribe", target) or self._access.allows(
            self._account, "publish", target)

    def smqp_REMOVE(self, verb: str, args: list[str]) -> list[Action]:
        """``REMOVE TOPIC <topic>``: ``200 N messages pending``; pending deliveries still go out."""
        if len(args) != 2 or args[0].upper() not in TOPIC_WORDS:
            return self._usage("REMOVE TOPIC <topic>")
        error, topic = self._topic(args[1])
        if error is not None:
            return self._error(error)
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        return self._control(RemoveTopic(self._new_request(), self._account, topic, self._now()))
