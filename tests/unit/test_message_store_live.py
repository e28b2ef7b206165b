"""Issue 32 item 8 (spec 2.4): read at a moment, a topic holds its live messages only.

A message whose ``expires_at`` has passed, or that the job put in the topic's Trash, is dead: COUNT,
LIST and GET MESSAGE on the topic no longer see it (the Trash path shows the trashed ones).  The
store decides from its tables and the ``now`` it is given; without one it reads the whole history.
"""

from __future__ import annotations

from datetime import datetime, timezone

from tests.unit.test_message_store import ACCEPTED, append, row, store, trash, trash_row

SECOND = 1_000_000


def expiring(smuid: int, topic: str, expires_at: int | None) -> dict:
    message = row(smuid, topic)
    if expires_at is not None:
        message["expires_at"] = datetime.fromtimestamp(expires_at // SECOND, timezone.utc).replace(
            microsecond=expires_at % SECOND)
    return message


def fill(tmp_path) -> None:
    append(tmp_path / "messages",
           expiring(1, "/q", ACCEPTED + 2 * SECOND),  # expires 2 s after acceptance
           expiring(2, "/q", None),  # a state message: never expires
           expiring(3, "/q", ACCEPTED + 60 * SECOND),  # alive, but the job trashed it (max_retries)
           expiring(4, "/q", ACCEPTED + 60 * SECOND))
    trash(tmp_path / "trash", trash_row(3, "/q", reason="max_retries"))


def test_an_expired_or_trashed_message_is_gone_from_its_topic_at_that_moment(tmp_path):
    fill(tmp_path)
    messages = store(tmp_path)
    before_expiry, after_expiry = ACCEPTED + SECOND, ACCEPTED + 2 * SECOND  # expiry is at, not after

    assert [m.smuid for m in messages.messages("/q", now=before_expiry)] == [1, 2, 4]
    assert messages.smuids("/q", now=before_expiry) == [1, 2, 4]
    assert [m.smuid for m in messages.messages("/q", now=after_expiry)] == [2, 4]
    assert messages.smuids("/q", now=after_expiry) == [2, 4]
    assert messages.smuids("/q", now=ACCEPTED + 61 * SECOND) == [2]


def test_the_trash_path_still_shows_the_dead_and_no_moment_means_the_whole_history(tmp_path):
    fill(tmp_path)
    messages = store(tmp_path)
    late = ACCEPTED + 3 * SECOND

    assert [m.smuid for m in messages.messages("/q/Trash", now=late)] == [3]
    assert messages.smuids("/q/Trash", now=late) == [3]
    assert messages.smuids("/q") == [1, 2, 3, 4]


def test_without_a_trash_table_yet_only_expiry_decides(tmp_path):
    append(tmp_path / "messages", expiring(1, "/q", ACCEPTED + SECOND), expiring(2, "/q", None))
    assert store(tmp_path).smuids("/q", now=ACCEPTED + 5 * SECOND) == [2]
