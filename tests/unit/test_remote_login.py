"""How this farm logs in to another (issue 33): the creating account when its link names it, with
the password from the environment, else guest; a password crosses a plain connection only as SCRAM."""

from __future__ import annotations

import ssl

import pytest

from gateway.server.remote import link_ssl, login_method, pull_login
from schemas.config import LinkConfig

LINK = LinkConfig("b.example", "127.0.0.1:7721", accounts={"Ann": "ANN_AT_B"})


def test_the_creating_account_when_the_link_names_it_else_guest():
    assert pull_login(LINK, "ann", env={"ANN_AT_B": "s3cret"}) == ("ann", "s3cret")
    assert pull_login(LINK, "bob", env={"ANN_AT_B": "s3cret"}) == ("guest", "")
    assert pull_login(LINK, None, env={}) == ("guest", "")  # a topic whose creator is not known
    with pytest.raises(KeyError):  # named, but its password is not there: no guessing
        pull_login(LINK, "ann", env={})


def test_a_password_crosses_a_plain_link_only_as_scram():
    assert login_method(LINK, "ann") == "SCRAM-SHA-256"
    assert login_method(LINK, "guest") == "CLEAR"
    secure = LinkConfig("b.example", "127.0.0.1:7722", tls=True)
    assert login_method(secure, "ann") == "CLEAR"
    assert link_ssl(LINK) is None
    context = link_ssl(secure)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
