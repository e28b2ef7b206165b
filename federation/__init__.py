"""Linked SMQP farms (spec 2.3): the ``smqp-link`` process of one farm.

- :mod:`~federation.inbound` — a peer's NOTIFY MESSAGE read, dropped or made a ``Publish`` (pure);
- :mod:`~federation.seen` — the dedup set, rebuilt from this farm's commands topic;
- :mod:`~federation.interest` — what to hold on each peer, from the folded registry;
- :mod:`~federation.link` — one login at a peer: subscriptions, NOTIFYs, ACKs, backoff;
- :mod:`~federation.forwarder` — the durable append here, before the ACK there;
- :mod:`~federation.process`, :mod:`~federation.main` — the process and its command;
- :mod:`~federation.metrics` — ``/metrics`` on ``[federation] status_port``.
"""
