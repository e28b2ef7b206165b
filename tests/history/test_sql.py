"""``smqp-sql`` and :mod:`streaming.history` against a history the real engine generated (conftest)."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from schemas.config import load_config
from streaming import history as hist
from streaming.history import HistoryError, main, open_history, parse_when
from tests.history.conftest import IBM, SPORT, WEATHER

pytestmark = pytest.mark.e2e

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def sql_csv(history, tmp_path, statement: str, *options: str) -> list[dict]:
    """Run ``smqp-sql`` in process with ``--csv``; the rows it wrote."""
    out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}.csv"
    code = main([statement, "--data-dir", history.data_dir, "--csv", str(out), *options])
    assert code == 0
    with open(out, newline="") as handle:
        return list(csv.DictReader(handle))


def test_counts_per_topic_printed_and_written(history, tmp_path, capsys):
    statement = "SELECT topic, count(*) AS n FROM messages GROUP BY topic ORDER BY topic"
    assert main([statement, "--data-dir", history.data_dir]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"\|/news/sport\s*\|5\s*\|", printed), printed
    rows = sql_csv(history, tmp_path, statement)
    assert {r["topic"]: int(r["n"]) for r in rows} == {SPORT: 5, WEATHER: 2, IBM: 1}
    assert "8 row(s)" not in capsys.readouterr().err  # three rows written, reported on stderr
    parquet = tmp_path / "deliveries.parquet"
    assert main(["SELECT * FROM deliveries", "--data-dir", history.data_dir, "--parquet", str(parquet)]) == 0
    table = pq.read_table(parquet)
    assert table.num_rows == 12
    assert sorted(table.group_by("account").aggregate([("smuid", "count")]).to_pylist(),
                  key=lambda r: r["account"]) == [{"account": "bob", "smuid_count": 7},
                                                  {"account": "carol", "smuid_count": 5}]


def test_as_of_a_past_time_sees_the_history_then(history, tmp_path):
    statement = ("SELECT topic, count(*) AS n FROM deliveries WHERE status = 'pending' "
                 "GROUP BY topic ORDER BY topic")
    now = sql_csv(history, tmp_path, statement)
    then = sql_csv(history, tmp_path, statement, "--as-of", history.t1.isoformat())
    assert {r["topic"]: int(r["n"]) for r in now} == {SPORT: 4}  # carol's, unacknowledged
    assert {r["topic"]: int(r["n"]) for r in then} == {SPORT: 6, WEATHER: 2}  # nothing acknowledged yet
    messages_then = sql_csv(history, tmp_path, "SELECT topic, count(*) AS n FROM messages GROUP BY topic",
                            "--as-of", history.t1.isoformat())
    assert {r["topic"]: int(r["n"]) for r in messages_then} == {SPORT: 3, WEATHER: 2, IBM: 1}
    # long before the engine ran, its tables did not exist: empty, not an error
    assert sql_csv(history, tmp_path, "SELECT count(*) AS n FROM messages", "--as-of", "2001-08-23T14:45:12Z") \
        == [{"n": "0"}]


def test_version_travel_per_table_bare_and_inline(history, tmp_path):
    v = history.versions_at_t1["messages"]
    count = "SELECT count(*) AS n FROM messages"
    assert sql_csv(history, tmp_path, count) == [{"n": "8"}]
    assert sql_csv(history, tmp_path, count, "--version", f"messages={v}") == [{"n": "6"}]
    assert sql_csv(history, tmp_path, count, "--version", str(v)) == [{"n": "6"}]  # the table the query names
    both = sql_csv(history, tmp_path, f"""
        SELECT (SELECT count(*) FROM messages) AS now,
               (SELECT count(*) FROM messages VERSION AS OF {v}) AS then,
               (SELECT count(*) FROM deliveries TIMESTAMP AS OF '{history.t1.isoformat()}'
                WHERE status = 'acked') AS acked_then""")
    assert both == [{"now": "8", "then": "6", "acked_then": "0"}]


def test_table_versions_name_the_batch_of_each_commit(history, tmp_path):
    rows = sql_csv(history, tmp_path, "SELECT table, version, operation, app_id, batch_id FROM table_versions "
                                      "WHERE table = 'messages' ORDER BY version")
    assert [int(r["version"]) for r in rows] == list(range(DeltaTable(history.config.table_path("messages"))
                                                           .version() + 1))
    writes = [r for r in rows if r["app_id"]]
    assert writes and all(r["app_id"].endswith(":messages") and r["batch_id"] for r in writes)


def test_open_history_registers_every_table(history, spark):
    session = spark.newSession()  # its own temporary views
    open_history(history.config, spark=session)
    for view in ("messages", "deliveries", "subscriptions", "metrics", "table_versions"):
        assert session.catalog.tableExists(view), view
    assert session.sql("SELECT count(*) FROM subscriptions WHERE active").first()[0] == 2
    # per-table travel: deliveries as of t1, messages current
    open_history(history.config, timestamp={"deliveries": history.t1}, spark=session)
    assert session.sql("SELECT count(*) FROM deliveries").first()[0] == 8
    assert session.sql("SELECT count(*) FROM messages").first()[0] == 8
    read = hist.register_tables(session, history.config, version={"messages": 0})
    assert read["messages"] == 0 and read["deliveries"] == DeltaTable(history.config.table_path("deliveries")).version()



def test_every_message_shows_its_federation_fields(history, spark):
    """Issue 33: Depth, Hops and the origin of a message are columns of ``messages``; every message of
    this history was published here, so it stayed local and came from nowhere else."""
    session = spark.newSession()
    open_history(history.config, spark=session)
    rows = session.sql("SELECT depth, hops, origin, origin_topic, count(*) AS n FROM messages "
                       "GROUP BY depth, hops, origin, origin_topic").collect()
    assert [tuple(row) for row in rows] == [(0, [], None, None, 8)]


def test_documented_example_queries_run(history, tmp_path):
    """Every ```sql block of docs/design.md's "Example queries" (the README links there), on this history."""
    text = DESIGN.read_text()
    section = text[text.index("### Example queries"):]
    section = section[:section.index("\n## ", 3)]
    queries = re.findall(r"```sql\n(.*?)```", section, re.S)
    assert len(queries) >= 4
    first_sport = min(history.smuids[SPORT])
    for query in queries:
        query = (query.replace("/stocks/quotes/ibm", SPORT).replace("1412046798848000", str(first_sport))
                 .replace("2026-11-22 08:00:00", history.t1.strftime("%Y-%m-%d %H:%M:%S.%f")))
        rows = sql_csv(history, tmp_path, query)
        assert rows, f"no rows from documented query:\n{query}"


def test_errors_are_reported_not_raised(history, capsys):
    assert main(["SELECT nothing FROM nowhere", "--data-dir", history.data_dir]) == 1
    err = capsys.readouterr().err
    assert "nowhere" in err and re.search(r"tables under .*: messages, deliveries", err), err
    assert main(["SELECT * FROM messages VERSION AS OF 999", "--data-dir", history.data_dir]) == 1
    err = capsys.readouterr().err
    assert "Cannot time travel Delta table to version 999" in err, err
    assert err.count("smqp-sql:") == 1 and "\tat " not in err and "Traceback" not in err, err
    # Delta refuses a moment before the table's first commit; the message says what --as-of does instead
    assert main(["SELECT * FROM messages TIMESTAMP AS OF '2001-08-23'", "--data-dir", history.data_dir]) == 1
    err = capsys.readouterr().err
    assert "before the earliest version" in err and "--as-of TIMESTAMP reads a table as empty" in err, err
    assert main(["SELECT 1 FROM messages", "--data-dir", history.data_dir, "--version", "messages=999"]) == 1
    assert "messages" in capsys.readouterr().err
    assert main(["SELECT 1", "--data-dir", history.data_dir, "--as-of", "yesterday"]) == 1
    assert "bad timestamp" in capsys.readouterr().err


def test_console_script(history, tmp_path):
    script = Path(sys.executable).with_name("smqp-sql")
    help_text = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert help_text.returncode == 0 and "--as-of" in help_text.stdout and "table_versions" in help_text.stdout
    assert "DESCRIBE HISTORY" in help_text.stdout and "VERSION AS OF" in help_text.stdout
    out = tmp_path / "weather.csv"
    run = subprocess.run([script, "SELECT smuid, topic FROM messages WHERE topic = '/news/weather' ORDER BY smuid",
                          "--csv", str(out)], capture_output=True, text=True, timeout=240,
                         env={**_env(), "SMQP_DATA_DIR": history.data_dir})
    assert run.returncode == 0, run.stderr[-2000:]
    with open(out, newline="") as handle:
        assert [int(r["smuid"]) for r in csv.DictReader(handle)] == history.smuids[WEATHER]
    # --tables, then a statement Delta refuses: one JVM for both; the error is one line, no Java stack
    tables = subprocess.run([script, "--tables", "SELECT * FROM messages VERSION AS OF 999"], capture_output=True,
                            text=True, timeout=240, env={**_env(), "SMQP_DATA_DIR": history.data_dir})
    assert re.search(r"\| messages\s+\| \d+\s+\|", tables.stdout), tables.stdout
    assert tables.returncode == 1 and "smqp-sql: [DELTA_VERSION_NOT_FOUND]" in tables.stderr, tables.stderr[-2000:]
    assert "\tat " not in tables.stderr and "Traceback" not in tables.stderr, tables.stderr[-2000:]


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("SMQP_")}


def test_snapshots_of_tables_written_directly(tmp_path, spark):
    """Time travel, a table created later, partitioned tables and a table gaining a column, without the job."""
    config = load_config(env={}, data_dir=str(tmp_path))
    path = config.table_path("receipts")
    one = pa.table({"smuid": pa.array([1], pa.int64()), "day": ["2026-11-21"]})
    write_deltalake(path, one, partition_by=["day"])
    created = datetime.now(timezone.utc)
    two = pa.table({"smuid": pa.array([2], pa.int64()), "day": ["2026-11-22"], "kind": ["ONE"]})
    write_deltalake(path, two, mode="append", schema_mode="merge", partition_by=["day"])
    session = spark.newSession()
    read = hist.register_tables(session, config)
    assert read == {"receipts": 1}
    got = sorted(session.sql("SELECT smuid, day, kind FROM receipts").collect())
    assert [tuple(r) for r in got] == [(1, "2026-11-21", None), (2, "2026-11-22", "ONE")]
    assert session.sql("SELECT * FROM receipts VERSION AS OF 0").columns == ["smuid", "day"]
    assert hist.read_table(session, config, "receipts", version=0).count() == 1
    assert hist.read_table(session, config, "receipts", timestamp=created).count() == 1
    assert hist.read_table(session, config, "receipts", timestamp="2001-08-23T14:45:12Z").count() == 0
    with pytest.raises(HistoryError, match="versions 0..1"):
        hist.read_table(session, config, "receipts", version=5)
    with pytest.raises(HistoryError, match="no Delta table 'trash'"):
        hist.read_table(session, config, "trash")
    assert DeltaTable(path).version() == 1  # registering and reading committed nothing


def _table(config, name: str, smuids: list[int]) -> None:
    write_deltalake(config.table_path(name), pa.table({"smuid": pa.array(smuids, pa.int64())}), mode="append")


def test_two_data_dirs_in_one_session_never_share_a_name(tmp_path, spark):
    """The catalog is the JVM's: data dir B opened after A must not find A's tables, pins or commits."""
    a = load_config(env={}, data_dir=str(tmp_path / "a"))
    b = load_config(env={}, data_dir=str(tmp_path / "b"))
    _table(a, "messages", [1, 2, 3])
    _table(a, "messages", [4])
    _table(a, "receipts", [1])
    _table(b, "messages", [10])
    session = spark.newSession()

    def count(statement: str) -> int:
        return session.sql(statement).first()[0]

    open_history(a, version={"messages": 0}, spark=session)
    assert count("SELECT count(*) FROM messages") == 3 and count("SELECT count(*) FROM receipts") == 1
    open_history(b, spark=session)
    assert count("SELECT sum(smuid) FROM messages") == 10  # B's, not A's pin nor A's table
    assert count("SELECT count(*) FROM messages VERSION AS OF 0") == 1
    assert not session.catalog.tableExists("receipts")
    assert {r.table for r in session.sql("SELECT table FROM table_versions").collect()} == {"messages"}
    assert count("SELECT max(version) FROM table_versions") == 0
    # sql() switches too, and a table gone from disk is forgotten
    shutil.rmtree(a.table_path("receipts"))
    assert hist.sql(session, a, "SELECT count(*) FROM messages").first()[0] == 4
    assert not session.catalog.tableExists("receipts") and not session.catalog.tableExists("table_versions")
    assert hist.sql(session, b, "SELECT count(*) FROM messages").first()[0] == 1
    # the test session itself (shared by the whole suite) was never touched
    assert spark.catalog.currentDatabase() == "default" and not spark.catalog.tableExists("messages")


def test_parse_when_accepts_iso_and_smqp_times():
    utc = timezone.utc
    assert parse_when("2026-11-22T08:00:00Z") == datetime(2026, 11, 22, 8, tzinfo=utc)
    assert parse_when("2026-11-22 08:00") == datetime(2026, 11, 22, 8, tzinfo=utc)
    assert parse_when("D20261122T08000050Z") == datetime(2026, 11, 22, 8, 0, 0, 500000, tzinfo=utc)
    assert parse_when("2026-11-22T09:00:00+01:00") == datetime(2026, 11, 22, 8, tzinfo=utc)
    with pytest.raises(HistoryError):
        parse_when("soon")
