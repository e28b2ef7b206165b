"""MessageStore reads the job's ``messages`` Delta table: one topic, by SMUID, decoded; lags are fine."""

from __future__ import annotations

import base64
import threading
from datetime import datetime, timezone

import pyarrow as pa
from deltalake import write_deltalake

from gateway.message_store import MessageStore, StoredMessage
from schemas.events import Deliver, Section
from schemas.spark import MESSAGES_TABLE, arrow_schema

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
