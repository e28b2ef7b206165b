"""A batch's commands as rows: Kafka records parsed into events, the ACKs among them, the
publishes as ``messages`` rows, and what the gateways may forget (ACKs and unguaranteed deliveries).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from schemas.spark import COMMAND_EVENT, HEADERS
from streaming.routing.federation import federation_sql
from streaming.routing.sql import first_per, micros_to_ts, run_sql, sql_literal


_VALID = """coalesce(
      (type = 'publish' AND account IS NOT NULL AND smuid IS NOT NULL AND topic IS NOT NULL)
      OR (type IN ('subscribe', 'unsubscribe') AND account IS NOT NULL AND pattern IS NOT NULL)
      OR (type IN ('ack', 'nack') AND account IS NOT NULL AND smuid IS NOT NULL),
      FALSE)"""


def decoded_records_sql(records: str) -> str:
    """SQL: every Kafka record of ``records`` as :data:`EVENTS` columns, all null where its value is not
    a JSON object (the job's sink decodes them in Python instead: ``streaming.sink.decode_records``)."""
    return f"""SELECT e.*, seq, kafka_partition, kafka_offset FROM (
    SELECT from_json(CAST(value AS STRING), '{COMMAND_EVENT.simpleString()}') AS e,
           named_struct('timestamp', `timestamp`, 'partition', `partition`, 'offset', `offset`) AS seq,
           `partition` AS kafka_partition, `offset` AS kafka_offset
    FROM {records})"""


def valid_events_sql(decoded: str) -> str:
    """SQL: the rows of ``decoded`` (:data:`EVENTS`) that are commands: a known ``type`` with the fields it needs."""
    return f"SELECT * FROM {decoded} WHERE {_VALID}"


def parse_commands_sql(records: str) -> str:
    """SQL of :func:`parse_commands` over the relation ``records``."""
    return valid_events_sql(f"({decoded_records_sql(records)})")


def parse_commands(records: DataFrame) -> DataFrame:
    """Kafka records (``KAFKA_RECORD`` columns) → command events (:data:`EVENTS`).

    ``value`` is parsed with ``from_json`` against ``COMMAND_EVENT``.  Records
    that are not JSON, have an unknown ``type`` or lack the fields their type
    needs are dropped here (they must never stop the job); the sink still counts
    their offsets as consumed.
    """
    return run_sql(parse_commands_sql("{records}"), {"records": records})


def extract_acks_sql(events: str) -> str:
    """SQL of :func:`extract_acks` over the relation ``events``."""
    return f"""SELECT account, smuid, {micros_to_ts("accepted_at")} AS acked_at, guid AS acked_guid, seq
FROM {first_per("account, smuid", "seq", events, "type = 'ack'")}"""


def extract_acks(events: DataFrame) -> DataFrame:
    """ACK events → :data:`ACKS`, one per (account, smuid): the first one in the batch."""
    return run_sql(extract_acks_sql("{events}"), {"events": events})


def message_rows_sql(events: str, batch_id: int) -> str:
    """SQL of :func:`message_rows` over the relation ``events``."""
    return f"""SELECT smuid, topic, cmuid, account AS publisher, guid AS publisher_guid, priority, headers, sections,
       {micros_to_ts("accepted_at")} AS accepted_at, kafka_partition, kafka_offset,
       {sql_literal(batch_id)} AS batch_id, {micros_to_ts("expires_at")} AS expires_at,
       lower(coalesce(receipt, 'none')) AS receipt, lower(coalesce(delivery, 'all')) AS delivery, {federation_sql()}
FROM {first_per("smuid", "seq", events, "type = 'publish'")}"""


def message_rows(events: DataFrame, batch_id: int) -> DataFrame:
    """Publishes → ``MESSAGES_TABLE`` rows (one per smuid in the batch; data stays base64)."""
    return run_sql(message_rows_sql("{events}", batch_id), {"events": events})


def unguaranteed_sql(headers: str) -> str:
    """SQL: true when the message attributes ``headers`` say ``Guarantee: NO`` (or ``Guar: NO``).

    Such a message (2002 revision) is never acknowledged by its subscribers:
    its delivery is settled as soon as it is sent.
    """
    return (f"exists(coalesce({headers}, CAST(array() AS {HEADERS.simpleString()})), "
            f"_h -> lower(_h[0]) IN ('guarantee', 'guar') AND upper(trim(_h[1])) = 'NO')")


def settled_sql(acks: str, deliveries: str) -> str:
    """SQL: what the gateways may forget, as (account, smuid, seq): every ACK, and every
    delivery of a non-guaranteed message (no ACK will ever come for it)."""
    return f"""SELECT account, smuid, seq FROM {acks}
UNION ALL
SELECT account, smuid, seq FROM {deliveries} WHERE {unguaranteed_sql("headers")}"""


def settled(acks: DataFrame, deliveries: DataFrame) -> DataFrame:
    """ACKs + non-guaranteed deliveries → (account, smuid, seq) the gateways may forget (:func:`settled_sql`)."""
    return run_sql(settled_sql("{acks}", "{deliveries}"), {"acks": acks, "deliveries": deliveries})
