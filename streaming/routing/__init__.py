"""All routing logic, as pure ``DataFrame -> DataFrame`` transforms.

Nothing here reads a source, writes a sink or touches the session: every
function takes frames (and plain values) and returns a frame, so the tests run
them unchanged on literal rows.  The sink (:mod:`streaming.sink`) wires them
together once per micro-batch::

    records ──parse_commands──▶ events ──┬─ subscription_intervals(current subscriptions)
                                         │        │
                                         ├────────┴─ route ──▶ deliveries ──unacknowledged──▶ deliver_records
                                         ├─ extract_acks ──▶ acks ──▶ acked_records
                                         └─ message_rows ──▶ messages
    intervals ──subscription_state──▶ subscriptions (merge)
    deliveries + acks ──delivery_updates──▶ deliveries (merge)

Ordering: every command carries ``seq = struct(timestamp, partition, offset)``
of its Kafka record.  With one commands partition (the default) that is the
log order; across partitions it falls back to Kafka timestamp order.  A
publish is routed to a subscription iff ``from_seq < seq < to_seq`` where a
null bound is open (``from_seq`` null: subscribed before this batch;
``to_seq`` null: still subscribed at the end of the batch), and its
``accepted_at`` lies in the interval's SINCE/UNTIL window.  A publish to an
account topic ``/accounts/<name>`` also reaches ``<name>``, subscribed or not.

Every transform is written once, as Spark SQL text: ``<name>_sql(...)``
returns the ``SELECT`` of that transform over the relations (view or CTE
names) it is given.  The public function registers its input frames as
temporary views and runs that text; the sink composes the same texts into one
``WITH … SELECT`` per micro-batch, run in three parts (``streaming.sink.query.stages``).
A plan built from SQL text costs a few
py4j calls, where the same plan built column by column costs thousands
(~110 µs each), which dominated a micro-batch.

Where things live (each transform next to its ``*_sql`` text):

* :mod:`~streaming.routing.frames` — the types of the intermediate frames;
  :mod:`~streaming.routing.sql` — literals, :func:`run_sql` and the fragments every transform uses.
* :mod:`~streaming.routing.commands` — records parsed into events, ACKs, ``messages`` rows, what is settled;
  :mod:`~streaming.routing.subscriptions` — subscription intervals and the ``subscriptions`` rows.
* :mod:`~streaming.routing.route` — publishes to subscribers (and to nobody: ``unrouted``);
  :mod:`~streaming.routing.federation` — which subscribers a peer farm's link may be;
  :mod:`~streaming.routing.late` — late subscribers; :mod:`~streaming.routing.clearing` — SINCE.
* :mod:`~streaming.routing.expiry` — expiry and the Trash; :mod:`~streaming.routing.retries` — NACKs,
  retries and DELIVERY ONE hand-on; :mod:`~streaming.routing.receipts` — RECEIPT ONE / ALL.
* :mod:`~streaming.routing.delivery_updates` — the ``deliveries`` merge source;
  :mod:`~streaming.routing.records` — the ``smqp.deliveries`` records.

This package re-exports the transforms and their frame types (what the tests run on literal rows);
the ``*_sql`` texts the sink composes are imported from their own modules.
"""

from streaming.routing.clearing import cleared, withheld
from streaming.routing.commands import extract_acks, message_rows, parse_commands, settled
from streaming.routing.delivery_updates import delivery_updates
from streaming.routing.expiry import dead_messages, expiring, live, trash
from streaming.routing.federation import NO_PEERS
from streaming.routing.frames import (
    ACKS,
    CLEARABLE,
    CLEARED,
    DEAD,
    DELIVERIES,
    EVENTS,
    EXPIRING,
    HELD,
    INTERVALS,
    KAFKA_OUT,
    NOBODY_UPDATES,
    ORPHANED,
    PENDING,
    RECEIPT_MESSAGES,
    RECEIPT_STATE,
    RECEIPTS_DUE,
    RELEASED,
    RETRIED,
    RETRYING,
    SEQ,
)
from streaming.routing.late import late
from streaming.routing.receipts import receipt_messages, receipts_due
from streaming.routing.records import acked_records, deliver_records, expired_records, unacknowledged
from streaming.routing.retries import released, retried
from streaming.routing.route import candidate_patterns, route, unrouted
from streaming.routing.subscriptions import subscription_intervals, subscription_state

__all__ = [
    # the transforms, in the order a batch runs them
    "parse_commands", "subscription_intervals", "route", "unrouted", "late", "withheld", "extract_acks",
    "expiring", "live", "unacknowledged", "settled", "retried", "released", "cleared", "dead_messages", "trash",
    "receipts_due", "receipt_messages", "message_rows", "delivery_updates", "subscription_state",
    "deliver_records", "acked_records", "expired_records", "candidate_patterns",
    # their frames
    "SEQ", "EVENTS", "INTERVALS", "DELIVERIES", "ACKS", "PENDING", "RETRYING", "NOBODY_UPDATES", "RELEASED",
    "RETRIED", "DEAD", "EXPIRING", "KAFKA_OUT", "HELD", "CLEARABLE", "CLEARED", "ORPHANED", "RECEIPT_STATE",
    "RECEIPTS_DUE", "RECEIPT_MESSAGES",
    "NO_PEERS",
]
