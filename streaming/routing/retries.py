"""NACKs: retry counts up to the topic's ``max_retries``, and DELIVERY ONE messages handed on to
another subscriber (released, then reassigned).
"""

from __future__ import annotations

from typing import Mapping

from pyspark.sql import DataFrame

from streaming.routing.federation import NO_PEERS, and_may_receive, federation_sql
from streaming.routing.frames import RELEASED
from streaming.routing.route import candidate_patterns_sql, pick_order_sql
from streaming.routing.sql import empty_sql, first_per, run_sql


def retried_sql(events: str, retrying: str, acks: str, expiring: str, released: str | None = None) -> str:
    """SQL of :func:`retried` over the relations ``events``, ``retrying``, ``acks``, ``expiring`` and
    ``released`` (none when None)."""
    released = released or empty_sql(RELEASED)
    return f"""SELECT r.account, r.smuid, CAST(coalesce(r.retries, 0) + n.nacks AS INT) AS retries,
       coalesce(r.retries, 0) + n.nacks > n.max_retries AS dead, n.seq
FROM (SELECT account, smuid, count(1) AS nacks, max_by(max_retries, seq) AS max_retries, max(seq) AS seq
      FROM {events} WHERE type = 'nack' GROUP BY account, smuid) n
JOIN {retrying} r ON n.account = r.account AND n.smuid = r.smuid
WHERE r.status = 'pending'
  AND NOT EXISTS (SELECT 1 FROM {acks} a WHERE a.account = r.account AND a.smuid = r.smuid)
  AND NOT EXISTS (SELECT 1 FROM {expiring} e WHERE e.account = r.account AND e.smuid = r.smuid)
  AND NOT EXISTS (SELECT 1 FROM {released} x WHERE x.account = r.account AND x.smuid = r.smuid)"""


def retried(events: DataFrame, retrying: DataFrame, acks: DataFrame, expiring: DataFrame,
            released: DataFrame | None = None) -> DataFrame:
    """NACKs (a NOTIFY unacknowledged within the retry timeout) → :data:`RETRIED`.

    Each NACK of a still ``pending`` delivery (``retrying``: its stored row,
    :data:`RETRYING`) counts one retry; a delivery whose count passes the
    ``max_retries`` the gateway stamped on its latest NACK (the first NOTIFY and
    ``max_retries`` more went unacknowledged) is ``dead`` and goes to the Trash.  A delivery this batch acknowledges or expires is not
    retried: the ACK (or the expiry) wins; nor is one :func:`released` to another subscriber.
    Retry counts live in the ``deliveries`` table, so a restart of the job or of a gateway keeps them.
    """
    frames = {"events": events, "retrying": retrying, "acks": acks, "expiring": expiring}
    if released is not None:
        frames["released"] = released
    return run_sql(retried_sql("{events}", "{retrying}", "{acks}", "{expiring}",
                               "{released}" if released is not None else None), frames)


def released_sql(events: str, retrying: str, acks: str, expiring: str, intervals: str, messages: str,
                 peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL of :func:`released` over the relations ``events``, ``retrying``, ``acks``, ``expiring``,
    ``intervals`` and ``messages``."""
    held = f"""SELECT n.account, n.smuid, n.seq FROM (
      SELECT account, smuid, max(seq) AS seq FROM {events} WHERE type = 'nack' GROUP BY account, smuid) n
    JOIN {retrying} r ON n.account = r.account AND n.smuid = r.smuid
    WHERE r.status = 'pending' AND r.delivery = 'one'
      AND NOT EXISTS (SELECT 1 FROM {acks} a WHERE a.account = n.account AND a.smuid = n.smuid)
      AND NOT EXISTS (SELECT 1 FROM {expiring} e WHERE e.account = n.account AND e.smuid = n.smuid)"""
    gone = f"SELECT DISTINCT account FROM {events} WHERE type = 'nack' AND reason = 'disconnect'"
    order = f"p.account IS NOT NULL, {pick_order_sql('c.smuid', 'c.`to`')}"
    return f"""SELECT account, smuid, `to`, seq FROM (
  SELECT c.*, row_number() OVER (PARTITION BY c.smuid ORDER BY {order}) AS _k
  FROM (
    SELECT h.account, h.smuid, h.seq, s.account AS `to`
    FROM (SELECT h.*, m.accepted_at AS _at, m.depth AS _depth, m.hops AS _hops,
                 explode({candidate_patterns_sql("m.topic")}) AS _pattern
          FROM ({held}) h JOIN {first_per("smuid", "batch_id", messages)} m ON m.smuid = h.smuid) h
    JOIN {intervals} s ON s.pattern = h._pattern AND s.to_seq IS NULL
         AND (s.since IS NULL OR s.since <= h._at) AND (s.until IS NULL OR h._at < s.until)
         {and_may_receive("s.account", "h._depth", "h._hops", peers)}
    WHERE s.account <> h.account AND s.account NOT IN ({gone})) c
  LEFT JOIN (SELECT DISTINCT account, smuid FROM {retrying}) p ON p.account = c.`to` AND p.smuid = c.smuid)
WHERE _k = 1"""


def released(events: DataFrame, retrying: DataFrame, acks: DataFrame, expiring: DataFrame, intervals: DataFrame,
             messages: DataFrame, peers: Mapping[str, str] = NO_PEERS) -> DataFrame:
    """NACKed DELIVERY ONE deliveries and who gets them instead → :data:`RELEASED`.

    XEP-0254 queueing: a DELIVERY ONE message is locked to one subscriber until
    it acknowledges; when its NOTIFY times out, or the subscriber's login ends
    (a ``disconnect`` NACK), it is unlocked and offered to another subscriber:
    one whose subscription covers its topic at the end of the batch (and whose
    SINCE/UNTIL admit it), not the one releasing it, not one that disconnected
    in this batch, preferring one that never held it, then by a hash of
    (smuid, account).  With nobody else, nothing is released and the NACK
    counts as a retry (:func:`retried`).  ``retrying`` holds the stored
    deliveries of the NACKed messages, every account's; ``messages`` has the
    ``MESSAGES_TABLE`` columns.  A subscriber of ``peers`` takes it only as :func:`may_receive_sql` allows.
    """
    return run_sql(released_sql("{events}", "{retrying}", "{acks}", "{expiring}", "{intervals}", "{messages}",
                                peers),
                   {"events": events, "retrying": retrying, "acks": acks, "expiring": expiring,
                    "intervals": intervals, "messages": messages})


def reassigned_sql(released: str, messages: str) -> str:
    """SQL: :func:`released` → the new deliveries (:data:`DELIVERIES`) to their new subscribers."""
    return f"""SELECT x.`to` AS account, m.smuid, m.topic, m.cmuid, m.publisher, m.publisher_guid,
       unix_micros(m.accepted_at) AS accepted_at, m.priority, m.headers, m.sections, x.seq,
       unix_micros(m.expires_at) AS expires_at, coalesce(m.receipt, 'none') AS receipt, 'one' AS delivery,
       {federation_sql("m")}
FROM {released} x JOIN {first_per("smuid", "batch_id", messages)} m ON m.smuid = x.smuid"""
