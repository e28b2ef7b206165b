"""Message lifetimes: the deliveries whose message expires in this batch, those still to send, and
what goes to the Trash (expired, undeliverable, out of retries, topic removed).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from schemas.spark import TRASH_FROM_MESSAGE

from streaming.routing.commands import unguaranteed_sql
from streaming.routing.frames import ORPHANED
from streaming.routing.sql import empty_sql, first_per, is_expired_sql, run_sql, sql_literal


def expiring_sql(routed: str, unrouted: str, acks: str, pending: str, now: int | None) -> str:
    """SQL of :func:`expiring` over the relations ``routed``, ``unrouted``, ``acks`` and ``pending``."""
    return f"""SELECT r.account, r.smuid, TRUE AS is_new
FROM {routed} r LEFT ANTI JOIN {acks} a ON r.account = a.account AND r.smuid = a.smuid
WHERE NOT {unguaranteed_sql("r.headers")} AND {is_expired_sql("r.expires_at", now)}
UNION ALL
SELECT '' AS account, u.smuid, TRUE AS is_new FROM {unrouted} u WHERE {is_expired_sql("u.expires_at", now)}
UNION ALL
SELECT p.account, p.smuid, FALSE AS is_new
FROM (SELECT * FROM {pending} q LEFT ANTI JOIN {routed} r ON q.account = r.account AND q.smuid = r.smuid) p
LEFT ANTI JOIN {acks} a ON p.account = a.account AND p.smuid = a.smuid
WHERE p.status IN ('pending', 'unrouted', 'waiting') AND {is_expired_sql("p.expires_at", now, micros=False)}"""


def expiring(routed: DataFrame, unrouted: DataFrame, acks: DataFrame, pending: DataFrame,
             now: int | None) -> DataFrame:
    """The deliveries whose message expires in this batch, unacknowledged → :data:`EXPIRING`.

    ``now`` (microseconds) is the batch's clock: the largest tick or
    ``accepted_at`` it holds, so a replay decides the same way.  A message
    expires when ``expires_at <= now``; a state message (null ``expires_at``)
    never does.  Expiring are: this batch's guaranteed deliveries
    (:data:`DELIVERIES`, ``routed``) of an already expired message, unless the
    batch also holds their ACK; this batch's :func:`unrouted` publishes
    (account ``''``); and the stored ``pending`` rows (:data:`PENDING`: status
    ``pending``, ``unrouted`` or ``waiting``) the batch neither acknowledges nor routes
    anew.  A delivery of a non-guaranteed message is settled when sent and
    never expires.
    """
    return run_sql(expiring_sql("{routed}", "{unrouted}", "{acks}", "{pending}", now),
                   {"routed": routed, "unrouted": unrouted, "acks": acks, "pending": pending})


def live_sql(routed: str, expiring: str) -> str:
    """SQL of :func:`live` over the relations ``routed`` and ``expiring``."""
    return f"""SELECT * FROM {routed} r
WHERE NOT EXISTS (SELECT 1 FROM {expiring} e WHERE e.is_new AND e.account = r.account AND e.smuid = r.smuid)"""


def live(routed: DataFrame, expiring: DataFrame) -> DataFrame:
    """This batch's deliveries minus those already expired (:func:`expiring`): the ones to send."""
    return run_sql(live_sql("{routed}", "{expiring}"), {"routed": routed, "expiring": expiring})


def _trashed_at(now: int | None) -> str:
    return "CAST(NULL AS TIMESTAMP)" if now is None else f"timestamp_micros({sql_literal(now)})"


def dead_messages_sql(expiring: str, retried: str, orphaned: str | None = None, routed: str | None = None) -> str:
    """SQL of :func:`dead_messages` over the relations ``expiring``, ``retried``, ``orphaned`` and
    ``routed`` (none when None)."""
    orphaned = orphaned or empty_sql(ORPHANED)
    held = f" AND smuid NOT IN (SELECT smuid FROM {routed})" if routed else ""
    return f"""SELECT smuid, '' AS account,
       CASE WHEN bool_and(account = '') THEN 'undeliverable' ELSE 'expired' END AS reason
FROM {expiring} GROUP BY smuid
UNION ALL
SELECT smuid, account, 'max_retries' AS reason FROM {retried} WHERE dead
UNION ALL
SELECT DISTINCT smuid, '' AS account, 'topic_removed' AS reason FROM {orphaned}
WHERE smuid NOT IN (SELECT smuid FROM {expiring}){held}"""


def dead_messages(expiring: DataFrame, retried: DataFrame, orphaned: DataFrame | None = None,
                  routed: DataFrame | None = None) -> DataFrame:
    """What goes to the Trash in this batch → :data:`DEAD`.

    A message with an :func:`expiring` delivery goes once, as a whole
    (account ``''``): reason ``undeliverable`` when it reached no subscriber,
    else ``expired``.  A delivery that used up its retries (:func:`retried`,
    ``dead``) goes for that subscriber: reason ``max_retries``.  A message of a
    topic removed in this batch that nobody holds any more (``orphaned``,
    :data:`ORPHANED`: stored ones kept only for late subscribers, or unrouted,
    and the batch's own publishes before the removal) goes as a whole: reason
    ``topic_removed`` (unless it expires now: ``expired`` wins), unless this
    batch routes it to somebody (``routed``, :data:`DELIVERIES`): its pending
    deliveries still go out.
    """
    frames = {"expiring": expiring, "retried": retried}
    optional = {"orphaned": orphaned, "routed": routed}
    frames.update({name: frame for name, frame in optional.items() if frame is not None})
    return run_sql(dead_messages_sql("{expiring}", "{retried}", *("{%s}" % name if frame is not None else None
                                                                  for name, frame in optional.items())), frames)


def trash_sql(dead: str, messages: str, now: int | None, batch_id: int) -> str:
    """SQL of :func:`trash` over the relations ``dead`` and ``messages``."""
    return f"""SELECT m.smuid, m.topic, concat(m.topic, '/Trash') AS trash_topic, d.reason,
       {_trashed_at(now)} AS trashed_at, m.publisher, m.cmuid, m.headers, m.sections,
       {sql_literal(batch_id)} AS batch_id, d.account, {", ".join(f"m.{name}" for name in TRASH_FROM_MESSAGE)}
FROM {dead} d JOIN {first_per("smuid", "batch_id", messages)} m ON d.smuid = m.smuid"""


def trash(dead: DataFrame, messages: DataFrame, now: int | None, batch_id: int) -> DataFrame:
    """:func:`dead_messages` → ``TRASH_TABLE`` rows in the message's topic's Trash (``<topic>/Trash``).

    ``messages`` has the ``MESSAGES_TABLE`` columns (this batch's rows and the
    stored rows of the dead messages).  A fully acknowledged message has no
    pending delivery left and never dies.  ``trashed_at`` is the batch's ``now``.
    """
    return run_sql(trash_sql("{dead}", "{messages}", now, batch_id), {"dead": dead, "messages": messages})
