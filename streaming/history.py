"""SQL over the engine's Delta history: every table by its own name, read and time-travelled by delta-spark.

>>> from streaming.history import open_history
>>> spark = open_history()                            # config from $SMQP_CONFIG / SMQP_* variables
>>> spark.sql("SELECT topic, count(*) FROM messages GROUP BY topic").show()
>>> spark.sql("SELECT count(*) FROM messages VERSION AS OF 3").show()        # Delta's own SQL, as written
>>> spark.sql("DESCRIBE HISTORY deliveries").show()
>>> past = open_history(timestamp="2026-11-22T08:00:00Z")   # every table pinned as it was then
>>> open_history(version={"deliveries": 12})         # one table at a version, the others current

Every Delta table under ``<data_dir>/tables/`` (``messages``, ``deliveries``,
``subscriptions``, ``metrics``, and ``topics`` / ``trash`` / ``receipts``
where the engine writes them) is an external catalog table
(``CREATE TABLE … USING delta LOCATION '<path>'``) in a database of that data
directory's own (:func:`database`), which becomes the session's current one.
Bare names resolve there, so a statement runs exactly as written:
``VERSION AS OF``, ``TIMESTAMP AS OF``, ``DESCRIBE HISTORY`` and
``DESCRIBE DETAIL`` are delta-spark's, and every read honours every commit —
the Trash sweeps' DELETEs included (``streaming/retention.py``).  Registering
writes nothing into a table (no commit, no file): the catalog is the session's
in-memory one, gone with its JVM.

Why a database per data directory: the catalog is shared by every session of
a JVM (the test suite opens several data directories in one), so a second data
directory gets its own names instead of finding the first one's tables under
the same names.

Pinning (``open_history(version=…, timestamp=…)``, ``smqp-sql --version`` /
``--as-of``) makes a table's name a temporary view of that snapshot, which
shadows the table; a view takes no time-travel clause of its own.  A pin by
timestamp reads the last commit at or before it (Delta's rule); before the
table's first commit the view is empty, with today's columns.

The view ``table_versions`` (table, version, timestamp, operation, parameters,
metrics, app_id, batch_id) lists every commit of every table: ``DESCRIBE
HISTORY``, plus each commit's Delta app transaction (the job's
``<query>:<table>`` and micro-batch id), which only the log itself records.

``smqp-sql`` (:func:`main`) is the command line over the same functions.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import sys
import tempfile
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from schemas.config import SMQPConfig, load_config

log = logging.getLogger(__name__)

#: The tables the engine writes (those present are registered; others found under tables/ too).
ENGINE_TABLES = ("messages", "deliveries", "subscriptions", "metrics", "topics", "trash", "receipts")

#: The extra view listing every commit of every table.
VERSIONS_VIEW = "table_versions"

#: The session property recording the temporary views this module made: ``<database>:<view>,<view>``.
VIEWS_CONF = "smqp.history.views"

When = str | datetime
PerTable = Mapping[str, Any]
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class HistoryError(ValueError):
    """A table, version or timestamp that cannot be read as asked."""


# -- finding tables


def tables_dir(config: SMQPConfig) -> Path:
    return Path(config.table_path("x")).parent


def _log_versions(path: Path) -> list[int]:
    """The versions named by the files of a table's ``_delta_log`` (commits, checkpoints, checksums)."""
    log_dir = path / "_delta_log"
    if not log_dir.is_dir():
        return []
    return [int(p.name.split(".")[0]) for p in log_dir.iterdir() if p.name.split(".")[0].isdigit()]


def table_names(config: SMQPConfig) -> list[str]:
    """Every Delta table under ``<data_dir>/tables/``, engine tables first.

    A table is a directory whose ``_delta_log`` holds a commit: one still being created is not one yet.
    """
    root = tables_dir(config)
    found = [p.name for p in sorted(root.iterdir()) if p.is_dir() and _log_versions(p)] if root.is_dir() else []
    return [n for n in ENGINE_TABLES if n in found] + [n for n in found if n not in ENGINE_TABLES]


