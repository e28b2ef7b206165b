"""The job compacts its Delta tables between batches (streaming.compaction), losing nothing."""

from __future__ import annotations

import secrets

from deltalake import DeltaTable

from schemas import events as ev
from schemas.config import load_config
from streaming.sink import CommandSink
from tests.streaming.test_sink_outputs import US0, run_batch

S = 1_000_000


def files(sink, name) -> int:
    return len(DeltaTable(sink.config.table_path(name)).file_uris())


def rows(sink, name) -> list[dict]:
    return sorted(DeltaTable(sink.config.table_path(name)).to_pyarrow_table().to_pylist(),
                  key=lambda row: (row["smuid"], row.get("account") or ""))


def test_compaction_every_interval_keeps_every_row_and_what_each_table_last_committed(spark, tmp_path):
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path), streaming={"compact_interval_s": 60}))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t/*", US0)])
    for batch in range(1, 5):
        run_batch(spark, sink, batch, [ev.Publish(batch, "/t/x", f"c{batch}", "alice", "gp", US0 + batch)],
                  offset=10 * batch)
    before = {name: rows(sink, name) for name in ("messages", "deliveries")}
    assert files(sink, "messages") == 4 and files(sink, "deliveries") == 4

    assert sink.compact(US0) == {}  # the first batch it sees starts its clock
    assert sink.compact(US0 + 59 * S) == {}
    # one table a batch, so that no batch pays for them all
    assert sink.compact(US0 + 60 * S) == {"messages": 4}
    assert sink.compact(US0 + 61 * S) == {"deliveries": 4}
    assert sink.compact(US0 + 62 * S) == {}  # subscriptions is one file; an interval from the last one
    assert sink.compact(US0 + 119 * S) == {}

    assert files(sink, "messages") == 1 and files(sink, "deliveries") == 1
    assert {name: rows(sink, name) for name in before} == before
    assert sink.committed_version("messages") == 4 and sink.committed_version("deliveries") == 4
    # the next batch merges into the compacted file, and a replay of the last one still writes nothing
    run_batch(spark, sink, 5, [ev.Ack("bob", "gb", 2, US0 + 70 * S)], offset=60)
    assert [(r["smuid"], r["status"]) for r in rows(sink, "deliveries")] == [
        (1, "pending"), (2, "acked"), (3, "pending"), (4, "pending")]
    run_batch(spark, sink, 4, [ev.Publish(4, "/t/x", "c4", "alice", "gp", US0 + 4)], offset=40)
    assert len(rows(sink, "messages")) == 4


def test_no_compaction_when_its_interval_is_0(spark, tmp_path):
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path), streaming={"compact_interval_s": 0}))
    for batch in range(2):
        run_batch(spark, sink, batch, [ev.Publish(batch, "/t/x", f"c{batch}", "alice", "gp", US0 + batch)],
                  offset=10 * batch)
    assert sink.compact(US0) == {} and sink.compact(US0 + 3600 * S) == {}
    assert files(sink, "messages") == 2


def test_a_table_that_gained_compact_files_is_compacted_alone_without_waiting_for_the_interval(spark, tmp_path):
    """A whole-topic read opens every file, so a table is compacted once it gains ``compact_files``
    files, whatever the interval: the most crowded table first, one a batch."""
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path),
                                   streaming={"compact_interval_s": 3600, "compact_files": 3}))
    run_batch(spark, sink, 0, [ev.Subscribe("bob", "gb", "/t/*", US0)])
    for batch in range(1, 3):
        run_batch(spark, sink, batch, [ev.Publish(batch, "/t/x", f"c{batch}", "alice", "gp", US0 + batch)],
                  offset=10 * batch)
    assert sink.compact(US0) == {}  # two files in each: not yet
    run_batch(spark, sink, 3, [ev.Publish(3, "/t/x", "c3", "alice", "gp", US0 + 3),
                               ev.Publish(30, "/u", "c30", "alice", "gp", US0 + 3)], offset=30)
    assert files(sink, "messages") == 3 and files(sink, "deliveries") == 3

    first, second = sink.compact(US0 + S), sink.compact(US0 + 2 * S)
    assert len(first) == len(second) == 1 and {**first, **second} == {"messages": 3, "deliveries": 3}
    assert files(sink, "messages") == 1 and files(sink, "deliveries") == 1
    assert sink.compact(US0 + 3 * S) == {}  # counted again from the compacted file
    assert [r["smuid"] for r in rows(sink, "messages")] == [1, 2, 3, 30]
    assert [r["smuid"] for r in rows(sink, "deliveries")] == [1, 2, 3]


class _FailingTable:
    """A table of ``files`` files whose compaction fails, as a full disk would make it."""

    def __init__(self, files: int):
        self.files, self.tries = files, 0

    def file_uris(self) -> list[str]:
        return [f"part-{n}.parquet" for n in range(self.files)]

    @property
    def optimize(self):
        return self

    def compact(self, target_size: int):
        from deltalake.exceptions import DeltaError

        self.tries += 1
        raise DeltaError("No space left on device")


def test_a_failed_compaction_is_tried_again_only_after_compact_files_more_files(caplog):
    """A compaction that fails never stops the job, and is not retried at every batch: only once the
    table has gained ``compact_files`` files more than when it failed."""
    from streaming.compaction import TableCompactor

    trash = _FailingTable(200)
    compactor = TableCompactor(load_config(env={}, streaming={"compact_interval_s": 3600, "compact_files": 50}),
                               lambda name: trash if name == "trash" else None)
    assert compactor(US0) == {} and trash.tries == 1
    assert "compaction of trash failed" in caplog.text
    for batch in range(1, 4):
        trash.files += 10
        assert compactor(US0 + batch * S) == {}
    assert trash.tries == 1  # 30 files gained since it failed: not yet
    trash.files += 20
    assert compactor(US0 + 5 * S) == {} and trash.tries == 2


def _sizes(sink, name) -> dict[str, int]:
    """Each live file of table ``name`` (its path in the log) and its size in bytes."""
    import pyarrow as pa

    adds = pa.table(DeltaTable(sink.config.table_path(name)).get_add_actions(flatten=True))
    return dict(zip(adds.column("path").to_pylist(), adds.column("size_bytes").to_pylist()))


def test_a_table_compacted_for_its_file_count_leaves_its_packed_files_to_the_interval(spark, tmp_path):
    """A table compacted because it gained ``compact_files`` files packs only those under
    ``compact_step_mb``, so the compaction in a batch rewrites no more than that: with the whole
    ``compact_target_mb`` it copied again all the table had packed since the last interval, a cost
    that grew with the job's age (``messages`` at 1,000 msg/s: 74 → 177 ms in two minutes).  The
    interval's compaction packs the files left up to ``compact_target_mb``."""
    step_bytes = 25_000
    sink = CommandSink(load_config(env={}, data_dir=str(tmp_path), streaming={
        "compact_interval_s": 3600, "compact_files": 3, "compact_step_mb": step_bytes / (1 << 20)}))

    def publish(batch: int, count: int) -> None:
        run_batch(spark, sink, batch, [ev.Publish(batch * 1000 + n, "/t", f"c{batch}-{n}-{secrets.token_hex(32)}",
                                                  "alice", "gp", US0 + batch) for n in range(count)],
                  offset=1000 * batch)

    assert sink.compact(US0) == {}  # starts the interval's clock
    for batch in range(5):
        publish(batch, 100)
    assert sink.compact(US0 + 3600 * S) == {"messages": 5}  # the interval's: into one file
    while sink.compact.queued:  # then the other tables, one a call
        sink.compact(US0 + 3600 * S)
    (packed,) = _sizes(sink, "messages").items()
    assert packed[1] > step_bytes
    for batch in range(5, 8):
        publish(batch, 1)
    new = {uri: size for uri, size in _sizes(sink, "messages").items() if uri != packed[0]}
    assert len(new) == 3 and sum(new.values()) < step_bytes

    assert sink.compact(US0 + 3601 * S) == {"messages": 3}  # crowded: the three new ones, not the packed one
    assert packed[0] in _sizes(sink, "messages") and files(sink, "messages") == 2
    assert sink.compact(US0 + 7200 * S) == {"messages": 2}  # the next interval packs both
    assert files(sink, "messages") == 1
    assert len(rows(sink, "messages")) == 503
