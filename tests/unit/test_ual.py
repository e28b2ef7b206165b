"""User Access Lists (spec section 6): inheritance up to the root, and each decision in the session."""

from __future__ import annotations

import pytest

from gateway.ual import AccessList
from tests.gateway.test_feeding import make_registry, make_session, run, wire

UAL = AccessList({
    "/": {"admin": ["jtegen"], "remote": ["jtegen"]},
    "/stocks": {"publish": ["feeds"], "subscribe": ["jtegen", "guest"]},
    "/stocks/open": {"subscribe": ["*"]},
    "/hr": {"subscribe": ["boss"], "reply": []},
})


@pytest.mark.parametrize("account, action, topic, allowed", [
    ("anyone", "publish", "/news", True),  # no entry up to the root: open
    ("anyone", "admin", "/news", False),  # the root's entry
    ("jtegen", "admin", "/stocks/quotes/ibm", True),  # inherited from the root
    ("jtegen", "publish", "/stocks/quotes/ibm", False),  # /stocks decides, not the root
    ("FEEDS", "publish", "/stocks/quotes/ibm", True),  # names are case-insensitive
    ("guest", "subscribe", "/stocks/quotes", True),
    ("anyone", "subscribe", "/stocks/quotes", False),
    ("anyone", "subscribe", "/stocks/open/x", True),  # a nearer entry widens it again
    ("boss", "reply", "/hr/x", False),  # an empty list allows nobody
])
def test_the_nearest_entry_up_to_the_root_decides(account, action, topic, allowed):
    assert UAL.allows(account, action, topic) is allowed


def test_a_bad_entry_is_refused_at_start():
    with pytest.raises(ValueError, match="unknown actions"):
        AccessList({"/a": {"read": ["*"]}})


def session_as(account: str):
    """jtegen (the spec examples' account) under :data:`UAL` — or guest."""
    registry = make_registry(["/stocks/quotes/ibm", "/stocks/open/x", "/hr/pay", "/news"])
    session = make_session(registry=registry, access=UAL)
    password = "rowe7kuy" if account == "jtegen" else ""
    run(session, [f"LOGIN {account} CLEAR/1.0\r\nPASS {account} {password}\r\n".encode()])
    return session


def test_each_decision_in_the_session():
    jtegen = session_as("jtegen")
    assert wire(run(jtegen, [b"PUB MESSAGE /stocks/quotes/ibm A1\r\n\r\n.\r\n"])) == \
        b"401 Unauthorized (no publish permission on /stocks/quotes/ibm)\r\n\r\n"
    assert wire(run(jtegen, [b"SUB MESSAGE /hr/pay\r\n"])) == b"401 Unauthorized (no subscribe permission on /hr/pay)\r\n\r\n"
    assert wire(run(jtegen, [b"CREATE TOPIC /stocks/x\r\n"])) == b"200 OK\r\n\r\n"
    guest = session_as("guest")
    assert wire(run(guest, [b"CREATE TOPIC /news/x\r\n"])) == b"401 Unauthorized (no admin permission on /news/x)\r\n\r\n"
    assert wire(run(guest, [b"REMOVE TOPIC /news\r\n"])) == b"401 Unauthorized (no admin permission on /news)\r\n\r\n"
    assert wire(run(guest, [b"PUB MESSAGE /news A1\r\n\r\n.\r\n"])).startswith(b"200-OK")
    assert wire(run(guest, [b"PUB REPLY /hr/pay R1\r\nCmuid: jtegen/g/A1\r\n\r\n.\r\n"])) == \
        b"401 Unauthorized (no reply permission on /hr/pay)\r\n\r\n"
    assert wire(run(guest, [b"SET TOPIC DELIVERY /news ONE\r\n"])) == \
        b"401 Unauthorized (no admin permission on /news)\r\n\r\n"  # a queue parameter: the admin's


def test_reaching_a_remote_server_is_a_right_of_its_own():
    """Spec 6's sixth permission: only then does the server look for a link to that farm (none: 404)."""
    create = b"CREATE TOPIC /news/cnn > cnn.com:720/news\r\n"
    assert wire(run(session_as("guest"), [create])) == b"401 Unauthorized (no remote permission on /news/cnn)\r\n\r\n"
    assert wire(run(session_as("jtegen"), [create])) == \
        b"404 Not found (cnn.com:720: no link to that farm is configured here)\r\n\r\n"


def test_listing_never_reveals_what_the_login_may_not_see():
    guest = session_as("guest")
    assert wire(run(guest, [b"LIST TOPIC /\r\n"])) == b"200-OK\r\n200-/news\r\n200 /stocks\r\n\r\n"
    assert wire(run(guest, [b"COUNT TOPIC /*\r\n"])) == b"200-OK\r\n200 6\r\n\r\n"  # not /hr, /hr/pay
    assert wire(run(guest, [b"LIST TOPIC /hr\r\nGET TOPIC KEYWORDS /hr/pay\r\nFIND TOPIC /hr/*\r\n"])) == (
        b"404 Not found (/hr)\r\n\r\n404 Not found (/hr/pay)\r\n\r\n404 Not found (no topic matches /hr/*)\r\n\r\n")