def _path(config: SMQPConfig, name: str) -> str:
    """Table ``name``'s directory, or a :class:`HistoryError` naming the tables there are."""
    path = config.table_path(name)
    if not _log_versions(Path(path)):
        raise HistoryError(f"no Delta table {name!r} at {path} (tables: {', '.join(table_names(config)) or 'none'})")
    return path


def latest_version(config: SMQPConfig, name: str) -> int:
    """The table's newest version, from its log's file names (a listing; no Spark job)."""
    return max(_log_versions(Path(_path(config, name))))


def _check_version(config: SMQPConfig, name: str, version: int) -> int:
    latest = latest_version(config, name)
    if not 0 <= int(version) <= latest:
        raise HistoryError(f"table {name!r} has versions 0..{latest}, not {version}")
    return int(version)


def parse_when(value: When) -> datetime:
    """A moment: a datetime, ISO 8601 text (``2026-11-22T08:00:00Z``, ``2026-11-22 08:00``) or an
    SMQP date-time (``D20261122T080000Z``). Without a zone it is UTC."""
    if isinstance(value, datetime):
        moment = value
    else:
        text = str(value).strip()
        if text[:1] in ("D", "d") and text[1:2].isdigit():
            from schemas.timefmt import parse_date_time

            moment = parse_date_time(text)
        else:
            try:
                moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            except ValueError:
                raise HistoryError(f"bad timestamp {value!r}: expected e.g. 2026-11-22T08:00:00Z, "
                                   "'2026-11-22 08:00:00' (UTC) or D20261122T080000Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _utc(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


# -- SQL text


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _ref(config: SMQPConfig, name: str) -> str:
    """Table ``name`` by its path (``delta.`<path>```), which Spark SQL reads without any catalog entry."""
    return "delta." + _ident(_path(config, name))


def _select(source: str, version: int | None, *, existed: bool = True) -> str:
    """``SELECT *`` of ``source`` at ``version`` (None: latest); ``existed=False``: none of its rows."""
    if not existed:
        return f"SELECT * FROM {source} WHERE false"
    return f"SELECT * FROM {source}" + ("" if version is None else f" VERSION AS OF {int(version)}")


# -- commits


def commits(spark, config: SMQPConfig, name: str):
    """``DESCRIBE HISTORY`` of table ``name``: version, timestamp, operation, parameters, metrics.

    ``parameters`` / ``metrics`` are the commit's operation parameters and
    metrics as JSON (CREATE TABLE's parameters, the whole metadata and
    protocol, left out). The timestamps are the ones ``TIMESTAMP AS OF`` uses.
    """
    from pyspark.sql import functions as F

    return spark.sql(f"DESCRIBE HISTORY {_ref(config, name)}").select(
        "version", "timestamp", "operation",
        F.to_json(F.expr("map_filter(operationParameters, (k, v) -> k NOT IN ('metadata', 'protocol'))"))
        .alias("parameters"),
        F.to_json("operationMetrics").alias("metrics"),
    )


def version_at(spark, config: SMQPConfig, name: str, moment: When) -> int | None:
    """The version table ``name`` had at ``moment``: its last commit at or before it (Delta's rule,
    on ``DESCRIBE HISTORY``'s timestamps); None when the table did not exist yet.

    Unlike ``TIMESTAMP AS OF``, a moment after the last commit reads the latest
    version: a pin of every table to one moment must not fail on a table
    nothing has changed since.
    """
    from pyspark.sql import functions as F

    at = parse_when(moment)
    rows = commits(spark, config, name).select("version", F.unix_micros("timestamp").alias("micros")).collect()
    earlier = [r.version for r in rows if r.micros <= _micros(at)]
    if earlier:
        return max(earlier)
    first = min(rows, key=lambda r: r.version)
    if first.version == 0:
        return None
    kept = _utc(first.micros)
    raise HistoryError(f"table {name!r} keeps its history from version {first.version} ({kept:%Y-%m-%d %H:%M:%S}Z) "
                       f"on; {at:%Y-%m-%d %H:%M:%S}Z is earlier")


def read_table(spark, config: SMQPConfig, name: str, *, version: int | None = None,
               timestamp: When | None = None):
    """Table ``name`` as a DataFrame at ``version`` / ``timestamp`` (latest when neither), read by delta-spark.

    Empty (with the table's current columns) when the table did not exist at ``timestamp``.
    """
    if version is not None and timestamp is not None:
        raise HistoryError(f"table {name!r}: give a version or a timestamp, not both")
    source = _ref(config, name)
    if timestamp is not None:
        version = version_at(spark, config, name, timestamp)
        return spark.sql(_select(source, version, existed=version is not None))
    if version is not None:
        version = _check_version(config, name, version)
    return spark.sql(_select(source, version))


def table_versions(spark, config: SMQPConfig, names: Iterable[str] | None = None):
    """Every commit of every table (or ``names``): table, version, timestamp, operation, parameters,
    metrics (:func:`commits`), app_id, batch_id.

    ``app_id`` / ``batch_id`` are the commit's Delta app transaction (the
    routing job's ``<query>:<table>`` and micro-batch id): ``DESCRIBE HISTORY``
    does not show them, so they come from the commits' ``txn`` actions in
    ``_delta_log/*.json``. The history is read now; the transactions when the
    frame is queried.
    """
    from pyspark.sql import functions as F

    names = list(table_names(config) if names is None else names)
    frames = [commits(spark, config, name).select(F.lit(name).alias("table"), "*") for name in names]
    if not frames:
        return spark.createDataFrame([], "table string, version bigint, timestamp timestamp, operation string, "
                                         "parameters string, metrics string, app_id string, batch_id bigint")
    history = frames[0]
    for frame in frames[1:]:
        history = history.unionByName(frame)
    return history.join(_transactions(spark, config, names), ["table", "version"], "left")


def _transactions(spark, config: SMQPConfig, names: Sequence[str]):
    """The app transaction (app_id, batch_id) of each commit of ``names`` that has one: table, version, …"""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("txn", StructType([
        StructField("appId", StringType()), StructField("version", LongType())]))])
    frames = []
    for name in names:
        log_dir = Path(config.table_path(name), "_delta_log")
        files = sorted(str(p) for p in log_dir.glob("*.json") if p.stem.isdigit())
        if files:
            frames.append(spark.read.schema(schema).json(files).where("txn IS NOT NULL").select(
                F.lit(name).alias("table"),
                F.regexp_extract("_metadata.file_path", r"(\d+)\.json$", 1).cast("long").alias("version"),
                F.col("txn.appId").alias("app_id"), F.col("txn.version").alias("batch_id")))
    if not frames:
        return spark.createDataFrame([], "table string, version bigint, app_id string, batch_id bigint")
    transactions = frames[0]
    for frame in frames[1:]:
        transactions = transactions.unionByName(frame)
    return transactions.groupBy("table", "version").agg(F.max("app_id").alias("app_id"),
                                                        F.max("batch_id").alias("batch_id"))


