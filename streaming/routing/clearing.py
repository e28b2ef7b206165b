"""SUBSCRIBE with SINCE (spec 4.1.9.1): it clears the subscriber's pending deliveries accepted before
SINCE, stored ones (:func:`cleared`) and those this batch routed before it (:func:`withheld`).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from streaming.routing.route import candidate_patterns_sql
from streaming.routing.sql import run_sql


def cleared_sql(intervals: str, clearable: str, acks: str, expiring: str, retried: str, released: str) -> str:
    """SQL of :func:`cleared` over the relations ``intervals``, ``clearable``, ``acks``, ``expiring``,
    ``retried`` and ``released``."""
    return f"""SELECT account, smuid, seq FROM (
  SELECT c.account, c.smuid, s.from_seq AS seq,
         row_number() OVER (PARTITION BY c.account, c.smuid ORDER BY s.from_seq) AS _n
  FROM (SELECT *, explode({candidate_patterns_sql("topic")}) AS _pattern FROM {clearable}) c
  JOIN {intervals} s ON s.account = c.account AND s.pattern = c._pattern
       AND s.from_seq IS NOT NULL AND s.since IS NOT NULL AND c.accepted_at < s.since) x
WHERE _n = 1
  AND NOT EXISTS (SELECT 1 FROM {acks} a WHERE a.account = x.account AND a.smuid = x.smuid)
  AND NOT EXISTS (SELECT 1 FROM {expiring} e WHERE e.account = x.account AND e.smuid = x.smuid)
  AND NOT EXISTS (SELECT 1 FROM {retried} r WHERE r.account = x.account AND r.smuid = x.smuid)
  AND NOT EXISTS (SELECT 1 FROM {released} r WHERE r.account = x.account AND r.smuid = x.smuid)"""


def cleared(intervals: DataFrame, clearable: DataFrame, acks: DataFrame, expiring: DataFrame, retried: DataFrame,
            released: DataFrame) -> DataFrame:
    """Pending deliveries a SUBSCRIBE with SINCE clears → :data:`CLEARED`.

    Spec 4.1.9.1: a SUB MESSAGE with SINCE (a new subscription or a re-SUBSCRIBE
    redefining it) clears that subscriber's pending messages accepted before
    SINCE on the topics its pattern matches (``clearable``, :data:`CLEARABLE`:
    stored pending deliveries).  Their rows become ``cleared`` and an ``Acked``
    with reason ``cleared`` withdraws them from the gateways.  What this batch
    acknowledges, expires, retries or hands on is left alone (that wins).  Deliveries
    routed earlier in the same batch are :func:`withheld` instead.
    """
    return run_sql(cleared_sql("{intervals}", "{clearable}", "{acks}", "{expiring}", "{retried}", "{released}"),
                   {"intervals": intervals, "clearable": clearable, "acks": acks, "expiring": expiring,
                    "retried": retried, "released": released})


def _cleared_later_sql(events: str, routed: str) -> str:
    """SQL: true for a row of ``routed`` (a delivery of this batch) when a later SUBSCRIBE of the
    batch by the same account with SINCE after the message's acceptance, on a pattern matching its
    topic, clears it (:func:`withheld`)."""
    return f"""EXISTS (SELECT 1 FROM {events} s
  WHERE s.type = 'subscribe' AND s.since IS NOT NULL AND s.account = {routed}.account
    AND s.seq > {routed}.seq AND {routed}.accepted_at < s.since
    AND array_contains({candidate_patterns_sql(f"{routed}.topic")}, s.pattern))"""


def withheld_sql(events: str, routed: str, cleared: bool = True) -> str:
    """SQL of :func:`withheld` over the relations ``events`` and ``routed``; with ``cleared``
    False, the rest of ``routed`` (the deliveries that go out)."""
    test = _cleared_later_sql(events, "_r")
    return f"SELECT * FROM {routed} _r WHERE {test if cleared else f'NOT {test}'}"


def withheld(events: DataFrame, routed: DataFrame) -> DataFrame:
    """This batch's deliveries (:data:`DELIVERIES`) that a later SUBSCRIBE of the same batch clears.

    A SUB MESSAGE with SINCE clears what is pending for the subscriber before
    SINCE (:func:`cleared`); a delivery routed earlier in the same batch (through
    the subscription the SUBSCRIBE redefines, or another of the account's) is
    pending too, so it is never sent: its row becomes ``cleared`` at once
    (:func:`delivery_updates`).  ``seq`` orders them: a SUBSCRIBE before the
    publish filters it by SINCE when routing instead.
    """
    return run_sql(withheld_sql("{events}", "{routed}"), {"events": events, "routed": routed})
