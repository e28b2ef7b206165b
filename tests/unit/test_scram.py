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


def change_exchange(old: str, salt: bytes = b"new-salt-16bytes", iterations: int = 4096):
    """A SET LOGIN PASSWORD exchange up to the server's offer: (server, client, offer)."""
    server = ScramServer(rfc_credentials(), "SERVERNONCE")
    client = ScramClient("user", old, "CLIENTNONCE")
    server_final = server.final(client.final(server.first(client.first())))
    return server, client, server.offer_new_password(server_final, salt, iterations)


def test_a_password_change_carries_only_the_masked_salted_password():
    server, client, offer = change_exchange("pencil")
    answer = client.new_password(offer, "crayon")
    stored = server.new_credentials(answer)
    expected = hashlib.pbkdf2_hmac("sha256", b"crayon", b"new-salt-16bytes", 4096)
    assert stored == Credentials(b"new-salt-16bytes", 4096, expected)
    assert base64.b64encode(expected).decode() not in answer and "crayon" not in answer


def test_a_password_change_refuses_a_tampered_answer_and_a_server_without_proof():
    server, client, offer = change_exchange("pencil")
    answer = client.new_password(offer, "crayon")
    masked = base64.b64decode(answer[2:answer.index(",p=")])
    flipped = base64.b64encode(bytes([masked[0] ^ 1]) + masked[1:]).decode()
    with pytest.raises(ScramError, match="new password proof does not match"):
        server.new_credentials(f"h={flipped}{answer[answer.index(',p='):]}")
    forged = offer.replace(offer[2:6], "AAAA", 1)  # a server that does not know the old password
    with pytest.raises(ScramError, match="did not prove"):
        client.new_password(forged, "crayon")
    unproved = ScramServer(rfc_credentials(), "X")
    with pytest.raises(ScramError, match="not been proved"):
        unproved.offer_new_password("v=", b"salt", 4096)
