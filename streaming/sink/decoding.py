"""A batch's Kafka records as the routing query's events (:data:`streaming.routing.frames.EVENTS`):
decoded in Python, split by kind, with each partition's timestamps in log order.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from schemas.spark import arrow_schema
from streaming.routing.frames import EVENTS


_EVENTS_ARROW = arrow_schema(EVENTS)

#: :data:`_EVENTS_ARROW` but a record's position (its last three columns), and that position's struct.
_COMMAND_ARROW = pa.schema(list(_EVENTS_ARROW)[:-3])
_SEQ_ARROW = _EVENTS_ARROW.field("seq").type


def _command_fields(value: bytes | None) -> dict:
    """A record's value as the JSON object it should be, else ``{}`` (every field null, as from_json gives)."""
    try:
        decoded = json.loads(value)
    except (ValueError, TypeError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def in_log_order(records: pa.Table, floors: dict[int, int]) -> tuple[pa.Table, dict[int, int]]:
    """``records`` with each partition's timestamps made non-decreasing in offset order, from
    ``floors`` (the last timestamp, in µs, of each partition's previous batch); and the new floors.

    Why: the routing orders commands by ``seq`` (timestamp, partition, offset), so that several
    commands partitions merge by time. But a record's timestamp is its gateway's clock: a PUBLISH
    one gateway appends just after another gateway's SUBSCRIBE may carry an earlier time, and was
    routed as if it came first, reaching nobody, where the gateways' fold (in offset order) routed
    it to the subscriber. Within a partition the log's order is the truth (Property 2), so a
    timestamp is raised to the latest before it there; across partitions time still merges them.
    ``tests/streaming/test_routing_parity.py`` proves the two routings equal on skewed clocks."""
    if not records.num_rows:
        return records, floors
    column = records.column("timestamp").combine_chunks()
    stamps = pc.cast(column, pa.int64()).to_pylist()
    partitions, offsets = records.column("partition").to_pylist(), records.column("offset").to_pylist()
    raised, floors = list(stamps), dict(floors)
    for row in sorted(range(records.num_rows), key=lambda i: (partitions[i], offsets[i])):
        floor = floors.get(partitions[row])
        if stamps[row] is not None:
            raised[row] = stamps[row] if floor is None else max(stamps[row], floor)
            floors[partitions[row]] = raised[row]
    if raised == stamps:
        return records, floors
    index = records.schema.get_field_index("timestamp")
    return records.set_column(index, records.schema.field(index), pa.array(raised, pa.int64()).cast(column.type)), floors


def decode_records(records: pa.Table) -> pa.Table:
    """A batch's Kafka records (``KAFKA_RECORD`` columns) as :data:`streaming.routing.EVENTS` rows, one per record:
    the sink's own :func:`streaming.routing.commands.decoded_records_sql`.

    JSON is decoded here, in Python, not by ``from_json`` in the routing query: the query then
    starts from flat columns, and Spark no longer parses every record once per reference to
    ``events`` while optimising (measured on this box: 20-45 % less planning CPU per batch, most for
    large batches).  Extra fields are ignored and missing ones are null, as with ``from_json``; a
    record whose fields do not fit their types is all null (``from_json`` may keep the fields that
    do), so :func:`streaming.routing.commands.valid_events_sql` drops it, as it does non-JSON records.
    """
    return _events_table(records, _commands(records))


def _commands(records: pa.Table) -> list[dict]:
    """Each record's command fields (:func:`_command_fields`): the JSON, decoded once for the batch."""
    return [_command_fields(value) for value in records.column("value").to_pylist()]


def _events_table(records: pa.Table, commands: list[dict]) -> pa.Table:
    """:func:`decode_records` of ``records``, whose ``commands`` (:func:`_commands`) are decoded already."""
    try:
        fields = pa.Table.from_pylist(commands, schema=_COMMAND_ARROW)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        fields = pa.concat_tables([_command_row(command) for command in commands])
    # The positions straight from Arrow: through Python objects, timestamps cost more than the JSON.
    at, partition, offset = _positions(records)
    seq = pa.StructArray.from_arrays([at, partition, offset], fields=list(_SEQ_ARROW))
    return pa.Table.from_arrays(fields.columns + [seq, partition, offset], schema=_EVENTS_ARROW)


def _positions(records: pa.Table) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The records' timestamps, partitions and offsets, as the types of ``seq``'s fields."""
    at, partition, offset = (records.column(name).combine_chunks().cast(field.type)
                             for name, field in zip(("timestamp", "partition", "offset"), _SEQ_ARROW))
    return at, partition, offset


def _command_row(command: dict) -> pa.Table:
    """One record's command fields, all null when a field does not fit its type."""
    try:
        return pa.Table.from_pylist([command], schema=_COMMAND_ARROW)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.Table.from_pylist([{}], schema=_COMMAND_ARROW)


#: The batch's events by kind, each its own relation of the routing query (``{decoded_<kind>}``): the
#: types of :data:`streaming.routing.commands._VALID` each kind holds.
EVENT_KINDS: dict[str, tuple[str, ...]] = {"publish": ("publish",), "subscription": ("subscribe", "unsubscribe"),
                                          "ack": ("ack",), "nack": ("nack",)}


def events_by_kind(decoded: pa.Table) -> dict[str, pa.Table]:
    """:func:`decode_records`'s rows split by :data:`EVENT_KINDS` (rows of no kind are no command).

    Why: Spark evaluates a small relation while optimising, once per reference to it, and every
    transform reads the events of one kind; with one relation of every event, each reference
    filtered all of them (an ACK batch's 20,000 rows by every publish transform; measured: planning
    such a batch took 1.9-2.1 s, split 0.8-0.9 s).  Split, a transform whose kind the batch lacks
    reads an empty relation, folded away without reading a row.
    """
    types = decoded.column("type")
    return {kind: decoded.filter(pc.fill_null(pc.is_in(types, pa.array(names)), False))
            for kind, names in EVENT_KINDS.items()}
