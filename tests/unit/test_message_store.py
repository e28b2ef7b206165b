"""MessageStore reads the job's ``messages`` Delta table: one topic, by SMUID, decoded; lags are fine.
And each topic's Trash from the ``trash`` table, completed from ``messages``."""

from __future__ import annotations

import base64
import threading
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from gateway.server.message_store import COPIED_TO_TRASH, MessageStore, StoredMessage
from schemas.events import Deliver, Section
from schemas.spark import MESSAGES_TABLE, TRASH_FROM_MESSAGE, TRASH_TABLE, arrow_schema

BINARY = b"\x00\xff line one\r\n.\r\nafter the dot\r\n"
ACCEPTED = 1_700_000_000_123_456  # microseconds, not a whole millisecond


def row(smuid: int, topic: str, sections: list[Section] = (), headers=(), priority: int = 0,
        accepted_at: int = ACCEPTED, batch_id: int = 0) -> dict:
    """One ``messages`` row as the sink writes it (section data base64)."""
    return {
        "smuid": smuid, "topic": topic, "cmuid": f"C{smuid}", "publisher": "alice", "publisher_guid": "g1",
        "priority": priority, "headers": [list(h) for h in headers],
        "sections": [{"headers": [list(h) for h in s.headers], "data": base64.b64encode(s.data).decode()}
                     for s in sections],
        "accepted_at": datetime.fromtimestamp(accepted_at // 1_000_000, timezone.utc).replace(
            microsecond=accepted_at % 1_000_000),
        "kafka_partition": 0, "kafka_offset": smuid, "batch_id": batch_id,
    }


def append(path, *rows: dict) -> None:
    write_deltalake(str(path), pa.Table.from_pylist(list(rows), schema=arrow_schema(MESSAGES_TABLE)), mode="append")


def store(tmp_path) -> MessageStore:
    return MessageStore(str(tmp_path / "messages"), str(tmp_path / "deliveries"))


def test_one_topic_by_smuid_with_headers_sections_and_time_decoded(tmp_path):
    text = Section([("Content-Type", "text/plain")], b"34.456")
    binary = Section([("Content-Type", "application/octet-stream"), ("Content-Length", str(len(BINARY)))], BINARY)
    append(tmp_path / "messages",
           row(30, "/stocks/ibm", [text, binary], headers=[("Subject", "quote"), ("X-Seq", "2")], priority=3),
           row(20, "/stocks/sony", [text]),
           row(10, "/stocks/ibm", [text], accepted_at=ACCEPTED - 1),
           row(40, "/stocks/ibm/sub", [text]))
    append(tmp_path / "messages", row(25, "/stocks/ibm", [], batch_id=1))

    got = store(tmp_path).messages("/stocks/ibm")

    assert [m.smuid for m in got] == [10, 25, 30]
    assert got[2] == StoredMessage(
        smuid=30, topic="/stocks/ibm", cmuid="C30", publisher="alice", publisher_guid="g1",
        accepted_at=ACCEPTED, priority=3, headers=[("Subject", "quote"), ("X-Seq", "2")], sections=[text, binary])
    assert got[2].sections[1].data == BINARY
    assert got[0].accepted_at == ACCEPTED - 1
    assert got[1].sections == [] and got[1].headers == []
    assert [m.smuid for m in store(tmp_path).messages("/stocks/sony")] == [20]
    assert store(tmp_path).messages("/STOCKS/IBM") == []  # canonical topics only: exact match
    assert store(tmp_path).messages("/stocks") == []


def test_no_table_yet_means_no_messages_until_the_job_creates_it(tmp_path):
    messages = store(tmp_path)
    assert messages.messages("/t") == []
    append(tmp_path / "messages", row(1, "/t"))
    assert [m.smuid for m in messages.messages("/t")] == [1]


def test_a_later_commit_is_seen_by_the_next_read(tmp_path):
    append(tmp_path / "messages", row(1, "/t"), row(2, "/u"))
    messages = store(tmp_path)
    assert [m.smuid for m in messages.messages("/t")] == [1]
    append(tmp_path / "messages", row(3, "/t", batch_id=1), row(4, "/u", batch_id=1))
    assert [m.smuid for m in messages.messages("/t")] == [1, 3]
    assert [m.smuid for m in messages.messages("/u")] == [2, 4]


