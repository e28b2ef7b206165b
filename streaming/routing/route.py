"""Publishes to subscribers: the topic patterns a topic matches, the pick of one subscriber for
DELIVERY ONE, and the publishes that reached nobody (kept, ``unrouted``, until they expire).
"""

from __future__ import annotations

from typing import Mapping

from pyspark.sql import Column, DataFrame, functions as F

from streaming.routing.federation import NO_PEERS, and_may_receive, federation_sql
from streaming.routing.frames import DELIVERIES
from streaming.routing.sql import first_per, micros_to_ts, run_sql


def candidate_patterns_sql(topic: str) -> str:
    """SQL: every subscription pattern that matches the canonical topic (SQL expression ``topic``).

    ``/a/b/c`` → ``["/a/b/c", "/a/*", "/a/b/*"]``: the topic itself and the
    wildcard of each proper ancestor.  Matching then is an equi-join on the
    pattern, the same relation as ``schemas.topics.TopicPattern.matches`` (a
    wildcard ``/a/b/*`` covers topics starting with ``/a/b/``, so ``/a/*``
    never matches ``/ab/x`` and ``/a/b/*`` does not match ``/a/b`` itself).
    """
    levels = f"split(substr({topic}, 2, length({topic})), '/')"
    ancestors = (f"transform(sequence(1, size({levels}) - 1), "
                 f"_i -> concat('/', array_join(slice({levels}, 1, _i), '/'), '/*'))")
    return f"CASE WHEN size({levels}) > 1 THEN concat(array({topic}), {ancestors}) ELSE array({topic}) END"


def candidate_patterns(topic: str) -> Column:
    """:func:`candidate_patterns_sql` as a Column; ``topic`` is a column name or SQL expression."""
    return F.expr(candidate_patterns_sql(topic))


def account_topic_owner_sql(topic: str) -> str:
    """SQL: the account owning ``topic`` (SQL expression) when it is ``/accounts/<name>``, else ``''``.

    The owner is ``<name>`` in lower case, the account name deliveries are keyed
    by (``schemas.topics.account_topic``); descendants of an account topic are
    nobody's.
    """
    return f"regexp_extract(lower({topic}), '^/accounts/([^/]+)$', 1)"


def pick_order_sql(smuid: str, account: str) -> str:
    """SQL: the order a DELIVERY ONE message's candidate subscribers are picked in (the first gets it):
    by the CRC-32 of ``"<smuid>/<account>"``, then by account.  Deterministic, so a replayed batch
    picks as the first attempt did, and spread evenly over the candidates; a CRC rather than
    ``xxhash64`` because the driver's routing of simple batches picks the same way with
    ``zlib.crc32`` (``streaming.simple_batch.pick_order``)."""
    return f"crc32(CAST(concat(CAST({smuid} AS STRING), '/', {account}) AS BINARY)), {account}"


