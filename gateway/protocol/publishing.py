"""PUB and PUB REPLY (spec 4.1.5): the body's checks, queue limits, expiry, and the
durable append of the message.
"""

from __future__ import annotations

from typing import Callable

from gateway.protocol.actions import Action, Consult, Durable, ReadMessages
from gateway.protocol.arguments import valid_account
from gateway.protocol.framing import MessageFramer
from gateway.protocol.headers import (
    acted_on,
    check_message_headers,
    first_header,
    guaranteed,
    message_depth,
    message_priority,
    receipt_mode,
)
from gateway.protocol.state import OpenPublish
from gateway.protocol.vocabulary import PUBLISH_RESOURCES
from gateway.replies import (
    BAD_REQUEST,
    ENTITY_TOO_LARGE,
    NOT_ALLOWED,
    NOT_FOUND,
    RESOURCE_TOO_LARGE,
    Reply,
    UNAUTHORIZED,
)
from schemas.events import Headers, Publish, Section
from schemas.queue_params import QueueParameters
from schemas.timefmt import parse_timeout
from schemas.topics import account_topic


class PublishingVerbs:
    """The PUB and PUB REPLY handlers of :class:`gateway.protocol.session.Session`.

    A mixin: it uses the session's state and shared helpers (``self._reply``, ``self._consult``,
    ``self._may``...), defined in :mod:`gateway.protocol.session`.
    """

    def smqp_PUBLISH(self, verb: str, args: list[str]) -> list[Action]:
        """``PUB MESSAGE <topic> <cmuid>`` / ``PUB REPLY <topic> <cmuid>`` open a body;
        errors wait for its end."""
        resource = args[0].upper() if args else ""
        if resource not in PUBLISH_RESOURCES:
            return self._usage("PUBLISH MESSAGE|REPLY <topic> <cmuid>")
        error, topic = self._publish_target(args[1:])
        framer = MessageFramer(max_header_lines=self._config.max_header_lines,
                               max_message_bytes=self._message_limit(self._queue_params(topic)) if error is None
                               else self._config.max_message_bytes, keep_data=error is None)
        self._publish = OpenPublish(framer, topic, args[2] if len(args) == 3 else "", error, resource == "REPLY")
        return []

    def _publish_target(self, args: list[str]) -> tuple[Reply | None, str]:
        """(error to send after the body, canonical topic)."""
        if not self.logged_in:
            return Reply.error(UNAUTHORIZED, "LOGIN first"), ""
        if len(args) != 2:
            return Reply.error(BAD_REQUEST, "usage: PUBLISH MESSAGE|REPLY <topic> <cmuid>"), ""
        return self._topic(args[0])

    def _finish_publish(self, publish: OpenPublish) -> list[Action]:
        """The body has ended: the first error, or the durable Publish and its reply."""
        framer = publish.framer
        error = publish.error or framer.error or check_message_headers(framer.headers)
        silent = not guaranteed(framer.headers)  # no acknowledgement of any kind, errors included
        if error is not None:
            return [] if silent else self._error(error)
        if publish.reply:
            return self._finish_reply(publish)
        topic = publish.topic
        if topic.startswith("/accounts/"):
            return [] if silent else self._reply(
                Reply.error(NOT_ALLOWED, "account topics take replies (PUB REPLY), not messages"))

        def decide() -> list[Action] | None:
            target = self._registry.resolve(topic)
            if target is None:
                return None
            if self._registry.remote_link(topic):
                return [] if silent else self._reply(Reply.error(
                    NOT_ALLOWED, f"{topic} links to another farm: publishing to a remote topic is not supported"))
            if not (self._may("publish", topic) and self._may("publish", target)):
                return [] if silent else self._denied("publish", topic)
            if not self._may_forward(topic, framer.headers):
                return [] if silent else self._denied_forwarding(topic)
            return self._durable_publish(publish, target, framer.headers)
        if silent:
            return [Consult(lambda final: decide() or [])]
        return self._consult(decide, topic)

    def _finish_reply(self, publish: OpenPublish) -> list[Action]:
        """PUB REPLY: to the account topic of the publisher named by the ``Cmuid`` attribute,
        once :meth:`_replied_to` has found the message it names."""
        original = next((v for n, v in publish.framer.headers if n.lower() == "cmuid"), "")
        account = original.split("/", 1)[0].lower()
        if not original or not valid_account(account):
            return self._bad(Reply.error(BAD_REQUEST, "PUB REPLY needs the Cmuid attribute of the message replied to"))
        if not self._registry.is_account(account):
            return self._reply(Reply.error(NOT_FOUND, f"account {account}"))
        headers = [(n, v) for n, v in publish.framer.headers if n.lower() not in ("cmuid", "smuid")]
        headers += [("In-Reply-To", original), ("Reply-Topic", publish.topic)]
        if not self._may("reply", publish.topic):
            return self._denied("reply", publish.topic)
        silent = not guaranteed(publish.framer.headers)
        if not self._may_forward(publish.topic, headers):
            return [] if silent else self._denied_forwarding(publish.topic)

        def send() -> list[Action]:
            return self._durable_publish(publish, account_topic(account), headers)

        def refuse() -> list[Action]:
            return [] if silent else self._reply(Reply.error(
                NOT_FOUND, f"no message {original} on {publish.topic} that this login could receive"))
        return self._replied_to(publish.topic, original, send, refuse)

    def _replied_to(self, topic: str, original: str, send: Callable[[], list[Action]],
                    refuse: Callable[[], list[Action]]) -> list[Action]:
        """``send()`` when the message whose NOTIFY ``Cmuid`` is ``original`` exists and this login
        could have received it, else ``refuse()`` (404, and the reply reaches nobody).

        Spec 4.1.8.2: a client replies "to a published message" it received, naming "the topic the
        message was received from".  Our reading: the message must be one of ``topic`` (a virtual
        topic's: of its target) that this login may read now (:meth:`may_read`, as GET MESSAGE
        decides; it need not have been routed to this very login, since it could subscribe or GET
        it), or a message on this login's own account topic (a reply or receipt it was sent) when
        ``topic`` is that account topic or the reply's ``Reply-Topic``, the way back of the two-way
        exchange the section ends with.  Whether the login was a recipient is not enough: a UAL
        changed since then applies.  The gateway's memory of the messages routed lately answers
        first (the job may not have committed one just NOTIFYed); else the ``messages`` table."""
        mine = account_topic(self._account)

        def accepts(found: str, reply_topic: str | None) -> bool:
            if found == mine:
                return topic in (mine, reply_topic)
            return found == self._registry.resolve(topic) and self.may_read(topic)

        def from_store(messages: list) -> list[Action]:
            if any(f"{m.publisher}/{m.publisher_guid}/{m.cmuid}" == original
                   and accepts(m.topic, first_header(m.headers, "reply-topic")) for m in messages):
                return send()
            return refuse()

        def decide(final: bool) -> list[Action] | None:
            known = self._known_message(original)
            if known is not None and accepts(*known):
                return send()
            target = self._registry.resolve(topic)
            if target is None and not final:
                return None  # a topic another gateway created a moment ago: sync, then look again
            topics = (mine,) if target in (None, mine) else (target, mine)
            return [ReadMessages(topics, from_store)]
        return [Consult(decide)]

    def _may_forward(self, topic: str, headers: Headers) -> bool:
        """A message whose ``Depth`` is not 0 goes beyond this farm: only a publisher holding the
        ``remote`` right on ``topic`` may send one (spec 6(6))."""
        return message_depth(headers) == 0 or self._may("remote", topic)

    def _denied_forwarding(self, topic: str) -> list[Action]:
        return self._reply(Reply.error(
            UNAUTHORIZED, f"no remote permission on {topic}: a Depth other than 0 forwards beyond this server"))

    def _durable_publish(self, publish: OpenPublish, topic: str, headers: Headers) -> list[Action]:
        params = self._queue_params(topic)
        refused = self._queue_limits(topic, publish.framer.sections, params)
        acted = acted_on(headers)  # each helper below scans these few instead of every header
        sure = guaranteed(acted)
        if refused is not None:
            return self._reply(refused) if sure else []
        now = self._now()
        # Depth: the field is what routing reads and NOTIFY shows; the publisher's attribute stays in
        # the headers only for its place in the NOTIFY (4.1.11.1's example shows it there)
        event = Publish(
            smuid=self._new_smuid(), topic=topic, cmuid=publish.cmuid,
            account=self._account, guid=self._guid, accepted_at=now,
            priority=message_priority(acted), headers=headers, sections=publish.framer.sections,
            expires_at=self._expiry(acted, now, params), receipt=receipt_mode(acted),
            delivery=self._delivery_mode(topic, acted, params), depth=message_depth(acted),
        )
        reply = Reply.ok(f"{publish.cmuid} {event.smuid}").to_bytes() if sure else b""
        return [Durable(event, topic.encode("utf-8"), reply)]

    def _message_limit(self, params: QueueParameters) -> int:
        """Data bytes one message to a topic of ``params`` may carry: its ``max_message_bytes``,
        else the gateway's."""
        return params.max_message_bytes or self._config.max_message_bytes

    def _queue_limits(self, topic: str, sections: list[Section], params: QueueParameters) -> Reply | None:
        """Spec section 6's per-queue maximum message size, count and total size.

        A message larger than its topic allows is 413 Entity too large, as for the gateway-wide
        limit.  A full queue is 414 Resource too large: Appendix A has no "queue full", and
        of its codes 414 names the thing that is too large here, the topic's queue (413 is the
        message itself); it is a 4yz code, a transient refusal the publisher may repeat
        unchanged once subscribers have drained the queue (503 would say the server is down,
        and 510 is a permanent 5yz code outside Appendix A).  The queue is what this gateway's
        delivery book holds pending for the topic, so publishes accepted within the job's
        routing delay (about one micro-batch) are not counted yet and may overshoot it.
        """
        size = sum([len(section.data) for section in sections])
        limit = self._message_limit(params)
        if size > limit:
            return Reply.error(ENTITY_TOO_LARGE, f"more than {limit} data bytes")
        messages, queued_bytes = self._queued(topic)
        if params.max_messages and messages >= params.max_messages:
            return Reply.error(RESOURCE_TOO_LARGE, f"queue of {topic} full: {messages} messages waiting")
        if params.max_queue_bytes and queued_bytes + size > params.max_queue_bytes:
            return Reply.error(RESOURCE_TOO_LARGE, f"queue of {topic} full: {queued_bytes} of "
                                                   f"{params.max_queue_bytes} bytes waiting")
        return None

    def _expiry(self, headers: Headers, now: int, params: QueueParameters) -> int | None:
        """The message's ``Timeout`` (already validated), else the topic's default (``params``),
        else the server's, from ``now``."""
        text = first_header(headers, "timeout") or params.timeout or self._registry.server_timeout
        timeout = parse_timeout(text)  # cached: most publishes read their topic's default
        return None if timeout is None else now + int(timeout.total_seconds() * 1_000_000)

    # SUBSCRIBE, UNSUBSCRIBE
