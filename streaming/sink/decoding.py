"""A batch's Kafka records as the routing query's events (:data:`streaming.routing.frames.EVENTS`):
decoded in Python, split by kind, with each partition's timestamps in log order.
"""

from __future__ import annotations

import json
from datetime import timedelta
from itertools import chain

import pyarrow as pa
import pyarrow.compute as pc

from schemas.events import encodes_as_utf8
from schemas.spark import arrow_schema
from streaming.routing.frames import EVENTS


_EVENTS_ARROW = arrow_schema(EVENTS)

#: :data:`_EVENTS_ARROW` but a record's position (its last three columns), and that position's struct.
_COMMAND_ARROW = pa.schema(list(_EVENTS_ARROW)[:-3])
_SEQ_ARROW = _EVENTS_ARROW.field("seq").type

#: What Arrow raises for a field that does not fit its type: a lone surrogate (JSON's ``"\\ud800"``,
#: which no gateway writes but another producer may) is a string Arrow cannot encode as UTF-8.
_UNFIT = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeEncodeError)


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
    except _UNFIT:
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
    except _UNFIT:
        return pa.Table.from_pylist([{}], schema=_COMMAND_ARROW)


def decoded_events(records: pa.Table) -> list[dict]:
    """``decode_records(records).to_pylist()``, mostly without the Arrow table: the events a simple batch
    is routed from in Python (:func:`streaming.simple_batch.route`).

    Why: that round trip (``from_pylist`` then ``to_pylist``) took ~17 % of the sink thread at 1,000
    commands/s, only to null the fields a command lacks, drop extra ones and check the others' types.
    When every field of the batch already is what Arrow would give back (:func:`_fits`: the
    gateways' commands are), the decoded JSON is kept as it is; else the whole batch goes through
    Arrow, which coerces or nulls its fields as :func:`decode_records` does (pyarrow turns 1.5 into 1
    and "ab" into ["a", "b"]).  ``tests/unit/test_decoded_events.py`` proves the two equal."""
    commands = _commands(records)
    no_fields = dict.fromkeys(_COMMAND_ARROW.names)
    rows = [{**no_fields, **command} for command in commands]  # its fields in order, then any extra ones
    if not all(_fits(field.type, column) for field, column in zip(_COMMAND_ARROW, zip(*map(dict.values, rows)))):
        return _events_table(records, commands).to_pylist()
    return _placed(rows, records)


def _placed(rows: list[dict], records: pa.Table) -> list[dict]:
    """``rows`` (each record's command fields, then any extra ones) without their extra fields and with
    their records' positions (``seq``, ``kafka_partition``, ``kafka_offset``), as :data:`EVENTS` rows."""
    at, partition, offset = _positions(records)
    fields = len(_COMMAND_ARROW)
    for row, stamp, kafka_partition, kafka_offset in zip(rows, _datetimes(at), partition.to_pylist(),
                                                         offset.to_pylist()):
        if len(row) > fields:
            for extra in list(row)[fields:]:
                del row[extra]
        row["seq"] = {"timestamp": stamp, "partition": kafka_partition, "offset": kafka_offset}
        row["kafka_partition"], row["kafka_offset"] = kafka_partition, kafka_offset
    return rows


def _fits(kind: pa.DataType, values: tuple | list) -> bool:
    """Whether each of ``values`` is what an Arrow ``kind`` made of it gives back: no value that Arrow
    would coerce, null or fail on.  One check of each field for the whole batch, most of it in C."""
    values = [value for value in values if value is not None]
    if not values:
        return True
    types = set(map(type, values))
    if pa.types.is_string(kind):
        return types == {str} and encodes_as_utf8("".join(values))
    if pa.types.is_signed_integer(kind):  # not a bool, nor a float, nor out of range
        bound = 1 << kind.bit_width - 1
        return types == {int} and -bound <= min(values) and max(values) < bound
    if pa.types.is_list(kind):  # not a string nor a dict, which Arrow reads as sequences too
        return types == {list} and _fits(kind.value_type, list(chain.from_iterable(values)))
    if pa.types.is_struct(kind):  # a dict of exactly the struct's fields, in order
        names = tuple(kind.names)
        return (types == {dict} and all(map(names.__eq__, map(tuple, values)))
                and all(_fits(field.type, [value[field.name] for value in values]) for field in kind))
    return False  # a type not checked here: Arrow decides


def _datetimes(stamps: pa.TimestampArray) -> list:
    """``stamps.to_pylist()``, 5-10 times faster (measured): pyarrow makes a scalar of each timestamp and
    looks its zone up for each."""
    micros = timedelta(microseconds=1)
    return [None if stamp is None else _EPOCH + stamp * micros for stamp in stamps.cast(pa.int64()).to_pylist()]


#: Arrow's own datetime of ``seq.timestamp`` 0 (its time zone object too), for :func:`_datetimes`.
_EPOCH = pa.scalar(0, pa.int64()).cast(_SEQ_ARROW.field("timestamp").type).as_py()


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