def route_all_sql(events: str, intervals: str, one: bool = True, peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL: :func:`route`'s rows, plus one row of account ``''`` for each publish that reached nobody
    and can expire (``expires_at`` not null): :func:`unrouted` from the same pass.

    Account-topic owners come out of the same join: each publish's row for its
    own topic (one per publish among its candidate patterns) also names the
    owner, and the join is LEFT so that row survives with no subscriber.  A
    second pass over the publishes instead cost ~20 % of a micro-batch.
    ``_reached`` (a window per smuid) tells the publishes that reached nobody;
    the per-(account, smuid) window after it needs no shuffle of its own.  A subscriber of ``peers``
    (another farm's link) is reached only as :func:`may_receive_sql` allows, in the join itself, so a
    DELIVERY ONE message is never picked for it when it may not get it.
    """
    publishes = first_per("smuid", "seq", events, "type = 'publish'")
    pick_one = (f"row_number() OVER (PARTITION BY smuid ORDER BY {pick_order_sql('smuid', 'account')})" if one
                else "1")  # ``one`` False: no DELIVERY ONE publish in the batch, no window needed
    return f"""SELECT {", ".join(DELIVERIES.fieldNames())} FROM (
  SELECT *, {pick_one} AS _one FROM (
  SELECT *, row_number() OVER (PARTITION BY account, smuid ORDER BY seq) AS _d FROM (
    SELECT CASE WHEN _reached THEN _to ELSE '' END AS account, smuid, topic, cmuid, publisher, publisher_guid,
           accepted_at, priority, headers, sections, seq, expires_at, receipt, delivery, depth, hops, origin,
           origin_topic
    FROM (
      SELECT *, bool_or(coalesce(_to <> '', FALSE)) OVER (PARTITION BY smuid) AS _reached FROM (
        SELECT p.*, explode(array(s.account, CASE WHEN p._pattern = p.topic
                                                   {and_may_receive("p._owner", "p.depth", "p.hops", peers)}
                                              THEN p._owner END)) AS _to
        FROM (
          SELECT smuid, topic, cmuid, account AS publisher, guid AS publisher_guid, accepted_at, priority, headers,
                 sections, seq, expires_at, lower(coalesce(receipt, 'none')) AS receipt,
                 lower(coalesce(delivery, 'all')) AS delivery, {federation_sql()},
                 {micros_to_ts("accepted_at")} AS _at,
                 {account_topic_owner_sql("topic")} AS _owner, explode({candidate_patterns_sql("topic")}) AS _pattern
          FROM {publishes}
        ) p
        LEFT JOIN (SELECT account, pattern AS _pattern, from_seq, to_seq, since, until FROM {intervals}) s
        ON p._pattern = s._pattern
           AND (s.from_seq IS NULL OR s.from_seq < p.seq) AND (s.to_seq IS NULL OR p.seq < s.to_seq)
           AND (s.since IS NULL OR s.since <= p._at) AND (s.until IS NULL OR p._at < s.until)
           {and_may_receive("s.account", "p.depth", "p.hops", peers)}))
    WHERE coalesce(_to <> '', FALSE) OR (NOT _reached AND expires_at IS NOT NULL)))
  WHERE _d = 1)
WHERE delivery <> 'one' OR _one = 1"""


def route_sql(events: str, intervals: str, peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL of :func:`route` over the relations ``events`` and ``intervals`` (:func:`route_all_sql`'s
    rows that name a subscriber)."""
    return f"SELECT * FROM ({route_all_sql(events, intervals, peers=peers)}) WHERE account <> ''"


def route(events: DataFrame, intervals: DataFrame, peers: Mapping[str, str] = NO_PEERS) -> DataFrame:
    """Publishes × subscription intervals → :data:`DELIVERIES`.

    A publish reaches an interval whose pattern matches its topic (see
    :func:`candidate_patterns`) when ``from_seq < seq < to_seq`` (null bounds
    open) and ``since <= accepted_at < until`` (null bounds open; the
    gateway's acceptance time, spec 4.1.9.1 SINCE/UNTIL).  A publish to an
    account topic also reaches its owner without any subscription (see
    :func:`account_topic_owner_sql`): that is how PUB REPLY and receipts get
    back to a publisher.  A publish repeated within the batch (same ``smuid``)
    counts once, at its first position.  One row per (subscriber account,
    smuid), however many ways reached that account.  A DELIVERY ONE message
    (2002 revision, XEP-0254 queueing) reaches one of them only, picked by a
    hash of (smuid, account): deterministic on replay, and spread evenly.  An account of ``peers``
    (``[federation] peers``: account → domain) is reached only when :func:`schemas.topics.forwards`
    allows (:func:`may_receive_sql`).
    """
    return run_sql(route_sql("{events}", "{intervals}", peers), {"events": events, "intervals": intervals})


def unrouted_sql(events: str, routed: str) -> str:
    """SQL of :func:`unrouted` over the relations ``events`` and ``routed``."""
    return f"""SELECT p.smuid, p.topic, p.priority, p.expires_at
FROM {first_per("smuid", "seq", events, "type = 'publish'")} p LEFT ANTI JOIN {routed} r ON p.smuid = r.smuid
WHERE p.expires_at IS NOT NULL"""


def unrouted(events: DataFrame, routed: DataFrame) -> DataFrame:
    """Publishes of the batch that reached no subscriber and can expire: (smuid, topic, priority, expires_at).

    Each is kept as a ``deliveries`` row with account ``''`` and status
    ``unrouted`` (see :func:`delivery_updates`) until it expires into the
    Trash; a state message (no ``expires_at``) never does, so it needs none.
    The sink takes the same rows from :func:`route_all_sql` (:func:`unrouted_of_sql`),
    saving a join.
    """
    return run_sql(unrouted_sql("{events}", "{routed}"), {"events": events, "routed": routed})


def unrouted_of_sql(routed_all: str) -> str:
    """SQL: :func:`unrouted`'s rows out of the relation ``routed_all`` (:func:`route_all_sql`)."""
    return f"SELECT smuid, topic, priority, expires_at FROM {routed_all} WHERE account = ''"
