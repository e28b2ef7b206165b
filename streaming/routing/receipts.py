"""Receipts (2002 revision: RECEIPT ONE / ALL, and "X/Y" when the timeout passes first): which are
due, and each as a message to its publisher's account topic and a ``receipts`` row.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from schemas.smuid import EPOCH_MS, JOB_NODE_ID, MAX_SEQUENCE, NODE_BITS, SEQUENCE_BITS
from schemas.spark import MESSAGES_TABLE
from streaming.routing.federation import NO_HOPS
from streaming.routing.frames import DELIVERIES, RECEIPT_MESSAGES, SEQ_DDL
from streaming.routing.sql import empty_sql, first_per, run_sql, sql_literal


def receipts_due_sql(state: str, acks: str, expiring: str, receipted: str, messages: str | None = None,
                     routed: str | None = None) -> str:
    """SQL of :func:`receipts_due` over the relations ``state``, ``acks``, ``expiring``, ``receipted``,
    ``messages`` and ``routed`` (none when None)."""
    messages = messages or empty_sql(MESSAGES_TABLE)
    routed = routed or empty_sql(DELIVERIES)
    nobody = f"""SELECT e.smuid, lower(m.receipt) AS mode, 0 AS acked, 0 AS targeted
FROM (SELECT DISTINCT smuid FROM {expiring} WHERE account = '') e
JOIN {first_per("smuid", "batch_id", messages)} m ON m.smuid = e.smuid
WHERE lower(m.receipt) IN ('one', 'all') AND e.smuid NOT IN (SELECT smuid FROM {state})
  AND e.smuid NOT IN (SELECT smuid FROM {receipted})"""
    return f"""{nobody}
UNION ALL
SELECT smuid, mode, acked, targeted FROM (
  SELECT s.smuid, max(s.receipt) AS mode,
         CAST(count_if(s.status = 'acked' OR a.account IS NOT NULL) AS INT) AS acked,
         CAST(count(1) AS INT) AS targeted, bool_or(e.smuid IS NOT NULL) AS expiring
  FROM (SELECT account, smuid, status, receipt FROM {state}
        UNION ALL SELECT account, smuid, 'pending' AS status, receipt FROM {routed}) s
  LEFT JOIN {acks} a ON a.account = s.account AND a.smuid = s.smuid
  LEFT JOIN (SELECT DISTINCT smuid FROM {expiring}) e ON e.smuid = s.smuid
  WHERE s.account <> '' AND s.receipt IN ('one', 'all') AND s.status <> 'released'
  GROUP BY s.smuid)
