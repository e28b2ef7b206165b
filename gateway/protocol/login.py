"""LOGIN and PASS (spec 4.1.1-4.1.2): CLEAR passwords and SCRAM-SHA-256."""

from __future__ import annotations

from gateway.protocol.actions import Action, AuthResult, LoggedIn, Send
from gateway.protocol.arguments import from_base64, to_base64, valid_account
from gateway.protocol.state import Phase
from gateway.replies import BAD_REQUEST, NOT_ALLOWED, NOT_FOUND, REDIRECT, Reply, SERVICE_UNAVAILABLE, UNAUTHORIZED
from gateway.scram import METHOD as SCRAM_METHOD, ScramError, ScramServer
from schemas.timefmt import format_date_time
from schemas.topics import account_topic


class LoginVerbs:
    """The LOGIN and PASS handlers of :class:`gateway.protocol.session.Session`.

    A mixin: it uses the session's state and shared helpers (``self._reply``, ``self._consult``,
    ``self._may``...), defined in :mod:`gateway.protocol.session`.
    """

    def smqp_LOGIN(self, verb: str, args: list[str]) -> list[Action]:
        """``LOGIN <user> <method>/<version>``: CLEAR (then PASS) or SCRAM-SHA-256; 405 otherwise."""
        if self.logged_in:
            return self._bad(Reply.error(BAD_REQUEST, "already logged in"))
        method, slash, version = args[1].partition("/") if len(args) == 2 else ("", "", "")
        if not (method and slash and version):
            return self._usage("LOGIN <user> <method>/<version>")
        if not valid_account(args[0]):
            return self._bad(Reply.error(BAD_REQUEST, "account name must be a valid topic level"))
        self._phase, self._login_user = Phase.NEW, None
        redirect = self._over_capacity()
        if redirect:  # 4.1.1 Redirect Request: this gateway is full, another of the farm is not
            return self._reply(Reply(REDIRECT, ("Redirect request", redirect)))
        if redirect is not None:
            return self._reply(Reply.error(SERVICE_UNAVAILABLE, "no more logins on this server"))
        if method.upper() == SCRAM_METHOD:
            return self._scram_login(args[0])
        if method.upper() != "CLEAR":
            return self._reply(Reply.error(NOT_ALLOWED))
        if self._clear_refused():
            return self._reply(self._clear_refusal())
        self._phase, self._login_user = Phase.AUTHENTICATING, args[0]
        return self._reply(Reply.ok())

    def _clear_refused(self) -> bool:
        """A CLEAR password would cross the plain listener readable while SMQPS is there to carry it."""
        return not self._tls and bool(self._config.tls_port) and self._config.clear_only_over_tls

    def _clear_refusal(self) -> Reply:
        return Reply.error(NOT_ALLOWED, f"CLEAR passwords only over SMQPS (port {self._config.tls_port}); "
                                        f"use {SCRAM_METHOD}/1.0 on this port")

    def _scram_login(self, user: str) -> list[Action]:
        """SCRAM-SHA-256 through ``+`` continuation lines, each message base64:
        ``200 +`` / client-first / ``+ server-first`` / client-final / the login reply, whose
        ``Verifier:`` attribute is the server-final message (the server's proof)."""
        credentials = self._scram_credentials(user)
        if credentials is AuthResult.UNKNOWN_ACCOUNT:
            return self._reply(Reply.error(NOT_FOUND, "account not found"))
        if credentials is AuthResult.THROTTLED:
            return self._reply(Reply.error(UNAUTHORIZED, "too many failed logins; try again later"))
        server = ScramServer(credentials, self._new_nonce())

        def failed(reason: str) -> list[Action]:
            self._login_outcome(user, False)
            return self._reply(Reply.error(UNAUTHORIZED, reason))

        def client_final(line: bytes) -> list[Action]:
            try:
                verifier = server.final(from_base64(line))
            except ScramError as error:
                return failed(str(error))
            self._login_outcome(user, True)
            return self._log_in(user.lower(), f"Verifier: {to_base64(verifier)}")

        def client_first(line: bytes) -> list[Action]:
            try:
                server_first = server.first(from_base64(line))
            except ScramError as error:
                return failed(str(error))
            self._continuation = client_final
            return [Send(f"+ {to_base64(server_first)}\r\n\r\n".encode())]

        self._continuation = client_first
        return self._reply(Reply.ok("+"))

    def smqp_PASS(self, verb: str, args: list[str]) -> list[Action]:
        """``PASS <user> [password]`` after ``LOGIN <user> CLEAR``; one attempt per LOGIN."""
        if self.logged_in:
            return self._bad(Reply.error(BAD_REQUEST, "already logged in"))
        if not 1 <= len(args) <= 2:
            return self._usage("PASS <user> [password]")
        user, password = args[0], (args[1] if len(args) == 2 else "")
        expected, self._login_user, self._phase = self._login_user, None, Phase.NEW
        if user != expected:
            return self._bad(Reply.error(BAD_REQUEST, "PASS without a matching LOGIN"))
        result = self._authenticate(user, password)
        if result is AuthResult.UNKNOWN_ACCOUNT:
            return self._reply(Reply.error(NOT_FOUND, "account not found"))
        if result is AuthResult.THROTTLED:
            return self._reply(Reply.error(UNAUTHORIZED, "too many failed logins; try again later"))
        if result is not AuthResult.OK:
            return self._reply(Reply.error(UNAUTHORIZED, "password not correct"))
        return self._log_in(user.lower())

    def _log_in(self, user: str, *first: str) -> list[Action]:
        """The 4.1.1 login reply, in the spec example's attribute order (``first`` lines before)."""
        self._phase, self._account, self._guid = Phase.READY, user, self._new_guid(user)
        timeout = self._registry.server_timeout
        reply = Reply.ok(
            *first,
            f"Topic: {account_topic(user)}",
            f"Timeout: {timeout}",
            f"Time: {format_date_time(self._clock())}",
            f"Guid: {self._guid}",
        )
        return [Send(reply.to_bytes()), LoggedIn(user, self._guid)]

    # COUNT, LIST, FIND, GET: reads
