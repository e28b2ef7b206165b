"""SQL over the engine's Delta history: every table as a Spark view, with time travel.

>>> from streaming.history import open_history
>>> spark = open_history()                            # config from $SMQP_CONFIG / SMQP_* variables
>>> spark.sql("SELECT topic, count(*) FROM messages GROUP BY topic").show()
>>> past = open_history(timestamp="2026-11-22T08:00:00Z")   # every table as it was then
>>> open_history(version={"deliveries": 12})         # one table at a version, the others current

Every Delta table under ``<data_dir>/tables/`` (``messages``, ``deliveries``,
``subscriptions``, ``metrics``, and ``topics`` / ``trash`` / ``receipts``
where the engine writes them) becomes a temporary view of its own name.  A
view is read through delta-rs: ``DeltaTable(path, version=…)`` or
``load_as_version(timestamp)`` gives the snapshot's file list
(``file_uris()``), which Spark reads as Parquet with the table's schema — no
delta-spark jars needed, and the view is one consistent snapshot even while
the job keeps committing.

:func:`sql` also accepts Delta's time-travel clauses on any table, so past and
present can meet in one query::

    SELECT count(*) FROM deliveries TIMESTAMP AS OF '2026-11-22 08:00:00' WHERE status = 'pending'
    SELECT * FROM messages VERSION AS OF 3

and the view ``table_versions`` (table, version, timestamp, operation,
app_id, batch_id) lists every commit, to find the version to travel to.

``smqp-sql`` (:func:`main`) is the command line over the same functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from schemas.config import SMQPConfig, load_config

log = logging.getLogger(__name__)

#: The tables the engine writes (those present are registered; others found under tables/ too).
ENGINE_TABLES = ("messages", "deliveries", "subscriptions", "metrics", "topics", "trash", "receipts")

#: The extra view listing every commit of every table.
VERSIONS_VIEW = "table_versions"

When = str | datetime
PerTable = Mapping[str, Any]


class HistoryError(ValueError):
    """A table, version or timestamp that cannot be read as asked."""


# -- finding tables and snapshots


def tables_dir(config: SMQPConfig) -> Path:
    return Path(config.table_path("x")).parent


def table_names(config: SMQPConfig) -> list[str]:
    """Every Delta table under ``<data_dir>/tables/``, engine tables first."""
    from deltalake import DeltaTable

    root = tables_dir(config)
    found = [p.name for p in sorted(root.iterdir()) if p.is_dir() and DeltaTable.is_deltatable(str(p))] \
        if root.is_dir() else []
    return [n for n in ENGINE_TABLES if n in found] + [n for n in found if n not in ENGINE_TABLES]


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


def _commit_time(path: str, version: int) -> datetime | None:
    """When a version was committed (its ``commitInfo`` timestamp, else the file's), or None if its file is gone."""
    file = Path(path, "_delta_log", f"{version:020d}.json")
    try:
        lines = file.read_text().splitlines()
    except FileNotFoundError:  # log cleanup after a checkpoint
        return None
    actions = (json.loads(line) for line in lines if '"commitInfo"' in line)
    millis = next((a["commitInfo"].get("timestamp") for a in actions if "commitInfo" in a), None)
    millis = millis or file.stat().st_mtime * 1000
    return datetime.fromtimestamp(millis / 1000, timezone.utc)


def snapshot(config: SMQPConfig, name: str, *, version: int | None = None, timestamp: When | None = None):
    """Table ``name`` as a ``DeltaTable`` at ``version`` / ``timestamp`` (latest when neither).

    Returns None when the table did not exist yet at ``timestamp``.
    """
    from deltalake import DeltaTable

    path = config.table_path(name)
    if not DeltaTable.is_deltatable(path):
        raise HistoryError(f"no Delta table {name!r} at {path} (tables: {', '.join(table_names(config)) or 'none'})")
    if version is not None and timestamp is not None:
        raise HistoryError(f"table {name!r}: give a version or a timestamp, not both")
    if version is not None:
        latest = DeltaTable(path).version()
        if not 0 <= int(version) <= latest:
            raise HistoryError(f"table {name!r} has versions 0..{latest}, not {version}")
        return DeltaTable(path, version=int(version))
    table = DeltaTable(path)
    if timestamp is not None:
        moment = parse_when(timestamp)
        table.load_as_version(moment)
        # delta-rs gives the first version for a moment before it; the table did not exist then.
        created = _commit_time(path, table.version()) if table.version() == 0 else None
        if created is not None and created > moment:
            return None
    return table


def spark_schema(table):
    """The Spark ``StructType`` of a ``DeltaTable`` (from its Arrow schema)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(pa.schema(table.schema().to_arrow()))


def _check_readable(name: str, table) -> None:
    """Plain Parquet reading is right only without column mapping and deletion vectors."""
    mode = (table.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    if mode not in (None, "none"):
        raise HistoryError(f"table {name!r} uses column mapping ({mode}); read it with delta-spark "
                           "(format('delta')) instead")
    features = table.protocol().reader_features or []
    if "deletionVectors" in features and any(batch.num_rows for batch in table.deletion_vectors()):
        raise HistoryError(f"table {name!r} has deletion vectors; read it with delta-spark (format('delta'))")


def read_table(spark, config: SMQPConfig, name: str, *, version: int | None = None,
               timestamp: When | None = None):
    """Table ``name`` as a Spark DataFrame at ``version`` / ``timestamp`` (latest when neither).

    Empty (with the table's current schema) when the table did not exist at ``timestamp``.
    """
    return _frame(spark, config, name, snapshot(config, name, version=version, timestamp=timestamp))


def _frame(spark, config: SMQPConfig, name: str, table):
    """A snapshot (or None: not there yet) as a DataFrame: its files read as Parquet with its schema."""
    if table is None:
        return spark.createDataFrame([], spark_schema(snapshot(config, name)))
    _check_readable(name, table)
    schema = spark_schema(table)
    uris = table.file_uris()
    if not uris:
        return spark.createDataFrame([], schema)
    reader = spark.read.schema(schema)
    if table.metadata().partition_columns:
        reader = reader.option("basePath", config.table_path(name))
    return reader.parquet(*uris)


# -- views


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


def register_views(spark, config: SMQPConfig, *, version: int | PerTable | None = None,
                   timestamp: When | PerTable | None = None, names: Iterable[str] | None = None,
                   versions_view: bool = True) -> dict[str, int | None]:
    """Register every table (or ``names``) as a temporary view of its name; returns view → version read.

    ``version`` / ``timestamp``: one value for every table, or ``{table: value}``
    for some (the others stay current). A table that did not exist at
    ``timestamp`` is an empty view (version None). ``versions_view`` also
    registers ``table_versions`` (lazy: free until queried).
    """
    present = table_names(config)
    names = list(present if names is None else names)
    versions = _resolve(names, version, "version")
    moments = _resolve(names, timestamp, "timestamp")
    both = set(versions) & set(moments)
    if both and not (isinstance(version, Mapping) ^ isinstance(timestamp, Mapping)):
        raise HistoryError(f"both a version and a timestamp for {sorted(both)}")
    # a per-table choice wins over a global one
    for name in both:
        if isinstance(version, Mapping):
            moments.pop(name)
        else:
            versions.pop(name)
    read: dict[str, int | None] = {}
    for name in names:
        table = snapshot(config, name, version=versions.get(name), timestamp=moments.get(name))
        _frame(spark, config, name, table).createOrReplaceTempView(name)
        read[name] = None if table is None else table.version()
    if versions_view:
        table_versions(spark, config, present).createOrReplaceTempView(VERSIONS_VIEW)
    return read


def table_versions(spark, config: SMQPConfig, names: Iterable[str] | None = None):
    """Every commit of every table: table, version, timestamp, operation, parameters, app_id, batch_id.

    ``app_id`` / ``batch_id`` are the commit's Delta app transaction (the
    routing job's ``<query>:<table>`` and micro-batch id). A lazy frame over
    the tables' ``_delta_log/*.json``: it costs nothing until queried.
    """
    from pyspark.sql import functions as F

    frames = []
    for name in names if names is not None else table_names(config):
        log_dir = Path(config.table_path(name), "_delta_log")
        commits = sorted(str(p) for p in log_dir.glob("*.json") if p.stem.isdigit())
        if not commits:
            continue
        frames.append(spark.read.schema(_log_schema()).json(commits).select(
            F.lit(name).alias("table"),
            F.regexp_extract("_metadata.file_path", r"(\d+)\.json$", 1).cast("long").alias("version"),
            F.coalesce(F.col("commitInfo.timestamp"),
                       F.unix_millis("_metadata.file_modification_time")).alias("millis"),
            "commitInfo", "txn"))
    if not frames:
        return spark.createDataFrame([], "table string, version bigint, timestamp timestamp, operation string, "
                                         "parameters string, app_id string, batch_id bigint")
    actions = frames[0]
    for frame in frames[1:]:
        actions = actions.unionByName(frame)
    return (
        actions.groupBy("table", "version").agg(
            F.timestamp_millis(F.max("millis")).alias("timestamp"),
            F.max("commitInfo.operation").alias("operation"),
            # CREATE TABLE's parameters carry the whole metadata and protocol: left out
            F.max(F.to_json(F.expr("map_filter(commitInfo.operationParameters, "
                                   "(k, v) -> k NOT IN ('metadata', 'protocol'))"))).alias("parameters"),
            F.max("txn.appId").alias("app_id"),
            F.max("txn.version").alias("batch_id"),
        )
    )


def _log_schema():
    from pyspark.sql.types import LongType, MapType, StringType, StructField, StructType

    return StructType([
        StructField("commitInfo", StructType([
            StructField("timestamp", LongType()), StructField("operation", StringType()),
            StructField("operationParameters", MapType(StringType(), StringType())),
        ])),
        StructField("txn", StructType([StructField("appId", StringType()), StructField("version", LongType())])),
    ])


def history_session(config: SMQPConfig):
    """A Spark session for reading the history (the project's lean local session; the active one if any)."""
    from streaming.session import build_session

    return build_session(config.streaming, app_name="smqp-history")


def open_history(config: SMQPConfig | None = None, version: int | PerTable | None = None,
                 timestamp: When | PerTable | None = None, spark=None, *, versions_view: bool = True):
    """A Spark session with every Delta table of the engine registered as a view.

    ``config`` defaults to :func:`~schemas.config.load_config` (``$SMQP_CONFIG``,
    ``SMQP_DATA_DIR`` …). ``version`` / ``timestamp`` travel in time, for every
    table or per table (``{"deliveries": 12}``). ``spark``: register in this
    session instead of building one. Also registers ``table_versions``
    (every commit of every table, always current).
    """
    config = config or load_config()
    spark = spark or history_session(config)
    register_views(spark, config, version=version, timestamp=timestamp, versions_view=versions_view)
    return spark


# -- SQL with time-travel clauses

_TRAVEL = r"\b({names})\s+(VERSION|TIMESTAMP)\s+AS\s+OF\s+('[^']*'|\"[^\"]*\"|\d+)"


def _travel_view(name: str, kind: str, value: str) -> str:
    digits = re.sub(r"\W", "_", value)
    return f"{name}__{'v' if kind == 'VERSION' else 't'}{digits}"


def sql(spark, config: SMQPConfig, statement: str):
    """Run ``statement`` over the registered views; ``<table> VERSION AS OF n`` and
    ``<table> TIMESTAMP AS OF '…'`` read that table's snapshot (a view of its own)."""
    names = table_names(config)
    if not names:
        return spark.sql(statement)
    pattern = re.compile(_TRAVEL.format(names="|".join(map(re.escape, names))), re.IGNORECASE)
    registered: dict[str, str] = {}

    def travel(match: re.Match) -> str:
        name, kind, raw = match.group(1).lower(), match.group(2).upper(), match.group(3)
        value = raw.strip("'\"")
        view = _travel_view(name, kind, value)
        if view not in registered:
            frame = (read_table(spark, config, name, version=int(value)) if kind == "VERSION"
                     else read_table(spark, config, name, timestamp=value))
            frame.createOrReplaceTempView(view)
            registered[view] = name
        return view

    return spark.sql(pattern.sub(travel, statement))


def tables_named(statement: str, names: Iterable[str]) -> list[str]:
    """The tables among ``names`` that ``statement`` mentions (as whole words)."""
    return [n for n in names if re.search(rf"\b{re.escape(n)}\b", statement, re.IGNORECASE)]


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


def describe_tables(config: SMQPConfig) -> str:
    """One line per table (version, last commit, files, rows), then each table's columns."""
    import textwrap

    import pyarrow as pa

    rows, columns = [], []
    for name in table_names(config):
        table = snapshot(config, name)
        actions = pa.table(table.get_add_actions(flatten=True))
        counts = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else []
        committed = _commit_time(config.table_path(name), table.version())
        rows.append((name, table.version(), f"{committed:%Y-%m-%d %H:%M:%S.%f}"[:-3] + "Z" if committed else "",
                     actions.num_rows, sum(c for c in counts if c is not None) if counts else "?"))
        fields = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in spark_schema(table).fields)
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
            "Spark SQL over the engine's Delta history. Every Delta table under <data_dir>/tables\n"
            "is a view of its own name: messages (every accepted publish), deliveries (one row per\n"
            "subscriber and message: pending/acked, routed_at, acked_at), subscriptions, metrics (one\n"
            "row per streaming micro-batch), and topics / trash / receipts where present; plus\n"
            f"{VERSIONS_VIEW} (every commit of every table: table, version, timestamp, operation,\n"
            "app_id, batch_id).\n\n"
            "Time travel: --version / --as-of below, or in the statement itself:\n"
            "  ... FROM deliveries TIMESTAMP AS OF '2026-11-22 08:00:00' ...\n"
            "  ... FROM messages VERSION AS OF 3 ..."
        ),
        epilog=(
            "examples:\n"
            "  smqp-sql --tables\n"
            "  smqp-sql \"SELECT topic, date_trunc('HOUR', accepted_at) AS hour, count(*) AS n\n"
            "            FROM messages GROUP BY 1, 2 ORDER BY 2, 1\"\n"
            "  smqp-sql \"SELECT count(*) FROM deliveries WHERE status = 'pending'\" --as-of 2026-11-22T08:00Z\n"
            "  smqp-sql \"SELECT * FROM messages\" --version messages=3 --csv out/messages.csv\n\n"
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
                        help="read TABLE at Delta version N (repeatable); a bare N applies to every "
                             "table the statement names")
    travel.add_argument("--as-of", action="append", metavar="[TABLE=]TIMESTAMP",
                        help="read every table (or TABLE) as it was at TIMESTAMP: ISO 8601 "
                             "(2026-11-22T08:00:00Z; no zone = UTC) or SMQP D20261122T080000Z")
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
        if args.tables:
            print(describe_tables(config))
            if not statement:
                return 0
        names = table_names(config)
        shared_version, versions = _per_table(args.version, "version", _version)
        shared_moment, moments = _per_table(args.as_of, "as-of", lambda t: parse_when(t))
        if shared_version is not None:
            for name in tables_named(statement, names) or names:
                versions.setdefault(name, shared_version)
        if shared_moment is not None:
            for name in names:
                moments.setdefault(name, shared_moment)
    except HistoryError as exc:
        print(f"smqp-sql: {exc}", file=sys.stderr)
        return 1

    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    borrowed = SparkSession.getActiveSession() is not None  # in-process callers keep their session
    spark = history_session(config)
    try:
        register_views(spark, config, version=versions or None, timestamp=moments or None,
                       versions_view=bool(tables_named(statement, [VERSIONS_VIEW])))
        frame = sql(spark, config, statement)
        if args.csv or args.parquet:
            out = args.csv or args.parquet
            count = _write(frame, out, "csv" if args.csv else "parquet")
            print(f"{count} row(s) written to {out}", file=sys.stderr)
        else:
            frame.show(n=args.max_rows, truncate=False, vertical=args.vertical)
        return 0
    except (HistoryError, PySparkException) as exc:
        message = exc.getMessage() if hasattr(exc, "getMessage") else str(exc)
        print(f"smqp-sql: {message}", file=sys.stderr)
        return 1
    finally:
        if not borrowed:
            spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