WHERE ((mode = 'one' AND acked >= 1) OR (mode = 'all' AND acked = targeted) OR expiring)
  AND smuid NOT IN (SELECT smuid FROM {receipted})"""


def receipts_due(state: DataFrame, acks: DataFrame, expiring: DataFrame, receipted: DataFrame,
                 messages: DataFrame | None = None, routed: DataFrame | None = None) -> DataFrame:
    """The receipts this batch owes → :data:`RECEIPTS_DUE`.

    ``state`` holds every stored delivery (:data:`RECEIPT_STATE`) of the
    messages concerned; this batch's ACKs count as acknowledged.  A RECEIPT
    ONE message is due at its first acknowledgement, a RECEIPT ALL message
    when every subscriber it was routed to acknowledged it, and either one,
    when its timeout passes first (it is :func:`expiring`), with ``X/Y`` =
    ``acked/targeted`` so far.  ``receipted`` (smuids) were answered already:
    a message gets one receipt, ever.  A message that reached nobody (an :func:`expiring` row of
    account ``''``; ``messages``, ``MESSAGES_TABLE`` columns, says whether it asked for a receipt)
    gets ``0/0`` at its expiry; one a late subscriber took (:func:`late`) is answered like any other.
    This batch's deliveries (``routed``, :data:`DELIVERIES`) count among the targeted too: a message
    already expired when routed gets its ``X/Y`` now, as from a later batch, and a subscriber may
    acknowledge a message in the batch that routes it, having been notified by a gateway routing early.
    """
    frames = {"state": state, "acks": acks, "expiring": expiring, "receipted": receipted}
    optional = {"messages": messages, "routed": routed}
    frames.update({name: frame for name, frame in optional.items() if frame is not None})
    return run_sql(receipts_due_sql("{state}", "{acks}", "{expiring}", "{receipted}",
                                    *("{%s}" % name if frame is not None else None
                                      for name, frame in optional.items())), frames)


def receipt_messages_sql(due: str, messages: str, now: int | None) -> str:
    """SQL of :func:`receipt_messages` over the relations ``due`` and ``messages``."""
    if now is None:
        return empty_sql(RECEIPT_MESSAGES)[1:-1]
    k = "_k"
    smuid = (f"shiftleft({sql_literal(now // 1000 - EPOCH_MS)} + div({k}, {MAX_SEQUENCE + 1}), "
             f"{NODE_BITS + SEQUENCE_BITS}) | shiftleft(CAST({JOB_NODE_ID} AS BIGINT), {SEQUENCE_BITS}) "
             f"| ({k} % {MAX_SEQUENCE + 1})")
    body = "concat(d.acked, '/', d.targeted)"
    return f"""SELECT lower(m.publisher) AS account, {smuid} AS smuid, concat('/accounts/', lower(m.publisher)) AS topic,
       m.cmuid, m.publisher, m.publisher_guid, {sql_literal(now)} AS accepted_at, 0 AS priority,
       array(array('Receipt', upper(d.mode)), array('Receipt-For', CAST(d.smuid AS STRING)),
             array('Delivered', {body})) AS headers,
       array(named_struct('headers', array(array('Content-Type', 'text/plain'),
                                           array('Content-Length', CAST(length({body}) AS STRING))),
                          'data', base64(CAST({body} AS BINARY)))) AS sections,
       CAST(NULL AS {SEQ_DDL}) AS seq, CAST(NULL AS BIGINT) AS expires_at, 'none' AS receipt, 'all' AS delivery,
       0 AS depth, {NO_HOPS} AS hops, CAST(NULL AS STRING) AS origin, CAST(NULL AS STRING) AS origin_topic,
       d.smuid AS receipt_for, d.mode, d.acked, d.targeted
FROM (SELECT *, row_number() OVER (ORDER BY smuid) - 1 AS {k} FROM {due}) d
JOIN {first_per("smuid", "batch_id", messages)} m ON m.smuid = d.smuid"""


def receipt_messages(due: DataFrame, messages: DataFrame, now: int | None) -> DataFrame:
    """:func:`receipts_due` → the receipt messages (:data:`RECEIPT_MESSAGES`), one each.

    A receipt is a message on the publisher's account topic
    (``/accounts/<publisher>``, which reaches its owner), carrying the
    original's Cmuid and the attributes ``Receipt`` (ONE / ALL),
    ``Receipt-For`` (the original SMUID) and ``Delivered: X/Y``, with ``X/Y``
    as its text body.  Its SMUID is the job's own (node
    :data:`schemas.smuid.JOB_NODE_ID`, the batch's clock, a sequence by
    original SMUID), so a replayed batch makes the same receipt.
    ``messages`` has the ``MESSAGES_TABLE`` columns.
    """
    return run_sql(receipt_messages_sql("{due}", "{messages}", now), {"due": due, "messages": messages})


def receipt_rows_sql(receipts: str, batch_id: int) -> str:
    """SQL: :func:`receipt_messages` → ``RECEIPTS_TABLE`` rows (what was answered, when, with which message)."""
    return f"""SELECT receipt_for AS smuid, publisher, mode, acked, targeted, smuid AS receipt_smuid,
       timestamp_micros(accepted_at) AS receipted_at, {sql_literal(batch_id)} AS batch_id
FROM {receipts}"""


def receipt_message_rows_sql(receipts: str, batch_id: int) -> str:
    """SQL: :func:`receipt_messages` → ``MESSAGES_TABLE`` rows (a receipt is a message of record too)."""
    return f"""SELECT smuid, topic, cmuid, publisher, publisher_guid, priority, headers, sections,
       timestamp_micros(accepted_at) AS accepted_at, CAST(NULL AS INT) AS kafka_partition,
       CAST(NULL AS BIGINT) AS kafka_offset, {sql_literal(batch_id)} AS batch_id,
       CAST(NULL AS TIMESTAMP) AS expires_at, receipt, delivery, depth, hops, origin, origin_topic
FROM {receipts}"""
