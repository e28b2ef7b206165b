"""Subscriptions over a batch: the intervals in which each (account, pattern) is subscribed, in
``seq`` order, and the ``subscriptions`` rows they leave behind.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from streaming.routing.frames import SEQ_DDL
from streaming.routing.sql import first_per, micros_to_ts, run_sql, sql_literal


def _covers(unsubscribed: str, pattern: str) -> str:
    """SQL: true when UNSUBSCRIBE ``unsubscribed`` ends subscription ``pattern``.

    Equal patterns, or ``unsubscribed`` is a wildcard ``/a/*`` whose prefix
    ``/a/`` starts ``pattern`` (``/a/x``, ``/a/x/*``, ``/a/*`` …).
    """
    return (f"({unsubscribed} = {pattern} OR (endswith({unsubscribed}, '/*') "
            f"AND startswith({pattern}, substr({unsubscribed}, 1, length({unsubscribed}) - 1))))")


def _opens_sql(current: str, events: str) -> str:
    """SQL: where intervals start: the active subscriptions before the batch, then each SUBSCRIBE."""
    return f"""SELECT account, pattern, guid, subscribed_at, CAST(NULL AS {SEQ_DDL}) AS from_seq, since, until
FROM {current} WHERE active
UNION ALL
SELECT account, pattern, guid, {micros_to_ts("accepted_at")} AS subscribed_at, seq AS from_seq,
       {micros_to_ts("since")} AS since, {micros_to_ts("until")} AS until
FROM {events} WHERE type = 'subscribe'"""


def _closes_sql(events: str) -> str:
    """SQL: where intervals end: each UNSUBSCRIBE, and each SUBSCRIBE (it redefines SINCE/UNTIL).

    ``c_at`` is the UNSUBSCRIBE's time; null for a SUBSCRIBE, which ends an
    interval without unsubscribing anyone.
    """
    return f"""SELECT account AS c_account, pattern AS c_pattern, type = 'unsubscribe' AS c_unsub, seq AS c_seq,
       CASE WHEN type = 'unsubscribe' THEN {micros_to_ts("accepted_at")} END AS c_at
FROM {events} WHERE type IN ('subscribe', 'unsubscribe')"""


def _ended_sql(current: str, events: str) -> str:
    """SQL: each open with its end, the first later close of the same account that ends it.

    An UNSUBSCRIBE ends the patterns it covers (:func:`_covers`); a SUBSCRIBE
    only its own pattern.  ``_redefines``: the open is a SUBSCRIBE that ended
    the previous interval of its (account, pattern), i.e. a re-subscribe while
    subscribed.
    """
    return f"""SELECT *, coalesce(lag(to_seq) OVER (PARTITION BY account, pattern ORDER BY from_seq ASC NULLS FIRST)
                   = from_seq, FALSE) AS _redefines
FROM (
  SELECT o.account, o.pattern, o.guid, o.subscribed_at, o.from_seq, o.since, o.until,
         min(c.c_seq) AS to_seq, min_by(c.c_at, c.c_seq) AS unsubscribed_at
  FROM ({_opens_sql(current, events)}) o
  LEFT JOIN ({_closes_sql(events)}) c
  ON o.account = c.c_account AND (c.c_pattern = o.pattern OR (c.c_unsub AND {_covers("c.c_pattern", "o.pattern")}))
     AND (o.from_seq IS NULL OR c.c_seq > o.from_seq)
  GROUP BY o.account, o.pattern, o.guid, o.subscribed_at, o.from_seq, o.since, o.until)"""


def subscription_intervals_sql(current: str, events: str) -> str:
    """SQL of :func:`subscription_intervals` over the relations ``current`` and ``events``.

    ``_start`` is the open that began the subscription: the last one up to this
    open that is not a re-subscribe, whose guid and time every re-subscribe keeps.
    """
    started = ("last_value(CASE WHEN NOT _redefines THEN named_struct('guid', guid, 'at', subscribed_at) END, TRUE) "
               "OVER (PARTITION BY account, pattern ORDER BY from_seq ASC NULLS FIRST)")
    return f"""SELECT account, pattern, _start.guid AS guid, _start.at AS subscribed_at, from_seq, to_seq, unsubscribed_at,
       since, until
FROM (SELECT *, {started} AS _start FROM ({_ended_sql(current, events)}))"""


def subscription_intervals(current: DataFrame, events: DataFrame) -> DataFrame:
    """Current subscriptions + this batch's (un)subscribes → :data:`INTERVALS`.

    ``current`` has the ``SUBSCRIPTIONS_TABLE`` columns; only ``active`` rows
    count, and they open at ``from_seq = null`` (before this batch) with their
    stored SINCE/UNTIL.  Each SUBSCRIBE opens an interval at its ``seq`` with
    its own SINCE/UNTIL.  An interval ends at the first later UNSUBSCRIBE of the
    same account whose pattern covers it (see :func:`_covers`, which sets
    ``unsubscribed_at``) or the next SUBSCRIBE of the same pattern; ``to_seq``
    stays null when none does.

    A SUBSCRIBE while already subscribed to the same pattern redefines SINCE and
    UNTIL (spec 4.1.9.1) for publishes after it, so it ends the previous
    interval and opens its own; it is the same subscription, though, so it
    keeps the guid and ``subscribed_at`` of the SUBSCRIBE that started it.  A
    SUBSCRIBE after an UNSUBSCRIBE starts a new subscription.
    """
    return run_sql(subscription_intervals_sql("{current}", "{events}"),
                   {"current": current, "events": events})


def subscription_state_sql(intervals: str, batch_id: int) -> str:
    """SQL of :func:`subscription_state` over the relation ``intervals``."""
    last = first_per("account, pattern", "from_seq DESC NULLS LAST", intervals,
                      "from_seq IS NOT NULL OR to_seq IS NOT NULL")
    return f"""SELECT account, pattern, guid, to_seq IS NULL AS active, subscribed_at, unsubscribed_at, since, until,
       {sql_literal(batch_id)} AS batch_id
FROM {last}"""


def subscription_state(intervals: DataFrame, batch_id: int) -> DataFrame:
    """Intervals → rows for the ``subscriptions`` merge (``SUBSCRIPTIONS_TABLE`` columns).

    Only (account, pattern) pairs this batch touched appear (an interval with a
    non-null bound).  Each takes its last interval: ``active`` when it is still
    open, with that interval's guid, ``subscribed_at``, ``unsubscribed_at`` and
    SINCE/UNTIL, so the next batch (or a restart) routes with the latest bounds.
    """
    return run_sql(subscription_state_sql("{intervals}", batch_id), {"intervals": intervals})
