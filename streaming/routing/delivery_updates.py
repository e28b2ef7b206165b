"""The source of the ``deliveries`` merge: every change a batch makes to a delivery (new, acked,
expired, retried, released, cleared, withheld, and the rows of account ``''``), one row each.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from streaming.routing.commands import unguaranteed_sql
from streaming.routing.frames import CLEARED, EXPIRING, NOBODY_UPDATES, RELEASED, RETRIED
from streaming.routing.sql import empty_sql, is_expired_sql, micros_to_ts, run_sql, sql_literal


def delivery_updates_sql(deliveries: str, acks: str, batch_id: int, routed_at: datetime,
                         now: int | None = None, unrouted: str | None = None, expiring: str | None = None,
                         retried: str | None = None, released: str | None = None, nobody: str | None = None,
                         cleared: str | None = None, withheld: str | None = None) -> str:
    """SQL of :func:`delivery_updates` over the relations ``deliveries``, ``acks`` (and ``unrouted``,
    ``expiring``, ``retried``, ``released``, ``nobody``, ``cleared``, ``withheld``: empty when None)."""
    unrouted = unrouted or empty_sql(StructType([StructField("smuid", LongType()), StructField("topic", StringType()),
                                                 StructField("priority", IntegerType()),
                                                 StructField("expires_at", LongType())]))
    expiring = expiring or empty_sql(EXPIRING)
    retried = retried or empty_sql(RETRIED)
    routed_at_sql, batch_sql = sql_literal(routed_at), sql_literal(batch_id)
    released = released or empty_sql(RELEASED)
    nobody = nobody or empty_sql(NOBODY_UPDATES)
    cleared = cleared or empty_sql(CLEARED)
    no_update = "CAST(NULL AS INT) AS retries, CAST(NULL AS STRING) AS receipt, CAST(NULL AS STRING) AS delivery"
    deliveries = (f"(SELECT *, FALSE AS _withheld FROM {deliveries}"
                  + (f" UNION ALL SELECT *, TRUE AS _withheld FROM {withheld})" if withheld else ")"))
    return f"""SELECT d.account, d.smuid, d.topic, d.priority,
       CASE WHEN d._withheld THEN 'cleared'
            WHEN {unguaranteed_sql("d.headers")} THEN 'sent'
            WHEN a.acked_at IS NOT NULL OR a.acked_guid IS NOT NULL THEN 'acked'
            WHEN rt.dead THEN 'trashed'
            WHEN {is_expired_sql("d.expires_at", now)} THEN 'expired' ELSE 'pending' END AS status,
       {routed_at_sql} AS routed_at, {batch_sql} AS routed_batch_id,
       a.acked_at, a.acked_guid, {micros_to_ts("d.expires_at")} AS expires_at, rt.retries,
       d.receipt, d.delivery, TRUE AS is_new
FROM {deliveries} d LEFT JOIN {acks} a ON d.account = a.account AND d.smuid = a.smuid
LEFT JOIN {retried} rt ON d.account = rt.account AND d.smuid = rt.smuid
UNION ALL
SELECT '' AS account, u.smuid, u.topic, u.priority,
       CASE WHEN {is_expired_sql("u.expires_at", now)} THEN 'expired' ELSE 'unrouted' END AS status,
       {routed_at_sql} AS routed_at, {batch_sql} AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       {micros_to_ts("u.expires_at")} AS expires_at, {no_update}, TRUE AS is_new
FROM {unrouted} u
UNION ALL
SELECT a.account, a.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, 'acked' AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       a.acked_at, a.acked_guid, CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {acks} a LEFT ANTI JOIN {deliveries} d ON a.account = d.account AND a.smuid = d.smuid
UNION ALL
SELECT e.account, e.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, 'expired' AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {expiring} e WHERE NOT e.is_new
UNION ALL
SELECT r.account, r.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority,
       CASE WHEN r.dead THEN 'trashed' ELSE 'retry' END AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, r.retries, CAST(NULL AS STRING) AS receipt,
       CAST(NULL AS STRING) AS delivery, FALSE AS is_new
FROM {retried} r LEFT ANTI JOIN {deliveries} d ON r.account = d.account AND r.smuid = d.smuid
UNION ALL
SELECT x.account, x.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, 'released' AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {released} x
UNION ALL
SELECT c.account, c.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, 'cleared' AS status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {cleared} c
UNION ALL
SELECT '' AS account, n.smuid, CAST(NULL AS STRING) AS topic, CAST(NULL AS INT) AS priority, n.status,
       CAST(NULL AS TIMESTAMP) AS routed_at, CAST(NULL AS BIGINT) AS routed_batch_id,
       CAST(NULL AS TIMESTAMP) AS acked_at, CAST(NULL AS STRING) AS acked_guid,
       CAST(NULL AS TIMESTAMP) AS expires_at, {no_update}, FALSE AS is_new
FROM {nobody} n"""


def delivery_updates(deliveries: DataFrame, acks: DataFrame, batch_id: int, routed_at: datetime,
                     now: int | None = None, unrouted: DataFrame | None = None,
                     expiring: DataFrame | None = None, retried: DataFrame | None = None,
                     released: DataFrame | None = None, nobody: DataFrame | None = None,
                     cleared: DataFrame | None = None, withheld: DataFrame | None = None) -> DataFrame:
    """New deliveries, acks and expiries → the source of the ``deliveries`` merge.

    ``DELIVERIES_TABLE`` columns plus ``is_new``: new deliveries are
    ``is_new`` rows, already ``acked`` when this batch also holds their ACK,
    ``sent`` for a non-guaranteed message (:func:`unguaranteed_sql`),
    ``expired`` when their message's ``expires_at <= now``;
    :func:`unrouted` publishes are ``is_new`` rows of account ``''``, status
    ``unrouted`` (``expired`` once past).  ACKs for deliveries of earlier
    batches are ``is_new = false`` rows with status ``acked``, and stored
    deliveries that expire now (:func:`expiring`, not ``is_new``) are
    ``is_new = false`` rows with status ``expired``: they update a matching row
    and are never inserted.  :func:`retried` deliveries are ``is_new = false``
    rows with their new ``retries`` and status ``retry`` (update the count
    only) or ``trashed`` (out of retries); :func:`released` ones are ``is_new =
    false`` rows with status ``released`` (their new subscriber's row comes in
    ``deliveries``).  ``nobody`` (:data:`NOBODY_UPDATES`) sets the status of stored ``unrouted``
    rows: ``routed`` once a late subscriber took the message (its delivery expires, or not, from
    then on), ``trashed`` once its topic was removed.  :func:`cleared` deliveries are ``is_new =
    false`` rows with status ``cleared``; :func:`withheld` ones (routed in this batch, never sent)
    are ``is_new`` rows with status ``cleared``.  One row per (account, smuid).
    """
    frames = {"deliveries": deliveries, "acks": acks}
    optional = {"unrouted": unrouted, "expiring": expiring, "retried": retried, "released": released,
                "nobody": nobody, "cleared": cleared, "withheld": withheld}
    frames.update({name: frame for name, frame in optional.items() if frame is not None})
    return run_sql(delivery_updates_sql("{deliveries}", "{acks}", batch_id, routed_at, now,
                                        *("{%s}" % name if frame is not None else None
                                          for name, frame in optional.items())), frames)
