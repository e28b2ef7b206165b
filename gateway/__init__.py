"""The SMQP gateway and its reference client.

* :mod:`gateway.protocol` — the sans-I/O protocol core: framing, the session state machine, one
  module per verb family; reply codes are named in :mod:`gateway.replies`.
* :mod:`gateway.server` — the asyncio edge: sockets, timers, Kafka appends and tails, the
  registry fold and early routing, the delivery book.
* :mod:`gateway.registry`, :mod:`gateway.accounts`, :mod:`gateway.ual`, :mod:`gateway.scram` —
  the farm's state as every gateway folds it, logins and access lists.
* :mod:`gateway.client` — the reference client library and the ``smqp`` command.
"""
