"""The asyncio SMQP gateway: sockets, timers and Kafka around the sans-I/O core (:mod:`gateway.protocol`).

Where things live:

* :mod:`~gateway.server.main` — ``smqp-gateway``: configuration, signals, the process.
* :mod:`~gateway.server.gateway` — :class:`Gateway`, wiring the parts below: listeners, sessions,
  Kafka clients, the registry and the delivery book.
* :mod:`~gateway.server.connection` — one client connection: the pump from socket to session and
  back, replies in command order, bounds on slow clients; :mod:`~gateway.server.notifying` — its
  NOTIFY MESSAGEs, ACKs and retries; :mod:`~gateway.server.notify_channel` — SET NOTIFY PORT;
  :mod:`~gateway.server.tls` — SMQPS; :mod:`~gateway.server.remote` — the check a remote virtual
  topic's CREATE makes with the farm it links to.
* :mod:`~gateway.server.fold` — the control log folded into the registry, and the early routing
  of DELIVERY ALL publishes from it; :mod:`~gateway.server.deliveries` — the tail of the job's
  deliveries; :mod:`~gateway.server.book` — each account's pending deliveries;
  :mod:`~gateway.server.handon` with :mod:`~gateway.server.presence` — DELIVERY ONE handed on
  between gateways; :mod:`~gateway.server.shutdown` — closing, planned or not.
* :mod:`~gateway.server.feeds` — what the gateway appends to and reads from Kafka, in SMQP's terms;
  :mod:`~gateway.server.message_store` — the Delta tables read for COUNT, LIST and GET MESSAGE.
"""
