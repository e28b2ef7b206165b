"""The SMQP server session, sans-I/O: bytes in, actions out.

Like h11, a :class:`Session` never sees a socket, a timer or Kafka.  The
I/O layer feeds it what it reads (:meth:`Session.receive_data`) and carries
out the actions it returns, **in order**:

* :class:`Send` — write the bytes now;
* :class:`Durable` — append ``event.to_bytes()`` to Kafka (acks=all) under
  ``key``, and only then write ``reply``; on failure write a 503 instead.
  Later actions wait for it, so replies keep the order of the commands.  An
  empty ``reply`` (a non-guaranteed PUB) is sent without waiting and
  without any answer, and may be dropped;
* :class:`Control` — append a control event to commands partition 0 and
  write the outcome the registry's fold recorded for it;
* :class:`Consult` — answer from the registry once this session's earlier
  control events are folded (syncing first when it finds nothing);
* :class:`ReadMessages` — load stored messages, then write what ``render``
  makes of them;
* :class:`ConnectNotify` / :class:`Wake` — SET NOTIFY PORT / RESUME;
* :class:`LoggedIn` — the session now belongs to an account (start tailing
  its deliveries);
* :class:`Close` — close the connection after writing what came before.

Wire rules (spec section 4, decided where the spec is loose):

* Lines end with CRLF; a bare LF is accepted on command and header lines,
  never inside data.  Verbs and keywords are case-insensitive; empty lines
  between commands are ignored (the spec's clients send one after each
  command).
* A line longer than ``max_line_bytes`` gets ``400`` and is discarded up to
  its LF, without being buffered.  Each ``400`` counts as a bad command;
  after ``max_bad_commands`` of them the next one gets ``400`` and a close.
* PUBLISH bodies follow :class:`MessageFramer` (the one framing rule, also
  used by the client for NOTIFY MESSAGE): header lines, an empty line, data
  sections counted by ``Content-Length`` only, then a ``.`` line.  Errors
  inside a frame are answered once the frame has ended, so the next command
  always parses; a frame that never ends is the I/O layer's timer's job
  (:meth:`Session.frame_timeout`).
* Topics must exist (CREATE TOPIC) before PUB/SUB; a wildcard SUB lists the
  topics it matches today.  Account topics ``/accounts/<name>`` take PUB
  REPLY only, and only their owner may subscribe to them.
* SET LOGIN PASSWORD reads its answers as continuation lines (the empty line
  after the command is skipped).
* A virtual topic on another farm (``CREATE TOPIC /x > b.example/y``) is made
  after a :class:`CheckRemote` the I/O layer performs over SMQP; PUB to one is
  405 (its messages come from there only).

The handlers live in one module per verb family (:mod:`gateway.protocol.login`, ``reading``,
``topics``, ``settings``, ``publishing``, ``subscriptions``, ``linking``), mixed into :class:`Session`;
dispatch is by name, ``smqp_<VERB>`` (:data:`gateway.protocol.vocabulary.VERBS`).
"""

from __future__ import annotations

from datetime import datetime
from types import MappingProxyType
from typing import Callable

from gateway.protocol.actions import Action, AuthResult, Close, Consult, Control, Send, SessionMisuse
from gateway.protocol.arguments import topic_error
from gateway.protocol.framing import CONTROL_BYTE, LineBuffer, Need
from gateway.protocol.headers import guaranteed, to_micros
from gateway.protocol.linking import LinkVerbs
from gateway.protocol.login import LoginVerbs
from gateway.protocol.publishing import PublishingVerbs
from gateway.protocol.reading import ReadingVerbs
from gateway.protocol.rendering import SERVER_BYE, render_notify
from gateway.protocol.settings import SettingVerbs
from gateway.protocol.state import OpenPublish, Phase
from gateway.protocol.subscriptions import SubscriptionVerbs
from gateway.protocol.topics import TopicVerbs
from gateway.protocol.vocabulary import OPEN_VERBS, THROUGH_LINKS, VERBS
from gateway.replies import BAD_REQUEST, NOT_FOUND, REQUEST_TIMEOUT, Reply, UNAUTHORIZED
from gateway.scram import Credentials
from gateway.ual import AccessList
from schemas.config import FederationConfig, GatewayConfig
from schemas.events import Deliver
from schemas.queue_params import QueueParameters
from schemas.topics import TopicError, account_topic, canonical, is_account_topic, parse_pattern, trash_of, trash_topic


