"""The session guards of issue 32, on the sans-I/O core and the account store: failed logins
throttled by source address and account together and for a bounded time, SET NOTIFY PORT only
back to the client (or configured hosts), CLEAR passwords refused on the plain port when SMQPS
is there, 414 for the subscription cap (510 for ``/*`` only) and the 128-character Name."""

from __future__ import annotations

from gateway.accounts import Accounts, hash_password
from gateway.protocol.actions import AuthResult, ConnectNotify, Durable
from tests.gateway.test_feeding import (
    feed_three_ways,
    make_config,
    make_registry,
    make_session,
    run,
    wire,
)
from tests.gateway.test_session_errors import pub

OK = b"200 OK\r\n\r\n"
LOGIN_CLEAR = b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n"


def ann_accounts(now: list[float], **limits) -> Accounts:
    return Accounts({"ann": hash_password("right", iterations=1000)}, clock=lambda: now[0], **limits)


# -- item 4: the failed-login throttle


def test_a_strangers_failures_never_refuse_the_owner_at_another_address():
    now = [0.0]
    accounts = ann_accounts(now, max_failures=3, lockout_s=30)
    for _ in range(10):
        assert accounts.authenticate("ann", "guess", source="203.0.113.9") in (
            AuthResult.BAD_PASSWORD, AuthResult.THROTTLED)
    assert accounts.authenticate("ann", "right", source="203.0.113.9") is AuthResult.THROTTLED
    assert accounts.authenticate("ann", "right", source="198.51.100.4") is AuthResult.OK
    assert accounts.scram_credentials("ann", source="198.51.100.4") is not AuthResult.THROTTLED
    assert accounts.scram_credentials("ann", source="203.0.113.9") is AuthResult.THROTTLED


def test_guest_is_not_locked_out_by_someone_elses_failures():
    now = [0.0]
    accounts = ann_accounts(now, max_failures=2)
    for _ in range(5):
        accounts.authenticate("guest", "not-blank", source="203.0.113.9")
    assert accounts.authenticate("guest", "", source="192.0.2.1") is AuthResult.OK


def test_a_correct_password_is_refused_no_longer_than_the_throttle_bound():
    now = [0.0]
    accounts = ann_accounts(now, max_failures=3, lockout_s=30, throttle_s=2.0)
    assert [accounts.authenticate("ann", "wrong", "192.0.2.1") for _ in range(3)] == [AuthResult.BAD_PASSWORD] * 3
    now[0] = 1.9
    assert accounts.authenticate("ann", "right", "192.0.2.1") is AuthResult.THROTTLED  # not even checked
    now[0] = 2.0
    assert accounts.authenticate("ann", "right", "192.0.2.1") is AuthResult.OK
    for _ in range(3):
        accounts.authenticate("ann", "wrong", "192.0.2.1")
    now[0] = 5.0  # each further failure past the limit refuses the pair again, for the bound only
    assert accounts.authenticate("ann", "wrong", "192.0.2.1") is AuthResult.BAD_PASSWORD
    assert accounts.authenticate("ann", "right", "192.0.2.1") is AuthResult.THROTTLED
    now[0] = 7.0
    assert accounts.authenticate("ann", "right", "192.0.2.1") is AuthResult.OK


def test_an_ipv6_host_is_throttled_by_its_64_and_a_mapped_ipv4_as_the_ipv4_address():
    now = [0.0]
    accounts = ann_accounts(now, max_failures=2)
    for source in ("2001:db8:0:1::5", "2001:db8:0:1::6"):  # one /64, two addresses
        accounts.authenticate("ann", "wrong", source)
    assert accounts.authenticate("ann", "right", "2001:db8:0:1::7") is AuthResult.THROTTLED
    assert accounts.authenticate("ann", "right", "2001:db8:0:2::7") is AuthResult.OK
    for _ in range(2):
        accounts.authenticate("ann", "wrong", "::ffff:192.0.2.1")
    assert accounts.authenticate("ann", "right", "192.0.2.1") is AuthResult.THROTTLED


# -- item 5: SET NOTIFY PORT goes back to the client only


def at(peer: str, **config):
    def factory():
        session = make_session(make_config(**config), peer=peer)
        run(session, [LOGIN_CLEAR])
        return session
    return factory


def test_set_notify_port_to_another_host_is_401_and_connects_nowhere():
    actions = feed_three_ways(b"SET NOTIFY PORT 22 10.0.0.7\r\nSET NOTIFY PORT 7731 192.0.2.1\r\n"
                              b"SET NOTIFY PORT 7732 ::ffff:192.0.2.1\r\n", at("192.0.2.1"))
    assert wire(actions[:1]) == (b"401 Unauthorized (notifications go only to this session's own address "
                                 b"192.0.2.1 or a host the configuration allows, not 10.0.0.7)\r\n\r\n")
    assert actions[1:] == [ConnectNotify("192.0.2.1", 7731), ConnectNotify("::ffff:192.0.2.1", 7732)]