# -- the catalog


def database(config: SMQPConfig) -> str:
    """The database holding one data directory's tables: ``smqp_`` and a hash of its tables' path,
    so two data directories never share a name."""
    return "smqp_" + hashlib.sha1(str(tables_dir(config)).encode()).hexdigest()[:12]


def _our_views(spark) -> tuple[str, list[str]]:
    """The temporary views this module made in the session: (their database, names)."""
    value = spark.conf.get(VIEWS_CONF, "") or ""
    db, _, views = value.partition(":")
    return db, [v for v in views.split(",") if v]


def _drop_our_views(spark) -> None:
    for view in _our_views(spark)[1]:
        spark.catalog.dropTempView(view)
    spark.conf.unset(VIEWS_CONF)


def attach(spark, config: SMQPConfig) -> list[str]:
    """Make ``config``'s tables what the session's bare table names mean; returns their names.

    Registers each table not registered yet in the data directory's database
    (:func:`database`), forgets the entries of tables gone from disk, makes that
    database current, and drops the pins and ``table_versions`` view made for
    another data directory. Cheap once registered: a listing and ``SHOW TABLES``.
    """
    from pyspark.errors import PySparkException

    db = f"spark_catalog.{database(config)}"
    names = table_names(config)
    # The in-memory catalog makes a database's directory; every table here is external, so nothing goes in it.
    home = Path(tempfile.gettempdir(), "smqp-sql-catalog", f"{database(config)}.db")
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {db} COMMENT {_literal(f'SMQP tables of {tables_dir(config)}')} "
              f"LOCATION {_literal(str(home))}")
    known = {r.tableName for r in spark.sql(f"SHOW TABLES IN {db}").collect() if not r.isTemporary}
    for gone in sorted(known - set(names)):  # external: dropping the entry leaves the files alone
        spark.sql(f"DROP TABLE IF EXISTS {db}.{_ident(gone)}")
    for name in names:
        if name not in known:
            try:
                spark.sql(f"CREATE TABLE IF NOT EXISTS {db}.{_ident(name)} USING delta "
                          f"LOCATION {_literal(config.table_path(name))}")
            except PySparkException as exc:
                raise HistoryError(f"table {name!r} at {config.table_path(name)}: {_spark_message(exc)}") from None
    spark.sql(f"USE {db}")
    if _our_views(spark)[0] not in ("", db):
        _drop_our_views(spark)
    return names


