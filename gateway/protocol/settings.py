"""SET (spec 4.1.7): topic names, keywords and delivery, login password, the notify port and
window, SUSPEND and RESUME.
"""

from __future__ import annotations

from gateway.protocol.actions import Action, AuthResult, ConnectNotify, Send, Wake
from gateway.protocol.arguments import from_base64, parse_keywords, same_address, to_base64
from gateway.protocol.headers import first_header
from gateway.protocol.vocabulary import PROFILE_FIELDS
from gateway.replies import BAD_REQUEST, CONFLICT, NOT_ALLOWED, Reply, UNAUTHORIZED
from gateway.scram import METHOD as SCRAM_METHOD, ScramError, ScramServer
from schemas.events import Headers, RenameTopic, SetLogin, SetTopicDelivery, SetTopicKeywords
from schemas.queue_params import QueueParameters
from schemas.topics import canonical


class SettingVerbs:
    """The SET handlers of :class:`gateway.protocol.session.Session`.

    A mixin: it uses the session's state and shared helpers (``self._reply``, ``self._consult``,
    ``self._may``...), defined in :mod:`gateway.protocol.session`.
    """

    def smqp_SET(self, verb: str, args: list[str]) -> list[Action]:
        """``SET TOPIC NAME|KEYWORD``, ``SET LOGIN PASSWORD|NAME|EMAIL|ADDRESS|PHONE``,
        ``SET NOTIFY PORT|SUSPEND|RESUME``."""
        resource = args[0].upper() if args else ""
        attribute = args[1].upper() if len(args) > 1 else ""
        if resource == "TOPIC" and attribute == "NAME":
            return self._set_topic_name(args[2:])
        if resource == "TOPIC" and attribute in ("KEYWORD", "KEYWORDS", "KEY"):
            return self._set_topic_keywords(args[2:])
        if resource == "TOPIC" and attribute in ("DELIVERY", "DEL"):
            return self._set_topic_delivery(args[2:])
        if resource == "LOGIN" and attribute in ("PASSWORD", "PASS"):
            return self._set_password(args[2:])
        if resource == "LOGIN" and attribute in PROFILE_FIELDS and self._rest(3):
            return self._control(SetLogin(self._new_request(), self._account, PROFILE_FIELDS[attribute],
                                          self._rest(3), self._now()))
        if resource == "NOTIFY" and attribute == "PORT":
            return self._set_notify_port(args[2:])
        if resource == "NOTIFY" and attribute in ("SUSPEND", "SUS", "RESUME", "RES"):
            return self._suspend_or_resume(attribute.startswith("SUS"), args[2:])
        if resource == "NOTIFY" and attribute == "WINDOW":
            return self._set_notify_window(args[2:])
        return self._usage("SET TOPIC NAME|KEYWORD|DELIVERY ... | SET LOGIN PASSWORD|NAME|EMAIL|ADDRESS|PHONE ... "
                           "| SET NOTIFY PORT|SUSPEND|RESUME|WINDOW ...")

    def _set_topic_name(self, args: list[str]) -> list[Action]:
        if len(args) != 2:
            return self._usage("SET TOPIC NAME <topic> <new-topic>")
        error, topic = self._topic(args[0])
        error = error or self._topic(args[1])[0]
        if error is not None:
            return self._error(error)
        new = canonical(args[1])
        if new == topic:
            return self._reply(Reply.error(CONFLICT, "new-topic and topic are the same"))
        if not (self._may("admin", topic) and self._may("admin", new)):
            return self._denied("admin", topic if not self._may("admin", topic) else new)
        return self._control(RenameTopic(self._new_request(), self._account, topic, new, self._now()))

    def _set_topic_keywords(self, args: list[str]) -> list[Action]:
        keywords = parse_keywords(self._rest(4)) if args else None
        if keywords is None:
            return self._usage("SET TOPIC KEYWORD <topic> (keyword,...)")
        error, topic = self._topic(args[0])
        if error is not None:
            return self._error(error)
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        return self._control(SetTopicKeywords(self._new_request(), self._account, topic, keywords, self._now()))

    def _set_topic_delivery(self, args: list[str]) -> list[Action]:
        """``SET TOPIC DELIVERY <topic> ALL|ONE`` (2002 revision); the administrator's right."""
        if len(args) != 2 or args[1].upper() not in ("ALL", "ONE"):
            return self._usage("SET TOPIC DELIVERY <topic> ALL|ONE")
        error, topic = self._topic(args[0])
        if error is not None:
            return self._error(error)
        if not self._may("admin", topic):
            return self._denied("admin", topic)
        return self._control(SetTopicDelivery(self._new_request(), self._account, topic, args[1].lower(),
                                              self._now()))

    def _delivery_mode(self, topic: str, headers: Headers, params: QueueParameters) -> str:
        """The topic's mode (SET TOPIC DELIVERY, else its configured ``delivery``, from ``params``),
        which a message's ``Delivery`` attribute cannot override; else that attribute; else ALL."""
        mode = self._registry.delivery(topic) or params.delivery
        if mode is None:
            mode = first_header(headers, "delivery") or "all"
        return mode.lower()

    def _set_password(self, args: list[str]) -> list[Action]:
        """CLEAR: ``200 + old password``, the old one, ``+ new password``, the new one; or SCRAM-SHA-256."""
        if len(args) != 1 or "/" not in args[0]:
            return self._usage("SET LOGIN PASSWORD <method>/<version>")
        method = args[0].split("/", 1)[0].upper()
        if method == SCRAM_METHOD:
            return self._scram_set_password()
        if method != "CLEAR":
            return self._reply(Reply.error(NOT_ALLOWED))
        if self._clear_refused():
            return self._reply(self._clear_refusal())

        def new_password(old: str, line: bytes) -> list[Action]:
            if self._authenticate(self._account, old) is not AuthResult.OK:
                return self._reply(Reply.error(UNAUTHORIZED, "old password not correct"))
            new = line.decode("utf-8", "replace")
            return self._control(SetLogin(self._new_request(), self._account, "password",
                                          self._hash_password(new), self._now()))

        def old_password(line: bytes) -> list[Action]:
            old = line.decode("utf-8", "replace")
            self._continuation = lambda new_line: new_password(old, new_line)
            return [Send(b"+ new password\r\n\r\n")]

        self._continuation = old_password
        return self._reply(Reply.ok("+ old password"))

    def _scram_set_password(self) -> list[Action]:
        """SCRAM-SHA-256, neither password on the wire: ``200 +`` / client-first /
        ``+ server-first`` / client-final (proves the old password; a failure is a failed login) /
        ``+ server-final,s=<new salt>,i=<iterations>`` / ``h=<masked SaltedPassword>,p=<MAC>``
        (see :mod:`gateway.scram`) / ``200 OK`` once the new hash is folded.  Each message base64."""
        account = self._account
        credentials = self._scram_credentials(account)
        if credentials is AuthResult.UNKNOWN_ACCOUNT:
            return self._reply(Reply.error(NOT_ALLOWED, f"{account} has no SCRAM credentials; use CLEAR/1.0"))
        if credentials is AuthResult.THROTTLED:
            return self._reply(Reply.error(UNAUTHORIZED, "too many failed logins; try again later"))
        server = ScramServer(credentials, self._new_nonce())

        def new_credentials(line: bytes) -> list[Action]:
            try:
                stored = self._store_credentials(server.new_credentials(from_base64(line)))
            except ScramError as error:
                return self._bad(Reply.error(BAD_REQUEST, f"new password: {error}"))
            return self._control(SetLogin(self._new_request(), account, "password", stored, self._now()))

        def client_final(line: bytes) -> list[Action]:
            try:
                server_final = server.final(from_base64(line))
            except ScramError as error:
                self._login_outcome(account, False)
                return self._reply(Reply.error(UNAUTHORIZED, f"old password not proved: {error}"))
            self._login_outcome(account, True)
            self._continuation = new_credentials
            offer = server.offer_new_password(server_final, *self._new_salt())
            return [Send(f"+ {to_base64(offer)}\r\n\r\n".encode())]

        def client_first(line: bytes) -> list[Action]:
            try:
                server_first = server.first(from_base64(line))
            except ScramError as error:
                return self._bad(Reply.error(BAD_REQUEST, str(error)))
            self._continuation = client_final
            return [Send(f"+ {to_base64(server_first)}\r\n\r\n".encode())]

        self._continuation = client_first
        return self._reply(Reply.ok("+"))

    def _set_notify_port(self, args: list[str]) -> list[Action]:
        if not 1 <= len(args) <= 2 or not (args[0].isascii() and args[0].isdigit()) \
                or not 0 < int(args[0]) < 65536:
            return self._usage("SET NOTIFY PORT <ip-port> [ip-address]")
        host = args[1] if len(args) == 2 else None
        if host is not None and not self._notify_host_allowed(host):
            return self._reply(Reply.error(UNAUTHORIZED, f"notifications go only to this session's own address "
                                                         f"{self._peer or '(unknown)'} or a host the "
                                                         f"configuration allows, not {host}"))
        return [ConnectNotify(host, int(args[0]))]

    def _notify_host_allowed(self, host: str) -> bool:
        """The server connects only back to the client, or to hosts ``notify_hosts`` names: else a
        client could make it probe any host and port of its network (404 refused, 408 no answer)."""
        named = same_address(host)
        return named == same_address(self._peer) or named in {same_address(h) for h in self._config.notify_hosts}

    def _set_notify_window(self, args: list[str]) -> list[Action]:
        """``SET NOTIFY WINDOW <n>`` (our extension): up to ``n`` guaranteed NOTIFYs may await their
        ``310 ACK`` at once, so a subscriber is not held to one round trip and one durable Ack per
        message (4.1.11.1: "Implementations MAY vary").  1 is the spec's behaviour, and what a login
        has until it asks.  Lowering it below what awaits now only holds back the next NOTIFYs."""
        most = self._config.max_notify_window
        if len(args) != 1 or not (args[0].isascii() and args[0].isdigit()):
            return self._usage(f"SET NOTIFY WINDOW <n>, 1 <= n <= {most}")
        window = int(args[0])
        if not 1 <= window <= most:
            return self._bad(Reply.error(BAD_REQUEST, f"window {window} is not between 1 and {most}"))
        self._notify_window = window
        return [Send(Reply.ok().to_bytes()), Wake()]

    def _suspend_or_resume(self, suspend: bool, args: list[str]) -> list[Action]:
        if len(args) > 1:
            return self._usage("SET NOTIFY SUSPEND|RESUME [topic]")
        error, pattern = self._pattern(args[0]) if args and args[0] != "*" else (None, "*")
        if error is not None:
            return self._error(error)
        if suspend:
            if pattern == "*":
                self._suspended, self._resumed = {"*"}, set()
            else:
                self._suspended.add(pattern)
                self._resumed.discard(pattern)
            return self._reply(Reply.ok())
        if pattern == "*":
            self._suspended, self._resumed = set(), set()
        elif pattern in self._suspended:
            self._suspended.discard(pattern)
        elif "*" in self._suspended:
            self._resumed.add(pattern)
        return [Send(Reply.ok().to_bytes()), Wake()]

    # PUBLISH
