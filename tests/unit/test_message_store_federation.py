"""A forwarded message's route read back from the ``messages`` table (issue 33): GET MESSAGE shows it
as NOTIFY did.  A table written before the job had these columns reads as local messages."""

from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake

from schemas.spark import MESSAGES_TABLE, arrow_schema
from tests.unit.test_message_store import ACCEPTED, row, store

FEDERATION_FIELDS = [pa.field("depth", pa.int32()), pa.field("hops", pa.list_(pa.string())),
                     pa.field("origin", pa.string()), pa.field("origin_topic", pa.string())]


def test_a_forwarded_messages_route_is_read_with_it(tmp_path):
    schema = arrow_schema(MESSAGES_TABLE)
    schema = pa.schema([*schema, *[f for f in FEDERATION_FIELDS if f.name not in schema.names]])
    forwarded = {**row(7, "/quotes/ibm"), "depth": 0, "hops": ["b.example"], "origin": "b.example/77",
                 "origin_topic": "b.example/stocks/ibm"}
    local = {**row(8, "/quotes/ibm"), "depth": 2, "hops": [], "origin": None, "origin_topic": None}
    write_deltalake(str(tmp_path / "messages"), pa.Table.from_pylist([forwarded, local], schema=schema))
    first, second = store(tmp_path).messages("/quotes/ibm")
    assert (first.depth, first.hops, first.origin, first.origin_topic) == (
        0, ("b.example",), "b.example/77", "b.example/stocks/ibm")
    assert (second.depth, second.hops, second.origin, second.origin_topic) == (2, (), None, None)
    assert store(tmp_path).messages("/quotes/ibm", now=ACCEPTED)[0].origin == "b.example/77"  # live ones too
    deliver = first.to_deliver("bob")
    assert (deliver.hops, deliver.origin, deliver.origin_topic) == (["b.example"], "b.example/77",
                                                                    "b.example/stocks/ibm")
