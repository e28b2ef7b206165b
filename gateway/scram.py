"""SCRAM-SHA-256 (RFC 5802 / RFC 7677), both sides, sans-I/O: the password never crosses the wire.

The server needs no new secret: the PBKDF2-SHA256 hash an account is stored
with (:func:`gateway.accounts.hash_password`) *is* SCRAM's SaltedPassword, so
``StoredKey`` and ``ServerKey`` are derived from it.  Channel binding is not
offered (``n,,`` / ``c=biws``); SMQPS protects the channel.

SET LOGIN PASSWORD SCRAM-SHA-256/1.0 runs the same exchange to prove the old
password, then carries the new one as its SaltedPassword only (what the
server stores; it checks CLEAR and SCRAM logins alike), for a salt and
iteration count the server offers along with its proof.  The SaltedPassword
is masked and authenticated with keys derived from the exchange's
``ClientKey``, which only the two ends know (an eavesdropper sees the proof,
``ClientKey`` XOR a signature keyed by the secret ``StoredKey``), so neither
password nor anything that would log in crosses the wire readable.
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


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as error:
        raise ScramError("not base64") from error


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b))


def _change_keys(client_key: bytes, offer_context: str) -> tuple[bytes, bytes]:
    """(mask, MAC key) for a new SaltedPassword, bound to this exchange and the server's offer."""
    return (_hmac(client_key, f"SMQP new password mask,{offer_context}"),
            _hmac(client_key, f"SMQP new password proof,{offer_context}"))


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
    """``first(client_first) -> server_first``, then ``final(client_final) -> server_final``.

    For a password change, the client gets ``offer_new_password(server_final, salt, iterations)``
    instead of the bare server-final, and its answer goes to ``new_credentials(answer)``.
    """

    def __init__(self, credentials: Credentials, nonce: str):
        self._credentials = credentials
        self._nonce = nonce
        self._auth_head = ""
        self._combined = ""
        self._client_key = b""  # known once final() has accepted the proof
        self._auth_message = ""
        self._offer: tuple[bytes, int, str] | None = None  # salt, iterations, the offer message

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
        client_key = _xor(_unb64(proof), _hmac(self._credentials.stored_key, auth_message))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self._credentials.stored_key):
            raise ScramError("proof does not match")
        self._client_key, self._auth_message = client_key, auth_message
        return f"v={_b64(_hmac(self._credentials.server_key, auth_message))}"

    def offer_new_password(self, server_final: str, salt: bytes, iterations: int) -> str:
        """After :meth:`final`: its server-final message plus the salt and iteration count the
        client is to derive the new SaltedPassword with (``v=…,s=…,i=…``)."""
        if not self._client_key:
            raise ScramError("the old password has not been proved")
        offer = f"{server_final},s={_b64(salt)},i={iterations}"
        self._offer = (salt, iterations, offer)
        return offer

    def new_credentials(self, answer: str) -> Credentials:
        """The client's answer to :meth:`offer_new_password` (``h=<masked>,p=<MAC>``) → the
        credentials to store; ScramError if it is malformed or its MAC does not match."""
        if self._offer is None:
            raise ScramError("no new password was asked for")
        salt, iterations, offer = self._offer
        fields = _fields(answer)
        if set(fields) != {"h", "p"}:
            raise ScramError("expected h=<masked salted password>,p=<proof>")
        mask, mac_key = _change_keys(self._client_key, f"{self._auth_message},{offer}")
        if not hmac.compare_digest(_unb64(fields["p"]), _hmac(mac_key, f"h={fields['h']}")):
            raise ScramError("new password proof does not match")
        masked = _unb64(fields["h"])
        if len(masked) != len(mask):
            raise ScramError("the new salted password must be 32 bytes")
        return Credentials(salt, iterations, _xor(masked, mask))


class ScramClient:
    """``first() -> client_first``, ``final(server_first) -> client_final``, ``verify(server_final)``;
    for a password change ``new_password(offer, password)`` instead of ``verify``."""

    def __init__(self, user: str, password: str, nonce: str):
        self._bare = f"n={user.replace('=', '=3D').replace(',', '=2C')},r={nonce}"
        self._password = password
        self._nonce = nonce
        self._server_signature = b""
        self._client_key = b""
        self._auth_message = ""

    def first(self) -> str:
        return f"n,,{self._bare}"

    def final(self, server_first: str) -> str:
        fields = _fields(server_first)
        if not fields.get("r", "").startswith(self._nonce) or "s" not in fields \
                or not fields.get("i", "").isdigit():
            raise ScramError("server-first-message must extend our nonce and give s= and i=")
        salted = salted_password(self._password, _unb64(fields["s"]), int(fields["i"]))
        credentials = Credentials(b"", 0, salted)
        without_proof = f"c=biws,r={fields['r']}"
        self._auth_message = f"{self._bare},{server_first},{without_proof}"
        self._client_key = _hmac(salted, "Client Key")
        proof = _xor(self._client_key, _hmac(credentials.stored_key, self._auth_message))
        self._server_signature = _hmac(credentials.server_key, self._auth_message)
        return f"{without_proof},p={_b64(proof)}"

    def verify(self, server_final: str) -> bool:
        """True when the server proved it knows the password too."""
        return hmac.compare_digest(server_final.encode(), f"v={_b64(self._server_signature)}".encode())

    def new_password(self, offer: str, password: str) -> str:
        """The answer to the server's ``v=…,s=…,i=…`` offer: the new password's SaltedPassword
        for that salt and count, masked and MACed with keys only the two ends can derive.
        ScramError (nothing sent) when the server did not prove it knows the old password."""
        fields = _fields(offer)
        if not self.verify(f"v={fields.get('v', '')}") or "s" not in fields or not fields.get("i", "").isdigit():
            raise ScramError("the server did not prove it knows the old password")
        mask, mac_key = _change_keys(self._client_key, f"{self._auth_message},{offer}")
        salted = salted_password(password, _unb64(fields["s"]), int(fields["i"]))
        masked = _b64(_xor(salted, mask))
        return f"h={masked},p={_b64(_hmac(mac_key, f'h={masked}'))}"


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """SCRAM's SaltedPassword: PBKDF2-HMAC-SHA-256 (also the hash accounts are stored with)."""
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
