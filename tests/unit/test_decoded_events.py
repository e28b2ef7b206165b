"""``decoded_events`` (a simple batch's events, as dicts) gives exactly what ``decode_records(...).to_pylist()``
gives for the same Kafka records: ``streaming.simple_batch.route`` reads them, and
``tests/streaming/test_simple_batch.py`` proves it equal to the routing query, which reads the Arrow table.

Exactly: equal values of equal Python types (``1 == 1.0 == True``, so ``repr`` too), keys in the same
order.  The records hold what the commands topic may: the gateways' commands, JSON objects with
fields of the right and of the wrong types, extra and missing ones, JSON that is no object, no JSON.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from schemas import events as ev
from schemas.spark import KAFKA_RECORD, arrow_schema
from streaming.routing.frames import EVENTS
from streaming.sink import decoding
from streaming.sink.decoding import decode_records, decoded_events

#: The command fields (:data:`streaming.routing.EVENTS` but a record's position) and their Arrow types.
FIELDS = [field for field in arrow_schema(EVENTS) if field.name not in ("seq", "kafka_partition", "kafka_offset")]
US0 = 1_704_164_645_000_000

#: Strings as the gateways write them: non-ASCII and astral ones too.
names = st.one_of(st.text(max_size=6), st.sampled_from(["", "é", "日本", "\U0001f600"]))
#: Strings as JSON may hold them: lone surrogates too (``"\\ud800"``), which Arrow cannot encode.
texts = st.one_of(names, st.sampled_from(["\ud800", "a\udc00"]))
#: Integers near the bounds of int32 and int64, which Arrow refuses past.
integers = st.one_of(st.integers(-1000, 1000), st.integers(), st.sampled_from(
    [bound + delta for bound in (2 ** 31, -2 ** 31, 2 ** 63, -2 ** 63) for delta in (-1, 0, 1)]))
json_scalars = st.one_of(st.none(), st.booleans(), integers, st.floats(), st.sampled_from([1.0, -2.0, 0.5]), texts)
#: Any JSON value: lists of pairs and strings too, which Arrow reads as structs and lists.
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.sampled_from(["headers", "data"]), texts), inner,
                                                 max_size=3)), max_leaves=8)


def fitting(kind: pa.DataType) -> st.SearchStrategy:
    """A JSON value of Arrow type ``kind``, nulls among its elements and fields."""
    if pa.types.is_string(kind):
        return texts
    if pa.types.is_integer(kind):
        bound = 1 << kind.bit_width - 1
        return st.integers(-bound, bound - 1)
    if pa.types.is_list(kind):
        return st.lists(st.one_of(st.none(), fitting(kind.value_type)), max_size=3)
    assert pa.types.is_struct(kind), kind
    return st.fixed_dictionaries({field.name: st.one_of(st.none(), fitting(field.type)) for field in kind})


def field_value(kind: pa.DataType) -> st.SearchStrategy:
    """A field's value: mostly of its type, else null or any JSON value (the wrong type, or one Arrow coerces)."""
    return st.one_of(fitting(kind), fitting(kind), st.none(), json_values)


#: JSON objects: any of the fields, extra ones (``request`` as the gateways write it, ``seq`` that a
#: record's position overrides).
objects = st.fixed_dictionaries({}, optional={
    **{field.name: field_value(field.type) for field in FIELDS},
    **{name: json_values for name in ("request", "keywords", "seq", "kafka_offset", "Type")}})

times = st.integers(US0, US0 + 10 ** 9)
headers = st.lists(st.tuples(names, names), max_size=3)
publishes = st.builds(
    ev.Publish, st.integers(1, 2 ** 62), st.sampled_from(["/t", "/t/x", "/é"]), names, names, names, times,
    st.integers(0, 9), headers, st.lists(st.builds(ev.Section, headers, st.binary(max_size=8)), max_size=2),
    st.one_of(st.none(), times), st.sampled_from(["none", "one", "all"]), st.sampled_from(["all", "one", "ALL"]),
    st.integers(-1, 5), st.lists(names, max_size=2), st.one_of(st.none(), names), st.one_of(st.none(), names))
#: The gateways' commands of every type the routing reads, ticks, and one it does not.
commands = st.one_of(
    publishes, publishes, st.builds(ev.Ack, names, names, st.integers(1, 2 ** 62), times),
    st.builds(ev.Subscribe, names, names, st.sampled_from(["/t", "/t/*"]), times, st.one_of(st.none(), times),
              st.none(), names),
    st.builds(ev.Nack, names, names, st.integers(1, 2 ** 62), times, st.integers(0, 9),
              st.sampled_from(["timeout", "disconnect"])),
    st.builds(ev.Tick, times), st.builds(ev.CreateTopic, names, names, st.just("/t"), times, st.lists(names)))