class Session(LoginVerbs, ReadingVerbs, TopicVerbs, SettingVerbs, PublishingVerbs, SubscriptionVerbs, LinkVerbs):
    """One client connection's SMQP state machine.

    ``registry`` is read only: the gateway's fold of the control log
    (:class:`gateway.registry.Registry`).  Commands that change it become
    :class:`Control` actions, commands that read it :class:`Consult` actions,
    so answers keep command order and see this session's own writes.
    """

    def __init__(self, config: GatewayConfig, authenticate: Callable[[str, str], AuthResult], *,
                 clock: Callable[[], datetime], new_guid: Callable[[str], str],
                 new_smuid: Callable[[], int], registry, new_request: Callable[[], str] = lambda: "",
                 hash_password: Callable[[str], str] = lambda password: password,
                 on_command: Callable[[bytes], None] = lambda line: None,
                 over_capacity: Callable[[], str | None] = lambda: None, access: AccessList = AccessList(),
                 scram_credentials: Callable[[str], Credentials | AuthResult] = lambda user: AuthResult.UNKNOWN_ACCOUNT,
                 login_outcome: Callable[[str, bool], None] = lambda user, ok: None,
                 new_nonce: Callable[[], str] = lambda: "nonce",
                 new_salt: Callable[[], tuple[bytes, int]] = lambda: (b"salt", 4096),
                 store_credentials: Callable[[Credentials], str] = repr,
                 queue_params: Callable[[str], QueueParameters] = lambda topic: QueueParameters(),
                 queued: Callable[[str], tuple[int, int]] = lambda topic: (0, 0),
                 peer: str = "", tls: bool = False,
                 known_message: Callable[[str], tuple[str, str | None] | None] = lambda cmuid: None,
                 federation: FederationConfig = FederationConfig()):
        self._config = config
        self._federation = federation  # the farms this one links to (remote virtual topics, CONNECTTO)
        self._peer = peer  # the client's address as the I/O layer saw it ("" when unknown)
        self._tls = tls  # the connection is SMQPS
        self._authenticate = authenticate
        self._clock = clock
        self._new_guid = new_guid
        self._new_smuid = new_smuid
        self._registry = registry
        self._new_request = new_request
        self._hash_password = hash_password
        self._on_command = on_command  # sees every command line first (the gateway's counters)
        self._over_capacity = over_capacity  # None: take logins; "host:port": 311 there; "": 503
        self._access = access  # the administrator's User Access Lists (spec section 6)
        self._scram_credentials = scram_credentials  # SCRAM-SHA-256: the account's stored keys
        self._login_outcome = login_outcome  # SCRAM results, for the throttling of failed logins
        self._new_nonce = new_nonce
        self._new_salt = new_salt  # SET LOGIN PASSWORD SCRAM-SHA-256: (salt, iterations) for the new one
        self._store_credentials = store_credentials  # ... and the stored form of what the client derived
        self._queue_params = queue_params  # a topic's effective [topics."/…"] parameters
        self._queued = queued  # (messages, data bytes) waiting in a topic's queue, as this gateway knows
        self._known_message = known_message  # NOTIFY Cmuid → (topic, Reply-Topic) of a message seen lately
        self._buffer = LineBuffer(config.max_line_bytes)
        self._server_host = config.server_host.lower()  # what a 310 ACK <smuid> names
        self._phase = Phase.NEW
        self._login_user: str | None = None
        self._account: str | None = None
        self._guid: str | None = None
        self._publish: OpenPublish | None = None
        self._continuation: Callable[[bytes], list[Action]] | None = None
        # SMUIDs of the guaranteed NOTIFYs awaiting the client's 310 ACK, oldest first (a dict keeps order),
        # each with its origin (the Smuid it was shown under when another farm forwarded it)
        self._awaiting: dict[int, str | None] = {}
        self._notify_window = 1  # SET NOTIFY WINDOW: how many may await at once (1: the spec's two-phase commit)
        self._bad_commands = 0
        self._line = ""  # the command line being handled, for arguments with spaces
        self._suspended: set[str] = set()  # SET NOTIFY SUSPEND patterns; "*" is everything
        self._resumed: set[str] = set()  # RESUMEd patterns while "*" is suspended
        self.watches_server_timeout = False
        self._handlers = MappingProxyType({verb: getattr(self, f"smqp_{name}") for verb, name in VERBS.items()})

    # -- public API

    @property
    def account(self) -> str | None:
        return self._account

    @property
    def guid(self) -> str | None:
        return self._guid

    @property
    def logged_in(self) -> bool:
        return self._phase is Phase.READY

    @property
    def closed(self) -> bool:
        return self._phase is Phase.CLOSED

    @property
    def awaiting_ack(self) -> int | None:
        """The SMUID of the oldest NOTIFY awaiting the client's ``310 ACK``, if any."""
        return next(iter(self._awaiting), None)

    @property
    def awaiting(self) -> tuple[int, ...]:
        """The SMUIDs of every NOTIFY awaiting its ``310 ACK``, oldest first."""
        return tuple(self._awaiting)

    def awaits(self, smuid: int) -> bool:
        """The NOTIFY of ``smuid`` awaits its ``310 ACK`` (it is guaranteed and not acknowledged)."""
        return smuid in self._awaiting

    @property
    def notify_window(self) -> int:
        """How many guaranteed NOTIFYs may await their ``310 ACK`` at once (SET NOTIFY WINDOW)."""
        return self._notify_window

    @property
    def in_frame(self) -> bool:
        """True while an unfinished PUBLISH body or command line is buffered:
        the I/O layer's cue to keep its frame timer running."""
        return not self.closed and (self._publish is not None or self._buffer.pending)

    def greeting(self, available: bool = True) -> bytes:
        """The identification the server sends first (spec 4); no empty line follows.
        ``Not Available`` (2002 status) when the server takes no more connections."""
        status = "Ready" if available else "Not Available"
        return f"SMQP/1.0 {status}. {self._config.server_ident}\r\n".encode("utf-8")

    def receive_data(self, data: bytes) -> list[Action]:
        """Feed received bytes; ``b""`` means the peer closed (a partial frame is dropped)."""
        if self.closed:
            return []
        if not data:
            self._close()
            return []
        self._buffer.feed(data)
        actions: list[Action] = []
        while not self.closed:
            step = self._next_step()
            if step is None:
                break
            actions += step
        return actions

    def notify(self, deliver: Deliver, frame: bytes | None = None) -> bytes:
        """Render NOTIFY MESSAGE and await its ``310 ACK``: one at a time (4.1.11.1), or up to
        the window the client asked for with SET NOTIFY WINDOW.  ``frame``: the message's NOTIFY
        as :func:`render_notify` made it for another login (it does not depend on the account),
        so a message fanned out to many logins is rendered once."""
        if not self.logged_in:
            raise SessionMisuse("NOTIFY on a session that is not logged in")
        if len(self._awaiting) >= self._notify_window:
            raise SessionMisuse(f"NOTIFY while {len(self._awaiting)} await their 310 ACK "
                                f"(window {self._notify_window}), the oldest SMUID {self.awaiting_ack}")
        if deliver.account.lower() != self._account.lower():
            raise SessionMisuse(f"delivery for {deliver.account!r} on {self._account!r}'s session")
        if guaranteed(deliver.headers):
            self._awaiting[deliver.smuid] = deliver.origin
        return frame if frame is not None else render_notify(deliver, self._config.server_host)

    def notify_again(self, deliver: Deliver) -> bytes:
        """A NOTIFY awaiting its ``310 ACK`` once more: the retry timeout passed without it."""
        if deliver.smuid not in self._awaiting:
            raise SessionMisuse(f"NOTIFY again of SMUID {deliver.smuid}, which awaits no 310 ACK")
        return render_notify(deliver, self._config.server_host)

    def notify_abandoned(self, smuid: int) -> None:
        """``smuid``'s NOTIFY no longer awaits a ``310 ACK``: lost with its connection (SET NOTIFY
        PORT: it stays pending), or withdrawn because it died (expired, out of retries)."""
        self._awaiting.pop(smuid, None)

    def channel_ack(self, line: bytes) -> list[Action]:
        """A line read on the SET NOTIFY PORT connection: only ``310 ACK`` is expected there."""
        words = line.decode("utf-8", "replace").split()
        if not words:
            return []
        if words[0] != "310":
            return self._reply(Reply.error(BAD_REQUEST, "only 310 ACK is read on the notification port"))
        return self.smqp_ACK("310", words[1:])

    @property
    def suspends(self) -> bool:
        """Whether SET NOTIFY SUSPEND holds anything back (:meth:`suspended` is worth asking)."""
        return bool(self._suspended)

    def suspended(self, topic: str) -> bool:
        """SET NOTIFY SUSPEND holds NOTIFY MESSAGE for ``topic``."""
        def hit(patterns: set[str]) -> bool:
            return any(p == "*" or parse_pattern(p).matches(topic) for p in patterns)
        return hit(self._suspended) and not ("*" in self._suspended and hit(self._resumed))

    def frame_timeout(self) -> list[Action]:
        """The frame timer fired: 408 and close if a frame is unfinished, else nothing."""
        if not self.in_frame:
            return []
        self._close()
        return [Send(Reply.error(REQUEST_TIMEOUT).to_bytes()), Close()]

    def server_bye(self) -> bytes:
        """NOTIFY SERVER BYE (4.1.11.4.2), sent before the server shuts down."""
        return SERVER_BYE

    # -- the read loop

    def _next_step(self) -> list[Action] | None:
        """Actions for the next complete command or frame; None if more bytes are needed."""
        if self._publish is not None:
            if not self._publish.framer.advance(self._buffer):
                return None
            publish, self._publish = self._publish, None
            return self._finish_publish(publish)
        line = self._buffer.read_line()
        if line is Need.DATA:
            return None
        if line is Need.LINE_TOO_LONG:
            self._continuation = None
            return self._bad(Reply.error(BAD_REQUEST, "line too long"))
        if self._continuation is not None and line:  # the empty line after a command is not an answer
            continuation, self._continuation = self._continuation, None
            return continuation(line)
        return self._dispatch(line)

    def _dispatch(self, line: bytes) -> list[Action]:
        """One command line → its ``smqp_<VERB>`` handler."""
        self._on_command(line)
        if not line:  # the empty line the spec's clients send after each command
            self._line = ""
            return []
        try:
            self._line = line.decode("utf-8")
        except UnicodeDecodeError:
            return self._bad(Reply.error(BAD_REQUEST, "command is not UTF-8"))
        if CONTROL_BYTE.search(line) is not None:
            return self._bad(Reply.error(BAD_REQUEST, "control character in command"))
        words = self._line.split()
        if not words:
            return []
        verb = words[0].upper()
        handler = self._handlers.get(verb)
        if handler is None:
            return self._bad(Reply.error(BAD_REQUEST, "unknown command"))
        if not self.logged_in and verb not in OPEN_VERBS:
            return self._reply(Reply.error(UNAUTHORIZED, "LOGIN first"))
        return handler(verb, words[1:])

    def _rest(self, words: int) -> str:
        """The command line after its first ``words`` words, spaces inside kept."""
        parts = self._line.strip().split(None, words)
        return parts[words].strip() if len(parts) > words else ""

    # -- helpers

    def _close(self) -> None:
        self._phase = Phase.CLOSED
        self._publish = None

    def _now(self) -> int:
        return to_micros(self._clock())

    @staticmethod
    def _reply(reply: Reply) -> list[Action]:
        return [Send(reply.to_bytes())]

    def _bad(self, reply: Reply) -> list[Action]:
        """Answer a syntax error, counting it against the session's budget."""
        self._bad_commands += 1
        if self._bad_commands <= self._config.max_bad_commands:
            return self._reply(reply)
        self._close()
        return [Send(Reply.error(BAD_REQUEST, "too many bad commands, closing").to_bytes()), Close()]

    def _error(self, reply: Reply) -> list[Action]:
        """Any error reply; only 400s count as bad commands."""
        return self._bad(reply) if reply.code == BAD_REQUEST else self._reply(reply)

    def _usage(self, usage: str) -> list[Action]:
        return self._bad(Reply.error(BAD_REQUEST, f"usage: {usage}"))

    def _topic(self, text: str) -> tuple[Reply | None, str]:
        """(error, canonical topic) for a concrete topic argument."""
        try:
            return None, canonical(text)
        except TopicError as error:
            return topic_error(error), ""

    def _pattern(self, text: str, *, star_is_all: bool = False) -> tuple[Reply | None, str]:
        """(error, canonical pattern) for a topic or ``/a/*`` argument; ``*`` → ``/*`` if allowed."""
        if star_is_all and text in ("*", "/*"):
            return None, "/*"
        try:
            return None, parse_pattern(text).text
        except TopicError as error:
            return topic_error(error), ""

    def _consult(self, decide: Callable[[], list[Action] | None], missing: str) -> list[Action]:
        """:class:`Consult` whose final answer is 404 ``missing`` when ``decide`` finds nothing."""
        def final(is_final: bool) -> list[Action] | None:
            actions = decide()
            if actions is None and is_final:
                return self._reply(Reply.error(NOT_FOUND, missing))
            return actions
        return [Consult(final)]

    def _control(self, event) -> list[Action]:
        return [Control(event)]

    def _exists(self, pattern: str) -> bool:
        """A topic, or a wildcard's parent topic, that exists for this login."""
        base = pattern[:-2] if pattern.endswith("/*") else pattern
        return base == "" or self._registry.live(base)

    def _may(self, action: str, topic: str) -> bool:
        """The UAL's word on ``action`` for ``topic`` (a wildcard: its parent) for this login.

        A virtual topic is a way to its target's messages, so reading, publishing or replying
        through one also needs the right on the target, judged now: a UAL changed after the link
        was made applies at once (admin rights stay the link's own: it is the link that is
        created, renamed or removed)."""
        base = topic[:-2] if topic.endswith("/*") else topic
        allowed = self._access.allows(self._account, action, base or "/")
        target = self._link_target(base) if action in THROUGH_LINKS and allowed else None
        if target is None:
            return allowed
        if action == "subscribe":
            return self.may_read(target)
        return not is_account_topic(target) and self._access.allows(self._account, action, target)

    def _link_target(self, path: str) -> str | None:
        """The target of ``path`` when it is a live virtual topic of this farm, else None (a remote
        link's messages are stored on it here, and the other farm's UAL judged its target)."""
        topic = self._registry.topics.get(path)
        return topic.target if topic is not None and topic.target and not topic.removed and not topic.remote else None

    def may_read(self, topic: str) -> bool:
        """Whether this login may be sent, or read, the messages of canonical ``topic`` now:
        its own account topic (never another's, never by the UAL), or a topic whose
        ``subscribe`` right it holds (a virtual topic's: on its target too).

        The gateway asks it before each NOTIFY MESSAGE and NOTIFY TOPIC / SUB (spec 6, 4.1.3:
        what LIST would hide is never told), because the rights at SUBSCRIBE time are not enough:
        the job routes by subscription, a subscription made through a virtual topic is one to its
        target, and the UAL may have changed since."""
        if is_account_topic(topic):
            return topic == account_topic(self._account)
        return self._may("subscribe", topic)

    def _denied(self, action: str, topic: str) -> list[Action]:
        return self._reply(Reply.error(UNAUTHORIZED, f"no {action} permission on {topic}"))

    def _seen(self, paths: list[str]) -> list[str]:
        """LIST/COUNT/FIND never reveal a topic the login may not subscribe to."""
        return [p for p in paths if self._may("subscribe", p)]

    def _message_topics(self, topics: list[str]) -> tuple[str, ...]:
        """The topics whose stored messages LIST, GET and COUNT MESSAGE on ``topics`` read: those
        this login may read (a wildcard covers topics it may not), each virtual one as its target
        (4.1.4: another name for it, so it shows what SUB MESSAGE through it delivers), once."""
        return tuple(dict.fromkeys(self._registry.resolve(t) or t for t in self._seen(topics)))

    def _readable(self, topic: str) -> bool:
        """LIST/GET MESSAGE: the topic's messages exist and this login may read them."""
        return self._own_or_public(topic) and self._registry.readable(topic) and self._may("subscribe", topic)

    def _own_or_public(self, topic: str) -> bool:
        """Account topics are private to their account."""
        return not topic.startswith("/accounts/") or topic == account_topic(self._account)

    def _message_path(self, text: str, wildcard: bool = False) -> tuple[Reply | None, str]:
        """(error, path) for LIST/GET/COUNT MESSAGE: ``<topic>/Trash`` (any case) → the canonical
        Trash path (:func:`trash_topic`), anything else as :meth:`_topic` (:meth:`_pattern`)."""
        try:
            owner = trash_of(text)
        except TopicError as error:
            return topic_error(error), ""
        if owner is not None:
            return None, trash_topic(owner)
        return self._pattern(text) if wildcard else self._topic(text)

    def _messages_readable(self, path: str) -> bool:
        """LIST/GET/COUNT MESSAGE: :meth:`_readable` for a topic; a Trash under the topic's own
        access rules, for as long as the registry knows the topic (a removed topic's Trash
        keeps what it held)."""
        owner = trash_of(path)
        if owner is None:
            return self._readable(path)
        known = self._registry.live(owner) or owner in self._registry.topics
        return known and self._own_or_public(owner) and self._may("subscribe", owner)

    # -- handlers: one per verb, abbreviations share them

    def smqp_NOOP(self, verb: str, args: list[str]) -> list[Action]:
        """``NOOP``: ``200 OK``, nothing else."""
        return self._usage("NOOP") if args else self._reply(Reply.ok())

    def smqp_QUIT(self, verb: str, args: list[str]) -> list[Action]:
        """``QUIT``: ``200 OK``, then close; subscriptions stay (4.1.14)."""
        if args:
            return self._usage("QUIT")
        self._close()
        return [Send(Reply.ok().to_bytes()), Close()]