def _resolve(names: Sequence[str], value: Any, kind: str) -> dict[str, Any]:
    """A global or per-table ``version`` / ``timestamp`` as ``{table: value}``."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        unknown = set(value) - set(names)
        if unknown:
            raise HistoryError(f"{kind} for unknown table(s) {sorted(unknown)} (tables: {', '.join(names)})")
        return dict(value)
    return {name: value for name in names}


def _pins(names: Sequence[str], version: Any, timestamp: Any) -> tuple[dict[str, int], dict[str, When]]:
    """``version`` / ``timestamp`` per table; a per-table choice wins over a global one."""
    versions = _resolve(names, version, "version")
    moments = _resolve(names, timestamp, "timestamp")
    both = set(versions) & set(moments)
    if both and not (isinstance(version, Mapping) ^ isinstance(timestamp, Mapping)):
        raise HistoryError(f"both a version and a timestamp for {sorted(both)}")
    for name in both:
        (moments if isinstance(version, Mapping) else versions).pop(name)
    return versions, moments


def register_tables(spark, config: SMQPConfig, *, version: int | PerTable | None = None,
                    timestamp: When | PerTable | None = None,
                    versions_view: bool = True) -> dict[str, int | None]:
    """Make every table reachable by its name (:func:`attach`), pin the ones asked; returns table →
    version its name reads now (None: a table pinned before it existed, an empty view).

    ``version`` / ``timestamp``: one value for every table, or ``{table: value}``
    for some; a pinned table's name is a temporary view of that snapshot, the
    others are the live tables. Views of the tables' names left in the session
    (earlier pins, anyone's) are dropped: they would shadow the tables.
    ``versions_view`` also registers ``table_versions``.
    """
    from pyspark.errors import PySparkException

    names = attach(spark, config)
    versions, moments = _pins(names, version, timestamp)
    _drop_our_views(spark)
    for name in names:
        spark.catalog.dropTempView(name)
    read: dict[str, int | None] = {}
    made = []
    db = f"spark_catalog.{database(config)}"
    for name in names:
        if name not in versions and name not in moments:
            read[name] = latest_version(config, name)
            continue
        pinned = (_check_version(config, name, versions[name]) if name in versions
                  else version_at(spark, config, name, moments[name]))
        query = _select(f"{db}.{_ident(name)}", pinned, existed=pinned is not None)
        try:
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {_ident(name)} AS {query}")
        except PySparkException as exc:  # e.g. a version whose log files were cleaned up
            raise HistoryError(f"table {name!r} at version {pinned}: {_spark_message(exc)}") from None
        made.append(name)
        read[name] = pinned
    if versions_view:
        table_versions(spark, config, names).createOrReplaceTempView(VERSIONS_VIEW)
        made.append(VERSIONS_VIEW)
    spark.conf.set(VIEWS_CONF, f"{db}:{','.join(made)}")
    return read


def history_session(config: SMQPConfig):
    """A Spark session for reading the history (the project's lean local session; the active one if any)."""
    from streaming.session import build_session

    return build_session(config.streaming, app_name="smqp-history")


def open_history(config: SMQPConfig | None = None, version: int | PerTable | None = None,
                 timestamp: When | PerTable | None = None, spark=None, *, versions_view: bool = True):
    """A Spark session whose SQL reads every Delta table of the engine by its name.

    ``config`` defaults to :func:`~schemas.config.load_config` (``$SMQP_CONFIG``,
    ``SMQP_DATA_DIR`` …). ``version`` / ``timestamp`` pin tables in time, every
    table or per table (``{"deliveries": 12}``); the others stay live, and take
    ``VERSION AS OF`` / ``TIMESTAMP AS OF`` in the statement. ``spark``: use
    this session instead of building one (its current database changes to the
    data directory's). Also registers ``table_versions``, the commits as of now.
    """
    config = config or load_config()
    spark = spark or history_session(config)
    register_tables(spark, config, version=version, timestamp=timestamp, versions_view=versions_view)
    return spark


def sql(spark, config: SMQPConfig, statement: str):
    """Run ``statement`` unchanged, with ``config``'s tables as the session's bare names.

    Tables the engine created since are registered first (:func:`attach`);
    pins and ``table_versions`` from :func:`open_history` stay as they were.
    """
    attach(spark, config)
    return spark.sql(statement)


def tables_named(statement: str, names: Iterable[str]) -> list[str]:
    """The tables among ``names`` that ``statement`` mentions (as whole words)."""
    return [n for n in names if re.search(rf"\b{re.escape(n)}\b", statement, re.IGNORECASE)]


# -- errors


def _spark_message(exc: BaseException, config: SMQPConfig | None = None) -> str:
    """A Spark or Delta error as its message: no query plan, no Java stack trace, and a hint for
    the usual mistakes (a table that is not there, travelling a pinned table)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    text = str(exc.java_exception.toString()) if isinstance(exc, Py4JJavaError) else str(exc)
    end = re.search(r"SQLSTATE: \w+(?:; line \d+ pos \d+)?", text)
    text = text[:end.end()] if end else re.split(r"\n\s*at |\nJVM stacktrace:", text, maxsplit=1)[0]
    condition = exc.getCondition() if isinstance(exc, PySparkException) else None
    if condition == "TABLE_OR_VIEW_NOT_FOUND" and config is not None:
        text += f"\ntables under {tables_dir(config)}: {', '.join(table_names(config)) or 'none'}"
    elif condition in _HINTS:
        text += "\n" + _HINTS[condition]
    return text


_PINNED = "a table pinned by --version / --as-of is a view of that snapshot: travel in the statement or pin"
_AS_OF = ("--as-of TIMESTAMP reads a table as empty before its first commit, and as its latest version "
          "after its last")
_HINTS = {"UNSUPPORTED_FEATURE.TIME_TRAVEL": _PINNED, "DELTA_TIMESTAMP_EARLIER_THAN_COMMIT_RETENTION": _AS_OF,
          "DELTA_TIMESTAMP_GREATER_THAN_COMMIT": _AS_OF}


@contextmanager
def _quiet_query_errors() -> Iterator[None]:
    """pyspark logs each failed statement with its Java stack trace; ``smqp-sql`` reports it in one message."""
    loggers = [logging.getLogger(n) for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    saved = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, saved):
            logger.disabled = disabled


# -- command line


def _per_table(values: list[str] | None, kind: str, convert) -> tuple[Any, dict[str, Any]]:
    """``--version`` / ``--as-of`` values: (global value or None, {table: value})."""
    shared, per = None, {}
    for value in values or []:
        table, sep, rest = value.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_]\w*", table):
            per[table.lower()] = convert(rest)
        elif shared is None:
            shared = convert(value)
        else:
            raise HistoryError(f"--{kind} given twice without a table name")
    return shared, per


def _version(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise HistoryError(f"bad version {text!r}: expected a number") from None


def _text_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, header))] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line]
    for i, row in enumerate(cells):
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            out.append(line)
    out.append(line)
    return "\n".join(out)


def describe_tables(spark, config: SMQPConfig) -> str:
    """One line per table (version, last commit, files, rows), then each table's columns."""
    import textwrap

    from pyspark.sql import functions as F

    rows, columns = [], []
    for name in table_names(config):
        last = spark.sql(f"DESCRIBE HISTORY {_ref(config, name)} LIMIT 1") \
            .select("version", F.unix_micros("timestamp").alias("micros")).first()
        snapshot = spark.sql(_select(_ref(config, name), last.version))
        files = spark.sql(f"DESCRIBE DETAIL {_ref(config, name)}").first().numFiles
        committed = _utc(last.micros)
        rows.append((name, last.version, f"{committed:%Y-%m-%d %H:%M:%S.%f}"[:-3] + "Z", files, snapshot.count()))
        fields = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in snapshot.schema.fields)
        columns.append(textwrap.fill(fields, width=100, initial_indent=f"{name}: ", break_long_words=False,
                                     subsequent_indent=" " * (len(name) + 2)))
    if not rows:
        return f"no Delta tables under {tables_dir(config)}"
    return (_text_table(("table", "version", "last commit", "files", "rows"), rows)
            + "\n\ncolumns:\n" + "\n".join(columns))


def _write(frame, path: str, kind: str) -> int:
    """Write ``frame`` as one CSV / Parquet file through the driver; returns the row count."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StructType

    if kind == "csv":  # CSV holds no nested values: those become JSON text, bytes base64
        columns = []
        for field in frame.schema.fields:
            column = F.col(f"`{field.name}`")
            if isinstance(field.dataType, (ArrayType, MapType, StructType)):
                column = F.to_json(column)
            elif isinstance(field.dataType, BinaryType):
                column = F.base64(column)
            columns.append(column.alias(field.name))
        frame = frame.select(*columns)
    arrow = frame.toArrow()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if kind == "csv":
        pacsv.write_csv(arrow, path)
    else:
        pq.write_table(arrow, path)
    return arrow.num_rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smqp-sql",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Spark SQL (with delta-spark) over the engine's Delta history. Every Delta table under\n"
            "<data_dir>/tables is a table of its own name: messages (every accepted publish), deliveries\n"
            "(one row per subscriber and message: pending/acked, routed_at, acked_at), subscriptions,\n"
            "metrics (one row per streaming micro-batch), and topics / trash / receipts where present;\n"
            f"plus the view {VERSIONS_VIEW} (every commit of every table: table, version, timestamp,\n"
            "operation, parameters, metrics, app_id, batch_id).\n\n"
            "The statement runs as written, so Delta's own SQL works on every table:\n"
            "  ... FROM messages VERSION AS OF 3 ...\n"
            "  ... FROM deliveries TIMESTAMP AS OF '2026-11-22 08:00:00' ...   (UTC)\n"
            "  DESCRIBE HISTORY trash          DESCRIBE DETAIL messages\n"
            "Delta refuses a TIMESTAMP AS OF before a table's first commit or after its last one.\n"
            "--version / --as-of below pin tables instead (a pinned table takes no AS OF of its own)."
        ),
        epilog=(
            "examples:\n"
            "  smqp-sql --tables\n"
            "  smqp-sql \"SELECT topic, date_trunc('HOUR', accepted_at) AS hour, count(*) AS n\n"
            "            FROM messages GROUP BY 1, 2 ORDER BY 2, 1\"\n"
            "  smqp-sql \"SELECT count(*) FROM deliveries WHERE status = 'pending'\" --as-of 2026-11-22T08:00Z\n"
            "  smqp-sql \"SELECT * FROM messages\" --version messages=3 --csv out/messages.csv\n"
            "  smqp-sql \"DESCRIBE HISTORY trash\"\n\n"
            "Exit status: 0 ok, 1 an error in the statement or the history (one message on stderr), 2 usage.\n"
            "Configuration: --config or $SMQP_CONFIG, then SMQP_<SECTION>_<KEY> variables\n"
            "(SMQP_DATA_DIR=... points at another data directory); see deploy/smqp.example.toml."
        ),
    )
    parser.add_argument("statement", nargs="?",
                        help="the SQL statement ('-' reads it from standard input)")
    parser.add_argument("--config", metavar="PATH", help="TOML configuration file (default: $SMQP_CONFIG)")
    parser.add_argument("--data-dir", metavar="DIR", help="data directory (overrides the configuration)")
    travel = parser.add_mutually_exclusive_group()
    travel.add_argument("--version", action="append", metavar="[TABLE=]N",
                        help="pin TABLE at Delta version N (repeatable); a bare N pins every "
                             "table the statement names")
    travel.add_argument("--as-of", action="append", metavar="[TABLE=]TIMESTAMP",
                        help="pin every table (or TABLE) as it was at TIMESTAMP: ISO 8601 "
                             "(2026-11-22T08:00:00Z; no zone = UTC) or SMQP D20261122T080000Z; "
                             "a table created later reads as empty")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--csv", metavar="OUT", help="write the result to one CSV file (nested values as JSON)")
    output.add_argument("--parquet", metavar="OUT", help="write the result to one Parquet file")
    parser.add_argument("--tables", action="store_true",
                        help="list the tables (version, last commit, files, rows, columns) and exit "
                             "unless a statement is given too")
    parser.add_argument("--max-rows", type=int, default=1000, metavar="N",
                        help="print at most N rows (default 1000; files get every row)")
    parser.add_argument("--vertical", action="store_true", help="print one 'column | value' block per row")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``smqp-sql``: returns the exit code (0 ok, 1 query or history error, 2 usage)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.statement and not args.tables:
        parser.error("give a SQL statement (or --tables)")
    statement = sys.stdin.read() if args.statement == "-" else args.statement
    overrides = {"data_dir": args.data_dir} if args.data_dir else {}
    config = load_config(args.config, **overrides)
    try:
        names = table_names(config)
        shared_version, versions = _per_table(args.version, "version", _version)
        shared_moment, moments = _per_table(args.as_of, "as-of", parse_when)
        if shared_version is not None:
            for name in tables_named(statement or "", names) or names:
                versions.setdefault(name, shared_version)
        if shared_moment is not None:
            for name in names:
                moments.setdefault(name, shared_moment)
    except HistoryError as exc:
        print(f"smqp-sql: {exc}", file=sys.stderr)
        return 1

    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    borrowed = SparkSession.getActiveSession() is not None  # in-process callers keep their session as it was
    spark = history_session(config)
    session = spark.newSession() if borrowed else spark
    try:
        with _quiet_query_errors():
            if args.tables:
                print(describe_tables(session, config))
                if not statement:
                    return 0
            register_tables(session, config, version=versions or None, timestamp=moments or None,
                            versions_view=bool(tables_named(statement, [VERSIONS_VIEW])))
            frame = session.sql(statement)
            if args.csv or args.parquet:
                out = args.csv or args.parquet
                count = _write(frame, out, "csv" if args.csv else "parquet")
                print(f"{count} row(s) written to {out}", file=sys.stderr)
            else:
                frame.show(n=args.max_rows, truncate=False, vertical=args.vertical)
        return 0
    except HistoryError as exc:
        print(f"smqp-sql: {exc}", file=sys.stderr)
        return 1
    except (PySparkException, Py4JJavaError) as exc:
        print(f"smqp-sql: {_spark_message(exc, config)}", file=sys.stderr)
        return 1
    finally:
        if not borrowed:
            spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