def escaped_json(value) -> bytes:
    """``value`` as JSON, non-ASCII characters escaped, as the gateways write it."""
    return json.dumps(value, separators=(",", ":")).encode()


def raw_json(value) -> bytes:
    """``value`` as JSON in UTF-8 (a lone surrogate as its three bytes: ``json.loads`` reads them back)."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


values = st.one_of(
    commands.map(ev._Event.to_bytes), commands.map(ev._Event.to_bytes), objects.map(escaped_json),
    objects.map(raw_json), st.one_of(json_scalars, st.lists(json_values, max_size=3)).map(escaped_json),  # no object
    st.binary(max_size=12), st.sampled_from([b"not json", b"", b"{", b"\xff{}", None]))


@st.composite
def record_tables(draw, values=values) -> pa.Table:
    """A batch's Kafka records (``KAFKA_RECORD`` columns, the timestamps in one zone or none), in one chunk or two."""
    rows = draw(st.lists(st.tuples(values, st.integers(0, 3), st.integers(0, 2 ** 40),
                                   st.one_of(st.none(), st.integers(-10 ** 15, 4 * 10 ** 15))), max_size=12))
    table = pa.Table.from_pylist(
        [{"key": None, "value": value, "topic": "cmd", "partition": partition, "offset": offset,
          "timestamp": stamp, "timestampType": 0} for value, partition, offset, stamp in rows],
        schema=arrow_schema(KAFKA_RECORD))
    zone = draw(st.sampled_from(["UTC", "Etc/UTC", "Europe/Paris", None]))
    table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp",
                             table.column("timestamp").cast(pa.timestamp("us", zone)))
    split = draw(st.integers(0, table.num_rows))
    return pa.concat_tables([table.slice(0, split), table.slice(split)])


def outcome(decode, records: pa.Table):
    """What ``decode(records)`` gives, in a form that tells types and key order apart (neither raises:
    a record that fits no event, a lone surrogate too, is all null)."""
    events = decode(records)
    return events, repr(events)


def arrow_rows(records: pa.Table) -> list[dict]:
    return decode_records(records).to_pylist()


def decoded(records: pa.Table) -> tuple[object, bool]:
    """:func:`outcome` of ``decoded_events(records)``, and whether it went through Arrow."""
    through, events_table = [], decoding._events_table
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoding, "_events_table", lambda *args: through.append(True) or events_table(*args))
        return outcome(decoded_events, records), bool(through)


@given(record_tables())
def test_the_decoded_events_are_the_arrow_tables_rows(records):
    events, through_arrow = decoded(records)
    event("through Arrow" if through_arrow else "as decoded")
    assert events == outcome(arrow_rows, records)


@given(record_tables(values=commands.map(ev._Event.to_bytes)))
def test_the_gateways_commands_are_kept_as_decoded(records):
    """The common case, fast: every field of the gateways' commands already is its type's value."""
    events, through_arrow = decoded(records)
    assert not through_arrow
    assert events == outcome(arrow_rows, records)


PUBLISH = ev.Publish(1, "/t", "c", "ann", "g", US0, 3, [("A", "b")], [ev.Section([("C", "d")], b"x")], hops=["h"])


@pytest.mark.parametrize("value", [
    b'{"type":"ack","smuid":1.0}', b'{"type":"ack","smuid":1.5}',  # Arrow makes them 1
    b'{"type":"ack","smuid":true}', b'{"smuid":9223372036854775808}', b'{"smuid":-9223372036854775809}',
    b'{"priority":2147483648}', b'{"depth":-2147483649}', b'{"smuid":-9223372036854775808,"depth":-2147483648}',
    b'{"hops":"ab"}', b'{"headers":["ab"]}',  # Arrow reads a string as a list
    b'{"sections":[[["headers",[["a","b"]]],["data","x"]]]}',  # and pairs as a struct
    b'{"sections":[{"data":"x","headers":[]}]}', b'{"sections":[{"data":"x"}]}',  # another order, a field missing
    b'{"sections":[{"headers":[],"data":"x","more":1}]}', b'{"sections":{"headers":[]}}',
    b'{"topic":"\\ud800"}', b'{"headers":[["\\udc00"]]}',  # no UTF-8: Arrow fails, the record is all null
    b'[1]', b'"publish"', b'null', b'not json', None,
], ids=repr)
def test_a_batch_with_an_odd_record_decodes_as_arrow_does(value):
    records = pa.Table.from_pylist(
        [{"value": value, "partition": 0, "offset": 1, "timestamp": US0},
         {"value": PUBLISH.to_bytes(), "partition": 1, "offset": 2, "timestamp": None}], arrow_schema(KAFKA_RECORD))
    assert decoded(records)[0] == outcome(arrow_rows, records)