def test_set_notify_port_to_a_configured_host_is_allowed():
    actions = feed_three_ways(b"SET NOTIFY PORT 7731 relay.example\r\nSET NOTIFY PORT 7732 10.0.0.8\r\n",
                              at("192.0.2.1", notify_hosts=("Relay.Example",)))
    assert actions[0] == ConnectNotify("relay.example", 7731)
    assert wire(actions[1:]).startswith(b"401 Unauthorized (notifications go only")


# -- item 6: CLEAR passwords on the plain port


def test_clear_login_on_the_plain_port_is_405_when_smqps_is_configured():
    plain = make_session(make_config(tls_port=7721), peer="192.0.2.1")
    assert wire(run(plain, [b"LOGIN jtegen CLEAR/1.0\r\n"])) == (
        b"405 Not allowed (CLEAR passwords only over SMQPS (port 7721); use SCRAM-SHA-256/1.0 on this port)\r\n\r\n")
    assert wire(run(plain, [b"PASS jtegen rowe7kuy\r\n"])) == b"400 Bad request (PASS without a matching LOGIN)\r\n\r\n"
    assert not plain.logged_in


def test_clear_login_is_taken_over_smqps_and_where_no_smqps_is_configured_or_it_is_switched_off():
    for config, tls in ((make_config(tls_port=7721), True), (make_config(), False),
                        (make_config(tls_port=7721, clear_only_over_tls=False), False)):
        session = make_session(config, tls=tls)
        assert wire(run(session, [LOGIN_CLEAR])).startswith(OK + b"200-OK\r\n")
        assert session.logged_in


def scram_logged_in(config):
    """A session logged in by SCRAM-SHA-256 on the plain port (what stays allowed there)."""
    import base64

    from gateway.scram import Credentials, ScramClient, salted_password
    credentials = Credentials(b"salt", 4096, salted_password("rowe7kuy", b"salt", 4096))
    session = make_session(config, scram_credentials=lambda user: credentials)
    client = ScramClient("jtegen", "rowe7kuy", "CLIENT")
    encode = lambda text: base64.b64encode(text.encode()) + b"\r\n"  # noqa: E731
    assert wire(run(session, [b"LOGIN jtegen SCRAM-SHA-256/1.0\r\n"])) == b"200-OK\r\n200 +\r\n\r\n"
    server_first = wire(run(session, [encode(client.first())]))[2:].strip()
    run(session, [encode(client.final(base64.b64decode(server_first).decode()))])
    return session


def test_scram_stays_allowed_on_the_plain_port_and_a_clear_password_change_there_is_405():
    session = scram_logged_in(make_config(tls_port=7721))
    assert session.logged_in
    assert wire(run(session, [b"SET LOGIN PASSWORD CLEAR/1.0\r\n"])) == (
        b"405 Not allowed (CLEAR passwords only over SMQPS (port 7721); use SCRAM-SHA-256/1.0 on this port)\r\n\r\n")
    assert wire(run(session, [b"rowe7kuy\r\n"])) == b"400 Bad request (unknown command)\r\n\r\n"


# -- item 10: 414 "cannot subscribe to any more"; 510 for /* only


def test_the_subscription_cap_is_414_and_root_wildcard_stays_510():
    def capped():
        session = make_session(make_config(max_subscriptions=1), registry=make_registry(["/b", "/c"]))
        run(session, [LOGIN_CLEAR])
        return session
    actions = feed_three_ways(b"SUB MESSAGE /b\r\nSUB MESSAGE /c\r\nSUB MESSAGE /*\r\n", capped)
    assert wire(actions) == (b"200-OK\r\n200 /b\r\n\r\n"
                             b"414 Resource too large (cannot subscribe to any more: 1 subscriptions already, "
                             b"the most one account may have)\r\n\r\n"
                             b"510 Maximum quantities exceeded\r\n\r\n")


# -- item 11: Name is one line of at most 128 characters


def test_a_name_of_129_characters_is_400_and_publishes_nothing():
    actions = feed_three_ways(pub(b"", headers=b"Name: " + b"n" * 129 + b"\r\n"))
    assert wire(actions) == b"400 Bad request (Name is limited to one line of at most 128 characters)\r\n\r\n"
    assert not [a for a in actions if isinstance(a, Durable)]


def test_a_name_of_128_characters_is_published():
    actions = feed_three_ways(pub(b"", headers=b"Name: " + "é".encode() * 128 + b"\r\n"))
    assert [a.event.topic for a in actions if isinstance(a, Durable)] == ["/stocks/quotes/ibm"]
