"""The SMQP protocol core, sans-I/O: bytes in, actions out (like h11).

Nothing here touches a socket, a timer or Kafka; the asyncio edge (:mod:`gateway.server`) feeds a
:class:`~gateway.protocol.session.Session` the bytes it reads and carries out the actions it returns.

Where things live:

* :mod:`~gateway.protocol.framing` — bytes to lines, headers and message bodies; the one framing
  rule, shared with the reference client (:mod:`gateway.client`).
* :mod:`~gateway.protocol.session` — the state machine: login phase, dispatch of each command
  line to its ``smqp_<VERB>`` handler, NOTIFY bookkeeping, and the access checks every verb shares.
* one module per verb family, each a mixin of the session: :mod:`~gateway.protocol.login`,
  :mod:`~gateway.protocol.reading` (COUNT, LIST, FIND, GET), :mod:`~gateway.protocol.topics`
  (CREATE, REMOVE), :mod:`~gateway.protocol.settings` (SET), :mod:`~gateway.protocol.publishing`
  (PUB), :mod:`~gateway.protocol.subscriptions` (SUB, UNSUB, ACK), :mod:`~gateway.protocol.linking`
  (CONNECTTO).
* :mod:`~gateway.protocol.vocabulary` — verbs and keywords; :mod:`~gateway.protocol.state` — the
  session's phase and an open PUBLISH.
* :mod:`~gateway.protocol.actions` — what a session returns for the I/O layer to do.
* :mod:`~gateway.protocol.rendering` — NOTIFY frames and stored messages as bytes.
* :mod:`~gateway.protocol.headers` and :mod:`~gateway.protocol.arguments` — checking and reading
  message headers and command arguments.

Reply codes are named in :mod:`gateway.replies`.
"""
