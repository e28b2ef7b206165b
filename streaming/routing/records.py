"""The ``smqp.deliveries`` records a batch produces: a Deliver per delivery a gateway still needs,
and an Acked per ACK, expiry, dead retry, hand-on or SINCE clearing.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql.types import ArrayType

from schemas.spark import HEADERS, SECTION_JSON
from streaming.routing.federation import NO_HOPS
from streaming.routing.frames import CLEARED, RELEASED, SEQ_DDL
from streaming.routing.sql import empty_sql, run_sql


def unacknowledged_sql(live: str, acks: str) -> str:
    """SQL of :func:`unacknowledged` over the relations ``live`` and ``acks``."""
    return f"""SELECT * FROM {live} l
WHERE NOT EXISTS (SELECT 1 FROM {acks} a WHERE a.account = l.account AND a.smuid = l.smuid)"""


def unacknowledged(live: DataFrame, acks: DataFrame) -> DataFrame:
    """This batch's live deliveries minus those the same batch acknowledges: the ones whose
    ``Deliver`` a gateway still needs.

    An ACK in the batch that routes its message answers a NOTIFY a gateway sent on its own,
    routing early (the job's deliveries are sent only after its batch): that gateway has the
    delivery, and the ``Acked`` that follows settles it at every other; a ``Deliver`` before it
    would be ~600 B produced, stored and fetched by every gateway only to be skipped."""
    return run_sql(unacknowledged_sql("{live}", "{acks}"), {"live": live, "acks": acks})


def deliver_records_sql(deliveries: str) -> str:
    """SQL of :func:`deliver_records` over the relation ``deliveries``."""
    return f"""SELECT CAST(account AS BINARY) AS key, to_json(named_struct(
         'type', 'deliver', 'account', account, 'smuid', smuid, 'topic', topic, 'cmuid', cmuid,
         'publisher', publisher, 'publisher_guid', publisher_guid, 'accepted_at', accepted_at,
         'priority', coalesce(priority, 0),
         'headers', coalesce(headers, CAST(array() AS {HEADERS.simpleString()})),
         'sections', coalesce(sections, CAST(array() AS {ArrayType(SECTION_JSON).simpleString()})),
         'delivery', coalesce(delivery, 'all'), 'expires_at', expires_at,
         'depth', coalesce(depth, 0), 'hops', coalesce(hops, {NO_HOPS}), 'origin', origin,
         'origin_topic', origin_topic)) AS value,
       seq
FROM {deliveries}"""


def deliver_records(deliveries: DataFrame) -> DataFrame:
    """Deliveries → ``smqp.deliveries`` records: key = account, value = Deliver JSON.

    Field names and nesting are those of ``schemas.events.Deliver.to_bytes()``
    so ``schemas.events.decode`` returns an equal ``Deliver``.  ``seq`` is the
    publish's position: produce in that order (acceptance order).
    """
    return run_sql(deliver_records_sql("{deliveries}"), {"deliveries": deliveries})


def acked_records_sql(acks: str) -> str:
    """SQL of :func:`acked_records` over the relation ``acks``."""
    return f"""SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid)) AS value, seq
FROM {acks}"""


def acked_records(acks: DataFrame) -> DataFrame:
    """ACKs (:data:`ACKS` plus their ``seq``) → ``smqp.deliveries`` records: key = account, value = Acked JSON."""
    return run_sql(acked_records_sql("{acks}"), {"acks": acks})


def expired_records_sql(expiring: str, retried: str, released: str | None = None, cleared: str | None = None) -> str:
    """SQL of :func:`expired_records` over the relations ``expiring``, ``retried``, ``released`` and
    ``cleared`` (none when None)."""
    released = released or empty_sql(RELEASED)
    cleared = cleared or empty_sql(CLEARED)
    return f"""SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid, 'reason', 'expired')) AS value,
       CAST(NULL AS {SEQ_DDL}) AS seq
FROM {expiring} WHERE account <> ''
UNION ALL
SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid, 'reason', 'max_retries')) AS value,
       seq
FROM {retried} WHERE dead
UNION ALL
SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid, 'reason', 'released')) AS value,
       seq
FROM {released}
UNION ALL
SELECT CAST(account AS BINARY) AS key,
       to_json(named_struct('type', 'acked', 'account', account, 'smuid', smuid, 'reason', 'cleared')) AS value,
       seq
FROM {cleared}"""


def expired_records(expiring: DataFrame, retried: DataFrame, released: DataFrame | None = None,
                    cleared: DataFrame | None = None) -> DataFrame:
    """Deliveries that died unacknowledged → ``Acked`` records with the reason, so the
    gateways withdraw them from their books and queues: those that expired (:func:`expiring`;
    this batch's expired deliveries the job never sends, but a gateway routing early may have
    notified them) and those out of retries
    (:func:`retried`, ``dead``), DELIVERY ONE ones handed to another subscriber (:func:`released`),
    and those a new SINCE cleared (:func:`cleared`)."""
    frames = {"expiring": expiring, "retried": retried}
    optional = {"released": released, "cleared": cleared}
    frames.update({name: frame for name, frame in optional.items() if frame is not None})
    return run_sql(expired_records_sql("{expiring}", "{retried}", *("{%s}" % name if frame is not None else None
                                                                    for name, frame in optional.items())), frames)
