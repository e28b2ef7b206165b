"""SCRAM-SHA-256 (RFC 5802 / RFC 7677), both sides, sans-I/O: the password never crosses the wire.

The server needs no new secret: the PBKDF2-SHA256 hash an account is stored
with (:func:`gateway.accounts.hash_password`) *is* SCRAM's SaltedPassword, so
``StoredKey`` and ``ServerKey`` are derived from it.  Channel binding is not
offered (``n,,`` / ``c=biws``); SMQPS protects the channel.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

METHOD = "SCRAM-SHA-256"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _fields(message: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in message.split(",") if "=" in part)


@dataclass(frozen=True)
class Credentials:
    """What the server keeps of a password: salt, iterations and the salted password."""

    salt: bytes
    iterations: int
    salted_password: bytes

    @property
    def stored_key(self) -> bytes:
        return hashlib.sha256(_hmac(self.salted_password, "Client Key")).digest()

    @property
    def server_key(self) -> bytes:
        return _hmac(self.salted_password, "Server Key")


class ScramError(ValueError):
    """A malformed or failed exchange."""


class ScramServer:
    """``first(client_first) -> server_first``, then ``final(client_final) -> server_final``."""

    def __init__(self, credentials: Credentials, nonce: str):
        self._credentials = credentials
        self._nonce = nonce
        self._auth_head = ""
        self._combined = ""

    def first(self, client_first: str) -> str:
        header, _, bare = client_first.partition(",,")
        fields = _fields(bare)
        if header != "n" or "r" not in fields or "n" not in fields:
            raise ScramError("client-first-message must be n,,n=<user>,r=<nonce> (no channel binding)")
        self._combined = fields["r"] + self._nonce
        server_first = f"r={self._combined},s={_b64(self._credentials.salt)},i={self._credentials.iterations}"
        self._auth_head = f"{bare},{server_first}"
        return server_first

    def final(self, client_final: str) -> str:
        without_proof, _, proof = client_final.rpartition(",p=")
        fields = _fields(without_proof)
        if fields.get("c") != "biws" or fields.get("r") != self._combined or not proof:
            raise ScramError("client-final-message does not continue this exchange")
        auth_message = f"{self._auth_head},{without_proof}"
        signature = _hmac(self._credentials.stored_key, auth_message)
        try:
            client_key = bytes(a ^ b for a, b in zip(base64.b64decode(proof, validate=True), signature))
        except ValueError as error:
            raise ScramError("proof is not base64") from error
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self._credentials.stored_key):
            raise ScramError("proof does not match")
        return f"v={_b64(_hmac(self._credentials.server_key, auth_message))}"


class ScramClient:
    """``first() -> client_first``, ``final(server_first) -> client_final``, ``verify(server_final)``."""

    def __init__(self, user: str, password: str, nonce: str):
        self._bare = f"n={user.replace('=', '=3D').replace(',', '=2C')},r={nonce}"
        self._password = password
        self._nonce = nonce
        self._server_signature = b""

    def first(self) -> str:
        return f"n,,{self._bare}"

    def final(self, server_first: str) -> str:
        fields = _fields(server_first)
        if not fields.get("r", "").startswith(self._nonce):
            raise ScramError("server nonce does not extend ours")
        salted = hashlib.pbkdf2_hmac("sha256", self._password.encode(), base64.b64decode(fields["s"]),
                                     int(fields["i"]))
        credentials = Credentials(b"", 0, salted)
        without_proof = f"c=biws,r={fields['r']}"
        auth_message = f"{self._bare},{server_first},{without_proof}"
        client_key = _hmac(salted, "Client Key")
        proof = bytes(a ^ b for a, b in zip(client_key, _hmac(credentials.stored_key, auth_message)))
        self._server_signature = _hmac(credentials.server_key, auth_message)
        return f"{without_proof},p={_b64(proof)}"

    def verify(self, server_final: str) -> bool:
        """True when the server proved it knows the password too."""
        return hmac.compare_digest(server_final.encode(), f"v={_b64(self._server_signature)}".encode())