def test_concurrent_reads_from_threads(tmp_path):
    append(tmp_path / "messages", *(row(n, "/t" if n % 2 else "/u") for n in range(1, 41)))
    messages = store(tmp_path)
    results: list[list[int]] = []

    def read(topic: str) -> None:
        for _ in range(5):
            results.append([m.smuid for m in messages.messages(topic)])

    threads = [threading.Thread(target=read, args=("/t" if i % 2 else "/u",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    odd, even = list(range(1, 41, 2)), list(range(2, 41, 2))
    assert len(results) == 30 and all(r in (odd, even) for r in results)


def test_to_deliver_carries_everything_a_notify_needs(tmp_path):
    section = Section([], b"x")
    append(tmp_path / "messages", row(7, "/t", [section], headers=[("Subject", "s")], priority=2))
    (message,) = store(tmp_path).messages("/t")
    assert message.to_deliver("bob") == Deliver("bob", 7, "/t", "C7", "alice", "g1", ACCEPTED, 2,
                                                [("Subject", "s")], [section])


# -- each topic's Trash (the job's ``trash`` table)

TRASHED = 1_700_000_360_000_001  # microseconds, six minutes after ACCEPTED


def trash_row(smuid: int, topic: str, reason: str = "expired", trashed_at: int = TRASHED,
              sections: list[Section] = (), headers=()) -> dict:
    """One ``trash`` row as the sink writes it (``trash_topic`` = ``<topic>/Trash``)."""
    message = row(smuid, topic, sections, headers)
    return {"smuid": smuid, "topic": topic, "trash_topic": f"{topic}/Trash", "reason": reason,
            "trashed_at": datetime.fromtimestamp(trashed_at // 1_000_000, timezone.utc).replace(
                microsecond=trashed_at % 1_000_000),
            "publisher": message["publisher"], "cmuid": message["cmuid"], "headers": message["headers"],
            "sections": message["sections"], "batch_id": 3}


def trash(path, *rows: dict) -> None:
    write_deltalake(str(path), pa.Table.from_pylist(list(rows), schema=arrow_schema(TRASH_TABLE)), mode="append")


def test_a_trash_path_reads_that_topics_trash_completed_from_its_messages_rows(tmp_path):
    text = Section([("Content-Type", "text/plain")], b"24.567")
    append(tmp_path / "messages", row(10, "/t", [text], headers=[("Subject", "s")], priority=4),
           row(20, "/t", [text]), row(30, "/t"), row(15, "/u"))
    trash(tmp_path / "trash", trash_row(20, "/t", "max_retries", TRASHED + 1, [text]),
          trash_row(10, "/t", sections=[text], headers=[("Subject", "s")]), trash_row(15, "/u"))

    got = store(tmp_path).messages("/t/Trash")

    assert got == [
        StoredMessage(smuid=10, topic="/t", cmuid="C10", publisher="alice", publisher_guid="g1", accepted_at=ACCEPTED,
                      priority=4, headers=[("Subject", "s")], sections=[text], trash_reason="expired",
                      trashed_at=TRASHED),
        StoredMessage(smuid=20, topic="/t", cmuid="C20", publisher="alice", publisher_guid="g1", accepted_at=ACCEPTED,
                      priority=0, headers=[], sections=[text], trash_reason="max_retries", trashed_at=TRASHED + 1),
    ]
    assert store(tmp_path).trashed("/t") == got
    assert [m.smuid for m in store(tmp_path).messages("/u/Trash")] == [15]
    # the topic itself still reads every message it had, none marked as trashed
    assert [(m.smuid, m.trash_reason) for m in store(tmp_path).messages("/t")] == [(10, None), (20, None), (30, None)]


def test_a_trash_row_the_job_copied_its_message_into_is_shown_without_reading_messages(tmp_path):
    """The job copies a message's GUID, priority, acceptance time and route into its ``trash`` row,
    so its Trash shows them with no ``messages`` row to read; an older row without them is still
    completed from ``messages``."""
    copied = {**trash_row(10, "/t"), "publisher_guid": "g9", "priority": 4, "accepted_at": row(10, "/t",
              accepted_at=ACCEPTED + 7)["accepted_at"], "depth": 2, "hops": ["b.example"],
              "origin": "b.example/7", "origin_topic": "b.example/t"}
    trash(tmp_path / "trash", copied, trash_row(20, "/t"))
    append(tmp_path / "messages", row(20, "/t", priority=3))  # the older row's message only

    got = store(tmp_path).messages("/t/Trash")

    assert [(m.smuid, m.publisher_guid, m.priority, m.accepted_at, m.depth, m.hops, m.origin, m.origin_topic)
            for m in got] == [(10, "g9", 4, ACCEPTED + 7, 2, ("b.example",), "b.example/7", "b.example/t"),
                              (20, "g1", 3, ACCEPTED, 0, (), None, None)]


def test_the_gateway_reads_the_columns_the_job_copies_into_a_trash_row():
    assert COPIED_TO_TRASH == list(TRASH_FROM_MESSAGE)


def test_an_empty_or_missing_trash_reads_as_empty(tmp_path):
    messages = store(tmp_path)
    assert messages.messages("/t/Trash") == []  # neither table yet
    append(tmp_path / "messages", row(1, "/t"))
    assert messages.messages("/t/Trash") == []  # no trash table yet
    trash(tmp_path / "trash", trash_row(1, "/t"))
    assert [m.smuid for m in messages.messages("/t/Trash")] == [1]  # a later commit is seen
    assert messages.messages("/v/Trash") == []


def test_a_trashed_message_without_its_messages_row_still_shows_with_its_smuids_time(tmp_path):
    """Nothing disappears silently: should the ``messages`` row be gone, the Trash row alone is shown."""
    smuid = (86_400_000 << 22) | 5  # made one day after the SMUID epoch (2025-01-02T00:00:00Z)
    trash(tmp_path / "trash", trash_row(smuid, "/t"))
    (message,) = store(tmp_path).messages("/t/Trash")
    assert (message.smuid, message.publisher, message.publisher_guid, message.cmuid) == \
        (smuid, "alice", "", f"C{smuid}")
    assert message.accepted_at == int(datetime(2025, 1, 2, tzinfo=timezone.utc).timestamp()) * 1_000_000
    assert message.trash_reason == "expired" and message.trashed_at == TRASHED


def test_rows_deleted_from_the_trash_are_gone_from_the_next_read(tmp_path):
    """What the retention sweep removes (:mod:`streaming.retention`) is no longer listed."""
    append(tmp_path / "messages", row(1, "/t"), row(2, "/t"))
    trash(tmp_path / "trash", trash_row(1, "/t", trashed_at=TRASHED), trash_row(2, "/t", trashed_at=TRASHED + 10))
    messages = store(tmp_path)
    assert [m.smuid for m in messages.messages("/t/Trash")] == [1, 2]
    DeltaTable(str(tmp_path / "trash")).delete("smuid = 1")
    assert [m.smuid for m in messages.messages("/t/Trash")] == [2]


def test_smuids_are_what_a_count_reads_of_a_topic_and_of_its_trash(tmp_path):
    text = Section([("Content-Type", "text/plain")], b"x")
    append(tmp_path / "messages", row(30, "/a", [text]), row(10, "/a", [text]), row(20, "/b", [text]))
    append(tmp_path / "messages", row(30, "/a", [text], batch_id=1))  # a row written twice counts once
    messages = store(tmp_path)
    assert messages.smuids("/a") == [m.smuid for m in messages.messages("/a")] == [10, 30]
    assert messages.smuids("/a/Trash") == messages.messages("/a/Trash") == []
    trash(tmp_path / "trash", trash_row(10, "/a"), trash_row(10, "/a"), trash_row(20, "/b"))
    assert messages.smuids("/a/Trash") == [m.smuid for m in messages.messages("/a/Trash")] == [10]
    assert messages.smuids("/nothing") == []


def _spoil_files_beyond(table_path, smuid: int) -> None:
    """Overwrite every data file of the table holding a row above ``smuid`` with garbage: a read
    that opens one fails."""
    table = DeltaTable(str(table_path))
    for uri in table.file_uris():
        if pq.read_table(uri, columns=["smuid"]).column("smuid").to_pylist()[-1] > smuid:
            with open(uri, "wb") as spoiled:
                spoiled.write(b"not parquet")


def test_a_span_of_smuids_reads_only_the_files_that_may_hold_them(tmp_path):
    """GET MESSAGE of given SMUIDs reads the files whose SMUID range (in the Delta log) meets theirs,
    not every file of the table: a file beyond the span is never opened, and the span's messages,
    live and trashed, read as a whole-topic read finds them."""
    now = ACCEPTED + 10_000_000
    for batch, smuids in enumerate(([1, 2], [3, 4], [5, 6], [7, 8])):
        append(tmp_path / "messages", *(row(smuid, "/t" if smuid % 2 else "/u", batch_id=batch) for smuid in smuids))
        trash(tmp_path / "trash", trash_row(smuids[0], "/t" if smuids[0] % 2 else "/u"))
    whole = store(tmp_path)
    assert [m.smuid for m in whole.messages("/t")] == [1, 3, 5, 7]
    assert [m.smuid for m in whole.messages("/t", now)] == []  # all four trashed
    expected_trash = [m for m in whole.messages("/t/Trash") if 3 <= m.smuid <= 4]

    _spoil_files_beyond(tmp_path / "messages", 4)
    _spoil_files_beyond(tmp_path / "trash", 4)
    messages = store(tmp_path)

    assert [m.smuid for m in messages.messages("/t", span=(2, 3))] == [3]
    assert [m.smuid for m in messages.messages("/u", span=(1, 4))] == [2, 4]
    assert messages.messages("/t", now, span=(2, 4)) == []  # 3 is in the Trash
    assert messages.messages("/t/Trash", span=(3, 4)) == expected_trash != []
    assert [m.smuid for m in messages.messages("/u", now, span=(1, 4))] == [2, 4]


def test_a_read_after_a_commit_or_a_deletion_sees_that_version(tmp_path):
    """The store keeps a table's files between reads of one version; any new version (a commit, the
    retention sweep's deletion, a compaction) is read anew."""
    append(tmp_path / "messages", row(1, "/t"))
    trash(tmp_path / "trash", trash_row(1, "/t"))
    messages = store(tmp_path)
    assert messages.smuids("/t") == [1] and messages.smuids("/t/Trash") == [1]
    append(tmp_path / "messages", row(2, "/t", batch_id=1))
    trash(tmp_path / "trash", trash_row(2, "/t"))
    assert messages.smuids("/t") == [1, 2] and messages.smuids("/t/Trash") == [1, 2]
    DeltaTable(str(tmp_path / "trash")).optimize.compact()
    DeltaTable(str(tmp_path / "trash")).delete("smuid = 1")
    assert messages.smuids("/t/Trash") == [2]
    assert [m.smuid for m in messages.messages("/t", ACCEPTED + 1)] == [1]  # 2 is in the Trash


def _spoil_every_file(table_path) -> None:
    _spoil_files_beyond(table_path, -1)


def test_a_poll_of_an_unchanged_version_reads_no_file_again(tmp_path):
    """A client polling GET / LIST / COUNT MESSAGE between two commits of the job is answered from
    what the same read of that version returned (the files are not opened again), and still by the
    clock of its own moment: a message that expired since is gone from the later poll."""
    expiring = {**row(2, "/t"), "expires_at": datetime.fromtimestamp((ACCEPTED + 5_000_000) / 1e6, timezone.utc)}
    append(tmp_path / "messages", row(1, "/t"), expiring, row(3, "/u"))
    trash(tmp_path / "trash", trash_row(3, "/u"))
    messages = store(tmp_path)
    polls = lambda now: ([m.smuid for m in messages.messages("/t", now)], messages.smuids("/t", now),  # noqa: E731
                         [m.smuid for m in messages.messages("/t", now, span=(1, 2))],
                         [m.smuid for m in messages.messages("/u/Trash")])
    assert polls(ACCEPTED) == ([1, 2], [1, 2], [1, 2], [3])

    _spoil_every_file(tmp_path / "messages")
    _spoil_every_file(tmp_path / "trash")
    assert polls(ACCEPTED) == ([1, 2], [1, 2], [1, 2], [3])
    assert polls(ACCEPTED + 6_000_000) == ([1], [1], [1], [3])


def test_the_reads_kept_between_commits_are_bounded_in_bytes(tmp_path):
    """A read too large to keep is read again from the files each time; the others are kept."""
    big = Section([], b"x" * 4096)
    append(tmp_path / "messages", *(row(n, "/big", [big]) for n in range(1, 51)), row(99, "/small"))
    messages = MessageStore(str(tmp_path / "messages"), str(tmp_path / "deliveries"), kept_bytes=100_000)
    assert len(messages.messages("/big")) == 50 and len(messages.messages("/small")) == 1
    _spoil_every_file(tmp_path / "messages")
    assert [m.smuid for m in messages.messages("/small")] == [99]
    with pytest.raises((OSError, pa.ArrowInvalid)):  # read from the spoiled file again: it was not kept
        messages.messages("/big")


def test_with_nothing_kept_every_poll_reads_the_files(tmp_path):
    """``[gateway] kept_read_bytes = 0``: the operator's way to turn keeping off."""
    append(tmp_path / "messages", row(1, "/t"))
    messages = MessageStore(str(tmp_path / "messages"), str(tmp_path / "deliveries"), kept_bytes=0)
    assert [m.smuid for m in messages.messages("/t")] == [1]
    _spoil_every_file(tmp_path / "messages")
    with pytest.raises((OSError, pa.ArrowInvalid)):
        messages.messages("/t")
