"""The messages a job keeps from their commit until they expire (streaming.sink.recent)."""

from __future__ import annotations

import pyarrow as pa

from streaming.sink.recent import RecentMessages

S = 1_000_000  # a second in µs
SCHEMA = pa.schema([("smuid", pa.int64()), ("topic", pa.string()), ("accepted_at", pa.timestamp("us", "UTC")),
                    ("expires_at", pa.timestamp("us", "UTC"))])


def batch(*messages: tuple[int, int, int | None]) -> pa.Table:
    """Committed rows of (smuid, accepted_at, expires_at), in seconds."""
    return pa.Table.from_pylist([{"smuid": smuid, "topic": f"/t/{smuid}", "accepted_at": accepted * S,
                                  "expires_at": None if expires is None else expires * S}
                                 for smuid, accepted, expires in messages], schema=SCHEMA)


def smuids(table: pa.Table | None) -> list[int]:
    return [] if table is None else sorted(table.column("smuid").to_pylist())


def test_only_messages_with_a_short_timeout_are_kept_and_given_back_as_committed():
    recent = RecentMessages(horizon_us=60 * S, grace_us=30 * S)
    assert recent.take([1]) is None  # nothing kept: the caller reads the table
    recent.keep(batch((1, 100, 102), (2, 100, None), (3, 100, 100 + 61), (4, 101, 160)))
    assert len(recent) == 2  # 1 (2 s) and 4 (59 s); not 2 (no Timeout) nor 3 (61 s)
    taken = recent.take([1, 2, 3, 4, 5])
    assert smuids(taken) == [1, 4]
    assert taken.filter(pa.compute.equal(taken.column("smuid"), 1)).to_pylist() == [
        {"smuid": 1, "topic": "/t/1", "accepted_at": batch((1, 100, 102)).column("accepted_at")[0].as_py(),
         "expires_at": batch((1, 100, 102)).column("expires_at")[0].as_py()}]


def test_a_batch_is_forgotten_a_grace_after_its_last_message_expired():
    recent = RecentMessages(horizon_us=60 * S, grace_us=30 * S)
    recent.keep(batch((1, 100, 102), (2, 100, 110)))
    recent.keep(batch((3, 139, 141)))  # the clock (newest acceptance) at 139: 110 + 30 not passed
    assert smuids(recent.take([1, 2, 3])) == [1, 2, 3]
    recent.keep(batch((4, 141, 143)))  # at 141, 110 expired more than 30 s ago
    assert smuids(recent.take([1, 2, 3, 4])) == [3, 4]


def test_a_replayed_commit_gives_each_message_once():
    recent = RecentMessages()
    recent.keep(batch((1, 100, 102), (2, 100, 103)))
    recent.keep(batch((1, 100, 102), (2, 100, 103)))
    assert smuids(recent.take([1, 2])) == [1, 2]
