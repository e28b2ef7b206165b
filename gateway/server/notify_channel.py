"""SET NOTIFY PORT: the server's connection to a client's listener, for NOTIFYs and their ACKs."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from gateway.protocol.actions import Durable, Send

if TYPE_CHECKING:  # annotations only: that module imports this one
    from gateway.server.connection import Connection

log = logging.getLogger("smqp.gateway")


class NotifyChannel:
    """SET NOTIFY PORT: the server's connection to the client's listener.

    NOTIFY frames are written here; the client's ``310 ACK`` is read here and
    answered here once durable, like on the session connection.
    """

    def __init__(self, connection: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connection = connection
        self.reader = reader
        self.writer = writer
        self.task = asyncio.create_task(self._read_acks())

    def write(self, data: bytes) -> None:
        gateway = self.connection.gateway
        unread = self.writer.transport.get_write_buffer_size()
        if unread and unread + len(data) > gateway.config.gateway.max_buffered_bytes:
            log.warning("closing the notification port of %s: %d bytes unread", self.connection.session.account,
                        unread)
            gateway.metrics.slow_clients_closed.inc("overflow")
            self.writer.transport.abort()  # the read task ends and gives the NOTIFY in flight back
            return
        if not self.writer.transport.is_closing():
            gateway.metrics.frame_out(data)
            self.writer.write(data)
            gateway.metrics.buffered(unread + len(data))

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()

    async def _read_acks(self) -> None:
        connection = self.connection
        try:
            while line := await self.reader.readline():
                for action in connection.session.channel_ack(line.rstrip(b"\r\n")):
                    if isinstance(action, Durable):
                        pending = connection._make_durable(action, awaited_alone=True)
                        self.write(await connection._settle(pending))
                        if not connection._ack_settled(pending.ack):
                            return
                    elif isinstance(action, Send):
                        self.write(action.data)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writer.close()
            connection.channel_lost(self)
