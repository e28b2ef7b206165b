"""SQL text helpers every transform shares: literals, running a transform's text over frames, and
the small fragments (first row per key, an empty relation, "has expired") they are written with.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType, TimestampType


def sql_literal(value: int | datetime) -> str:
    """``value`` as a typed Spark SQL literal: ``BIGINT`` for ints, ``TIMESTAMP`` for datetimes.

    A datetime converts as ``F.lit`` would (aware: its instant; naive: local time).
    """
    if isinstance(value, datetime):
        return f"timestamp_micros({int(TimestampType().toInternal(value))})"
    return f"CAST({int(value)} AS BIGINT)"


def run_sql(sql: str, frames: dict[str, DataFrame]) -> DataFrame:
    """``sql`` with each ``{name}`` replaced by a temporary view of ``frames[name]``.

    The views get unique names and are dropped again once the query is
    analysed (the returned frame holds their plans, not their names).
    """
    spark = next(iter(frames.values())).sparkSession
    views = {name: f"_routing_{name}_{uuid.uuid4().hex}" for name in frames}
    for name, frame in frames.items():
        frame.createOrReplaceTempView(views[name])
    try:
        return spark.sql(sql.format(**views))
    finally:
        for view in views.values():
            spark.catalog.dropTempView(view)


def micros_to_ts(column: str) -> str:
    """SQL: ``column`` (microseconds since the epoch, as events carry times) as a timestamp."""
    return f"timestamp_micros({column})"


def first_per(keys: str, order: str, relation: str, where: str = "TRUE") -> str:
    """Rows of ``relation`` matching ``where``, only the first per ``keys`` by ``order`` (``_n`` = 1)."""
    return (f"(SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY {order}) AS _n "
            f"FROM {relation} WHERE {where}) WHERE _n = 1)")


def empty_sql(schema: StructType) -> str:
    """SQL: an empty relation with the columns of ``schema`` (stands in for a relation with no rows)."""
    columns = ", ".join(f"CAST(NULL AS {f.dataType.simpleString()}) AS `{f.name}`" for f in schema.fields)
    return f"(SELECT {columns} WHERE FALSE)"


def is_expired_sql(expires_at: str, now: int | None, micros: bool = True) -> str:
    """SQL: true when ``expires_at`` (microseconds, or a timestamp when not ``micros``) is at or
    before ``now`` (microseconds); never for a null ``expires_at`` (a state message) or ``now``."""
    if now is None:
        return "FALSE"
    bound = sql_literal(now) if micros else f"timestamp_micros({sql_literal(now)})"
    return f"coalesce({expires_at} <= {bound}, FALSE)"


def string_literal(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
