"""SMUIDs, account hashes, configuration loading, topic rules and time formats."""

from datetime import datetime, timedelta, timezone

import pytest

from gateway.accounts import Accounts, hash_password, verify_password
from gateway.ids import SmuidFactory, new_guid
from gateway.protocol.actions import AuthResult
from schemas.config import load_config
from schemas.timefmt import format_date_time, format_timeout, parse_date_time, parse_timeout
from schemas.topics import RootWildcardError, TopicError, canonical, parse_pattern


def test_smuids_increase_even_when_the_clock_steps_back_and_carry_the_node():
    now = iter([1_800_000_000_000, 1_800_000_000_000, 1_799_999_999_000, 1_800_000_000_001])
    factory = SmuidFactory(node_id=5, now_ms=lambda: next(now))
    ids = [factory() for _ in range(4)]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert all((i >> 12) & 1023 == 5 for i in ids)


def test_two_gateways_never_issue_the_same_smuid_in_the_same_millisecond():
    clock = lambda: 1_800_000_000_000  # noqa: E731
    a, b = SmuidFactory(1, clock), SmuidFactory(2, clock)
    assert not {a() for _ in range(100)} & {b() for _ in range(100)}


def test_node_id_out_of_range_is_refused():
    with pytest.raises(ValueError, match="node_id"):
        SmuidFactory(1024)


def test_guids_are_unique_per_login():
    assert new_guid("bob") != new_guid("bob") and new_guid("bob").startswith("bob")


def test_passwords_are_stored_hashed_and_verified():
    stored = hash_password("s3cret", iterations=1000)
    assert "s3cret" not in stored and verify_password("s3cret", stored)
    assert not verify_password("wrong", stored) and not verify_password("s3cret", "garbage")


def test_accounts_unknown_bad_password_and_guest():
    accounts = Accounts({"Bob": hash_password("pw", iterations=1000)})
    assert accounts.authenticate("bob", "pw") is AuthResult.OK
    assert accounts.authenticate("bob", "nope") is AuthResult.BAD_PASSWORD
    assert accounts.authenticate("carol", "pw") is AuthResult.UNKNOWN_ACCOUNT
    assert accounts.authenticate("guest", "") is AuthResult.OK
    assert Accounts({}, allow_guest=False).authenticate("guest", "") is AuthResult.UNKNOWN_ACCOUNT


def test_config_file_then_environment(tmp_path):
    path = tmp_path / "smqp.toml"
    path.write_text('data_dir = "/srv/smqp"\n[gateway]\nport = 9000\nnode_id = 3\n')
    config = load_config(path, env={"SMQP_GATEWAY_PORT": "9100", "SMQP_GATEWAY_ALLOW_GUEST": "no"})
    assert (config.data_dir, config.gateway.port, config.gateway.node_id) == ("/srv/smqp", 9100, 3)
    assert config.gateway.allow_guest is False
    assert config.table_path("messages") == "/srv/smqp/tables/messages"


def test_config_rejects_unknown_keys(tmp_path):
    path = tmp_path / "smqp.toml"
    path.write_text("[gateway]\nprot = 9000\n")
    with pytest.raises(ValueError, match="prot"):
        load_config(path, env={})


def test_topic_rules():
    assert canonical("/Stocks/Quotes/IBM") == "/stocks/quotes/ibm"
    for bad in ("stocks", "/", "/a//b", "/9lives", "/a b", "/a/Trash", "/a-b"):
        with pytest.raises(TopicError):
            canonical(bad)
    with pytest.raises(TopicError) as too_long:
        canonical("/" + "a" * 33)
    assert too_long.value.too_long
    with pytest.raises(RootWildcardError):
        parse_pattern("/*")
    pattern = parse_pattern("/Stocks/*")
    assert pattern.matches("/stocks/quotes/ibm") and not pattern.matches("/stocksx/a")
    assert not pattern.matches("/stocks")


def test_date_time_and_timeout_formats():
    moment = datetime(2001, 8, 23, 14, 45, 12, 460000, tzinfo=timezone.utc)
    assert format_date_time(moment) == "D20010823T14451246Z"
    assert parse_date_time("D20010823T14451246Z") == moment
    assert parse_date_time("D20010915T080000") == datetime(2001, 9, 15, 8, tzinfo=timezone.utc)
    assert parse_timeout("00:24:00:00") == timedelta(hours=24)
    assert parse_timeout("00:01:00") == timedelta(minutes=1)
    assert parse_timeout("INF") is None and parse_timeout("-1") is None
    assert format_timeout(timedelta(days=1, seconds=5)) == "01:00:00:05"
    with pytest.raises(ValueError):
        parse_timeout("soon")


def test_repeated_failed_logins_are_throttled_then_allowed_again():
    from gateway.accounts import Accounts, hash_password
    now = [0.0]
    accounts = Accounts({"ann": hash_password("right", iterations=1000)}, max_failures=3, lockout_s=30,
                        throttle_s=30, clock=lambda: now[0])
    assert [accounts.authenticate("ann", "wrong") for _ in range(3)] == [AuthResult.BAD_PASSWORD] * 3
    assert accounts.authenticate("ann", "right") is AuthResult.THROTTLED  # not even checked
    now[0] = 29.9
    assert accounts.authenticate("ANN", "right") is AuthResult.THROTTLED
    now[0] = 30.0
    assert accounts.authenticate("ann", "right") is AuthResult.OK
    assert accounts.authenticate("ann", "wrong") is AuthResult.BAD_PASSWORD  # the count started again
    assert accounts.authenticate("ann", "right") is AuthResult.OK


def test_the_jobs_cpu_priority_is_nice_10_by_default_and_checked():
    assert load_config(env={}).streaming.nice == 10
    assert load_config(env={"SMQP_STREAMING_NICE": "0"}).streaming.nice == 0
    with pytest.raises(ValueError, match="nice"):
        load_config(env={"SMQP_STREAMING_NICE": "20"})


def test_compaction_by_file_count_is_50_by_default_0_for_off_and_never_negative():
    assert load_config(env={}).streaming.compact_files == 50
    assert load_config(env={"SMQP_STREAMING_COMPACT_FILES": "0"}).streaming.compact_files == 0
    with pytest.raises(ValueError, match="compact_files"):
        load_config(env={"SMQP_STREAMING_COMPACT_FILES": "-1"})


def test_kept_reads_are_32_mib_by_default_0_for_off_and_never_negative():
    assert load_config(env={}).gateway.kept_read_bytes == 32 << 20
    assert load_config(env={"SMQP_GATEWAY_KEPT_READ_BYTES": "0"}).gateway.kept_read_bytes == 0
    with pytest.raises(ValueError, match="kept_read_bytes"):
        load_config(env={"SMQP_GATEWAY_KEPT_READ_BYTES": "-1"})
