"""What the gateway's tails make of each record before the loop sees it (gateway.server.feeds)."""

from __future__ import annotations

from gateway.server.feeds import RawDeliver, RawPublish, control_item, delivery_item
from schemas.events import Ack, Acked, Deliver, Publish, Section, Subscribe, Tick, decode


def test_a_deliver_is_read_off_its_key_and_json_start_and_decoded_only_on_demand():
    deliver = Deliver("bsub0", 1234567890123, "/a/b", "c1", "pub", "g", 7, 5, [("Name", "x")],
                      [Section([], b"hello")])
    item = delivery_item(42, b"bsub0", deliver.to_bytes())
    assert item == RawDeliver("bsub0", 1234567890123, deliver.to_bytes())
    assert decode(item.value) == deliver


def test_a_deliver_written_by_the_job_spark_to_json_is_read_the_same_way():
    """The job writes Deliver records with Spark's to_json (no spaces, fields in Deliver's order)."""
    value = (b'{"type":"deliver","account":"bob","smuid":99,"topic":"/a","cmuid":"","publisher":"p",'
             b'"publisher_guid":"g","accepted_at":1,"priority":0,"headers":[],"sections":[],"delivery":"all"}')
    assert delivery_item(0, b"bob", value) == RawDeliver("bob", 99, value)


def test_other_deliveries_records_are_decoded_and_garbage_is_dropped():
    assert delivery_item(0, b"bob", Acked("bob", 3).to_bytes()) == Acked("bob", 3)
    assert delivery_item(0, b"bob", b"not json") is None


def test_the_control_tail_hands_publishes_on_raw_skips_acks_and_ticks_and_decodes_the_rest():
    publish = Publish(1, "/a/b", "c", "pub", "g", 5)
    assert control_item(3, b"/a/b", publish.to_bytes()) == (3, RawPublish("/a/b", publish.to_bytes()))
    # dropped by the tail: half the partition's records in a drain (no fold waits on their offsets)
    assert control_item(4, b"bob", Ack("bob", "g", 1, 5).to_bytes()) is None
    assert control_item(5, None, Tick(9).to_bytes()) is None
    subscribe = Subscribe("bob", "g", "/a/*", 5)
    assert control_item(6, None, subscribe.to_bytes()) == (6, subscribe)
    assert control_item(7, None, b"{broken") == (7, None)  # skipped, but the fold knows it got past it
