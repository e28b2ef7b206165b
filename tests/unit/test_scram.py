"""SCRAM-SHA-256 against RFC 7677's test vector, and round trips through our own two sides."""

from __future__ import annotations

import base64
import hashlib

import pytest

from gateway.scram import Credentials, ScramClient, ScramError, ScramServer

# RFC 7677 section 3
SERVER_FIRST = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL = ("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_credentials() -> Credentials:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    return Credentials(salt, 4096, hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096))


def test_rfc_7677_client_side():
    client = ScramClient("user", "pencil", "rOprNGfwEbeRWgbNEkqO")
    assert client.first() == "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert client.final(SERVER_FIRST) == CLIENT_FINAL
    assert client.verify(SERVER_FINAL) and not client.verify("v=AAAA")


def test_rfc_7677_server_side():
    server = ScramServer(rfc_credentials(), "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert server.first("n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == SERVER_FIRST
    assert server.final(CLIENT_FINAL) == SERVER_FINAL


def test_a_wrong_password_or_a_replayed_nonce_fails():
    server = ScramServer(rfc_credentials(), "SERVERNONCE")
    client = ScramClient("user", "pencil!", "CLIENTNONCE")
    final = client.final(server.first(client.first()))
    with pytest.raises(ScramError, match="proof does not match"):
        server.final(final)
    other = ScramServer(rfc_credentials(), "FRESH")
    other.first("n,,n=user,r=CLIENTNONCE")
    with pytest.raises(ScramError, match="does not continue"):
        other.final(CLIENT_FINAL)
