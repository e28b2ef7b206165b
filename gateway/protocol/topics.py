"""CREATE TOPIC and REMOVE TOPIC (spec 4.1.4, 4.1.6), virtual topics (links) included."""

from __future__ import annotations

from gateway.protocol.actions import Action
from gateway.protocol.arguments import parse_keywords
from gateway.protocol.vocabulary import ACCOUNT_LINK, CREATE_ARGS, TOPIC_WORDS
from gateway.replies import CONFLICT, NOT_ALLOWED, NOT_IMPLEMENTED, Reply, UNAUTHORIZED
from schemas.events import CreateTopic, RemoveTopic
from schemas.topics import is_account_topic


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
        if target is not None:
            if not target.startswith("/"):  # spec 6: reaching remote servers is a right of its own
                if not self._may("remote", topic):
                    return self._denied("remote", topic)
                return self._reply(Reply.error(NOT_IMPLEMENTED, "virtual topics on remote servers"))
            error, target = self._topic(target)
            if error is not None:
                return self._error(error)
            if target == topic:
                return self._reply(Reply.error(CONFLICT, "a topic cannot link to itself"))
            if is_account_topic(target):
                return self._reply(Reply.error(NOT_ALLOWED, ACCOUNT_LINK))
        keywords = parse_keywords(match["keywords"]) if match["keywords"] else []
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        if target is not None and not self._may_link_to(target):
            return self._reply(Reply.error(UNAUTHORIZED, f"no subscribe or publish permission on {target}"))
        return self._control(CreateTopic(self._new_request(), self._account, topic, self._now(), keywords, target))

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
