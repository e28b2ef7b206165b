"""The reference SMQP client: an asyncio library and the ``smqp`` command, apart from the server.

It shares the server's framing rule (:mod:`gateway.protocol.framing`) and nothing else of it.

* :mod:`~gateway.client.smqp_client` — :class:`SMQPClient`, a typed method per command;
* :mod:`~gateway.client.messages` — what it hands back: :class:`Message`, :class:`Notification`,
  and :class:`SMQPError` for a refusal;
* :mod:`~gateway.client.channel` — one connection: replies matched to requests, NOTIFYs set aside;
* :mod:`~gateway.client.wire` — sans-I/O: server bytes to frames, commands to bytes;
* :mod:`~gateway.client.cli` — the ``smqp`` command line.
"""

from gateway.client.messages import LOGIN_ATTRIBUTES, Message, Notification, SMQPError, SMQPRedirect
from gateway.client.smqp_client import SMQPClient

__all__ = ["LOGIN_ATTRIBUTES", "Message", "Notification", "SMQPClient", "SMQPError", "SMQPRedirect"]
