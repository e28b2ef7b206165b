"""Login accounts: passwords stored as PBKDF2-SHA256 hashes, never in clear.

The configuration's ``[accounts]`` table maps an account name to a hash made
by ``python -m gateway.accounts`` (which prompts for the password).  The
``guest`` account logs in with a blank password when ``allow_guest`` is on.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import hashlib
import hmac
import ipaddress
import os
import time
from typing import Callable, Mapping

from gateway.protocol.actions import AuthResult
from gateway.scram import Credentials, salted_password

ALGORITHM = "pbkdf2_sha256"
DEFAULT_ITERATIONS = 200_000
GUEST = "guest"
STALE_SWEEP_AT = 10_000  # (source, account) pairs with failures remembered before stale ones are dropped


def throttle_source(source: str) -> str:
    """The part of a client's address its failed logins are counted under: the address itself, or
    for IPv6 its /64 network (one host commonly holds a whole /64, and could change address in it)."""
    try:
        address = ipaddress.ip_address(source)
    except ValueError:
        return source
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def hash_password(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> str:
    """``pbkdf2_sha256$<iterations>$<salt>$<hash>`` with a random 16-byte salt."""
    salt = salt or new_salt()
    return stored_hash(Credentials(salt, iterations, salted_password(password, salt, iterations)))


def new_salt() -> bytes:
    return os.urandom(16)


def stored_hash(credentials: Credentials) -> str:
    """The stored form of PBKDF2 credentials, whether hashed here or, by SET LOGIN PASSWORD
    SCRAM-SHA-256, by the client for a salt we gave it."""
    encode = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return f"{ALGORITHM}${credentials.iterations}${encode(credentials.salt)}${encode(credentials.salted_password)}"


def verify_password(password: str, stored: str) -> bool:
    """Constant-time check of ``password`` against a :func:`hash_password` string."""
    try:
        algorithm, iterations, salt, digest = stored.split("$")
    except ValueError:
        return False
    if algorithm != ALGORITHM:
        return False
    actual = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    return hmac.compare_digest(actual, base64.b64decode(digest))


class Accounts:
    """Authenticates CLEAR logins against configured hashes (and ``guest``).

    ``overrides`` maps an account to the hash its last SET LOGIN PASSWORD
    stored (the registry's fold of the control log); it wins over the file.

    Failed logins are counted per source address and account together, so a
    stranger failing an account's password from elsewhere never locks its owner
    out; ``source`` is the client's address as the gateway saw it ("" when unknown).
    """

    def __init__(self, hashes: Mapping[str, str], allow_guest: bool = True,
                 overrides: Mapping[str, str] | None = None, *, max_failures: int = 5,
                 lockout_s: float = 30.0, throttle_s: float = 3.0, clock: Callable[[], float] = time.monotonic):
        self._hashes = {name.lower(): value for name, value in hashes.items()}
        self._allow_guest = allow_guest
        self._overrides = {} if overrides is None else overrides
        self._max_failures = max_failures
        self._lockout_s = lockout_s
        self._throttle_s = throttle_s
        self._clock = clock
        # (source, account) -> times of its recent failed logins, and until when it is refused unchecked
        self._failures: dict[tuple[str, str], list[float]] = {}
        self._refused_until: dict[tuple[str, str], float] = {}

    def exists(self, account: str) -> bool:
        name = account.lower()
        return name in self._hashes or (name == GUEST and self._allow_guest)

    def authenticate(self, account: str, password: str, source: str = "") -> AuthResult:
        """Check a password; after ``max_failures`` failures from ``source`` within ``lockout_s``
        seconds, that source's attempts at the account are refused unchecked for ``throttle_s``
        seconds (slows guessing), and each further failure refuses it for as long again."""
        name = account.lower()
        if self._throttled(source, name):
            return AuthResult.THROTTLED
        result = self._check(name, password)
        if result is not AuthResult.UNKNOWN_ACCOUNT:
            self.login_outcome(name, result is AuthResult.OK, source)
        return result

    def scram_credentials(self, account: str, source: str = "") -> Credentials | AuthResult:
        """SCRAM-SHA-256 keys from the stored PBKDF2 hash (it is SCRAM's SaltedPassword);
        UNKNOWN_ACCOUNT (guest too: it logs in with CLEAR) or THROTTLED instead."""
        name = account.lower()
        if self._throttled(source, name):
            return AuthResult.THROTTLED
        stored = self._overrides.get(name) or self._hashes.get(name)
        if stored is None:
            return AuthResult.UNKNOWN_ACCOUNT
        algorithm, iterations, salt, digest = stored.split("$")
        return Credentials(base64.b64decode(salt), int(iterations), base64.b64decode(digest))

    def login_outcome(self, account: str, ok: bool, source: str = "") -> None:
        """Count a SCRAM login's result like a CLEAR one's."""
        key = (throttle_source(source), account.lower())
        if ok:
            self._failures.pop(key, None)
            self._refused_until.pop(key, None)
            return
        self._forget_stale()
        recent = self._failures[key] = [*self._recent(key), self._clock()]
        if len(recent) >= self._max_failures:
            self._refused_until[key] = self._clock() + self._throttle_s

    def _recent(self, key: tuple[str, str]) -> list[float]:
        now = self._clock()
        return [t for t in self._failures.get(key, ()) if now - t < self._lockout_s]

    def _throttled(self, source: str, name: str) -> bool:
        """Refused unchecked: never longer than ``throttle_s`` after the failure that caused it."""
        return self._clock() < self._refused_until.get((throttle_source(source), name), float("-inf"))

    def _forget_stale(self) -> None:
        """Drop the pairs whose failures are all older than ``lockout_s``, once there are many:
        a brute force from many addresses must not grow the tables without bound."""
        if len(self._failures) < STALE_SWEEP_AT:
            return
        for key in [key for key in self._failures if not self._recent(key)]:
            del self._failures[key]
            self._refused_until.pop(key, None)

    def _check(self, name: str, password: str) -> AuthResult:
        if name == GUEST and self._allow_guest and name not in self._hashes and name not in self._overrides:
            return AuthResult.OK if password == "" else AuthResult.BAD_PASSWORD
        stored = self._overrides.get(name) or self._hashes.get(name)
        if stored is None:
            return AuthResult.UNKNOWN_ACCOUNT
        return AuthResult.OK if verify_password(password, stored) else AuthResult.BAD_PASSWORD


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.accounts",
        description="Print an [accounts] line for smqp.toml with the password hashed (PBKDF2-SHA256).",
    )
    parser.add_argument("account", help="account name, e.g. jtegen")
    args = parser.parse_args(argv)
    password = getpass.getpass(f"password for {args.account}: ")
    print(f'{args.account} = "{hash_password(password)}"')


if __name__ == "__main__":
    main()
