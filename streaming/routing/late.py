"""Late subscribers (issue 4): a subscription this batch starts gets the messages published before
it that are still alive, stored or of this batch.
"""

from __future__ import annotations

from typing import Mapping

from pyspark.sql import DataFrame

from streaming.routing.federation import NO_PEERS, and_may_receive, federation_sql
from streaming.routing.frames import SEQ_DDL
from streaming.routing.route import candidate_patterns_sql, pick_order_sql
from streaming.routing.sql import first_per, is_expired_sql, micros_to_ts, run_sql


def _opened_sql(intervals: str) -> str:
    """SQL: the intervals this batch's SUBSCRIBEs opened that start a subscription (not a re-SUBSCRIBE
    redefining SINCE/UNTIL, whose previous interval ends where it opens) and are still open."""
    return f"""SELECT s.account, s.pattern, s.from_seq, s.since, s.until FROM {intervals} s
WHERE s.from_seq IS NOT NULL AND s.to_seq IS NULL
  AND NOT EXISTS (SELECT 1 FROM {intervals} p
                  WHERE p.account = s.account AND p.pattern = s.pattern AND p.to_seq = s.from_seq)"""


def late_sql(events: str, intervals: str, stored: str, held: str, routed_all: str, now: int | None,
             peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL of :func:`late` over the relations ``events``, ``intervals``, ``stored``, ``held`` and
    ``routed_all`` (:func:`route_all_sql`'s rows)."""
    publishes = first_per("smuid", "seq", events, "type = 'publish'")
    columns = ("smuid, topic, cmuid, publisher, publisher_guid, accepted_at, priority, headers, sections, seq, "
               "expires_at, receipt, delivery, depth, hops, origin, origin_topic")
    candidates = f"""SELECT smuid, topic, cmuid, publisher, publisher_guid, unix_micros(accepted_at) AS accepted_at,
       priority, headers, sections, CAST(NULL AS {SEQ_DDL}) AS seq, unix_micros(expires_at) AS expires_at,
       lower(coalesce(receipt, 'none')) AS receipt, lower(coalesce(delivery, 'all')) AS delivery,
       {federation_sql()}, FALSE AS _taken
FROM {first_per("smuid", "batch_id", stored)} WHERE smuid NOT IN (SELECT smuid FROM {publishes})
UNION ALL
SELECT smuid, topic, cmuid, account AS publisher, guid AS publisher_guid, accepted_at, priority, headers, sections,
       seq, expires_at, lower(coalesce(receipt, 'none')) AS receipt, lower(coalesce(delivery, 'all')) AS delivery,
       {federation_sql()},
       EXISTS (SELECT 1 FROM {routed_all} r WHERE r.smuid = p.smuid AND r.account <> '') AS _taken
FROM {publishes} p"""
    return f"""SELECT account, {columns} FROM (
  SELECT *, row_number() OVER (PARTITION BY smuid ORDER BY {pick_order_sql("smuid", "account")}) AS _one FROM (
    SELECT *, row_number() OVER (PARTITION BY account, smuid ORDER BY seq) AS _d FROM (
      SELECT s.account, c.smuid, c.topic, c.cmuid, c.publisher, c.publisher_guid, c.accepted_at, c.priority,
             c.headers, c.sections, s.from_seq AS seq, c.expires_at, c.receipt, c.delivery, c.depth, c.hops,
             c.origin, c.origin_topic
      FROM (SELECT *, {micros_to_ts("accepted_at")} AS _at, explode({candidate_patterns_sql("topic")}) AS _pattern
            FROM ({candidates}) WHERE NOT {is_expired_sql("expires_at", now)} AND NOT (delivery = 'one' AND _taken)) c
      JOIN ({_opened_sql(intervals)}) s
      ON s.pattern = c._pattern AND (c.seq IS NULL OR c.seq < s.from_seq)
         AND (s.since IS NULL OR s.since <= c._at) AND (s.until IS NULL OR c._at < s.until)
         {and_may_receive("s.account", "c.depth", "c.hops", peers)}) m
    WHERE NOT EXISTS (SELECT 1 FROM {held} h WHERE h.account = m.account AND h.smuid = m.smuid)
      AND NOT EXISTS (SELECT 1 FROM {routed_all} r WHERE r.account = m.account AND r.smuid = m.smuid))
  WHERE _d = 1)
WHERE delivery <> 'one' OR _one = 1"""


def late(events: DataFrame, intervals: DataFrame, stored: DataFrame, held: DataFrame, routed_all: DataFrame,
         now: int | None, peers: Mapping[str, str] = NO_PEERS) -> DataFrame:
    """Messages published before a SUBSCRIBE that still reach it → :data:`DELIVERIES`.

    A message lives for its timeout (issue 4): a subscription this batch starts
    (:func:`_opened_sql`; a re-SUBSCRIBE only redefines SINCE/UNTIL and gets
    nothing again) gets every message on a topic it matches that was accepted
    before it and is not expired at ``now`` (a state message never is), within
    its SINCE/UNTIL, unless that account already has a delivery of it: stored
    (``held``, :data:`HELD`) or routed in this batch (``routed_all``).  The
    messages are the stored ones (``stored``: ``MESSAGES_TABLE`` columns, the
    sink reads the not yet expired ones of the subscribed topics) and this
    batch's publishes before the SUBSCRIBE.  A DELIVERY ONE message goes only
    when nobody holds it (the sink reads no stored one that anybody holds), to
    one of the new subscribers, picked by a hash like :func:`route`.  ``seq``
    is the SUBSCRIBE's: these Delivers answer it.  A new subscriber of ``peers`` gets what
    :func:`may_receive_sql` allows, as in :func:`route`.
    """
    return run_sql(late_sql("{events}", "{intervals}", "{stored}", "{held}", "{routed_all}", now, peers),
                   {"events": events, "intervals": intervals, "stored": stored, "held": held,
                    "routed_all": routed_all})
