"""The foreachBatch sink: route one micro-batch, emit to Kafka, commit to Delta (:class:`CommandSink`).

Where things live:

* :mod:`~streaming.sink.command_sink` — :class:`CommandSink`: a batch's flow (read, route, emit,
  commit, announce) and its Kafka records; the order that makes a replay safe is its docstring.
* :mod:`~streaming.sink.records` — what the batch's Kafka records say, read cheaply before routing;
  :mod:`~streaming.sink.decoding` — the records as the routing query's events, in log order.
* :mod:`~streaming.sink.query` — the routing transforms as one query in three parts, and its outputs.
* :mod:`~streaming.sink.tables` — the Delta tables, open, and what each last committed;
  :mod:`~streaming.sink.reads` — the stored state a batch reads before routing;
  :mod:`~streaming.sink.recent` — the messages expiring soon, kept from their commit;
  :mod:`~streaming.sink.commits` — the idempotent Delta commits.
* :mod:`~streaming.sink.holders` — DELIVERY ONE's in-flight limit: who holds what.
"""

from streaming.sink.command_sink import CommandSink

__all__ = ["CommandSink"]
