"""A TCP proxy in front of a Kafka node whose connections can be cut and restored (test helper).

It makes the one fault a broker's own death cannot: Kafka unreachable for some clients (the
gateway) while others (the streaming job) go on, as a network partition does.  The broker
advertises the proxy's
address, so every client reaches it through here; each connection is named by the client id in
its first Kafka request (the request header's nullable string, the same in every header
version), and :meth:`KafkaProxy.cut` severs the connections of the clients whose id starts with a
prefix (e.g. the gateway's) and refuses their new ones until :meth:`KafkaProxy.restore`, while
other clients (the streaming job) go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from concurrent.futures import Future

from deploy.broker import free_port


def client_id(request: bytes) -> str:
    """The client id of a Kafka request (after its 4-byte size): api key, api version and
    correlation id, then an int16-length string."""
    (length,) = struct.unpack_from(">h", request, 8)
    return "" if length < 0 else request[10:10 + length].decode("utf-8", "replace")


class KafkaProxy:
    """Listens on ``127.0.0.1:port`` and forwards to ``127.0.0.1:target_port``, on its own loop and thread."""

    def __init__(self, target_port: int, port: int | None = None):
        self.target_port = target_port
        self.port = port or free_port()
        self.cut_prefix: str | None = None
        self.refused = 0  # connections refused while cut
        self._links: set[tuple[str, asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kafka-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> KafkaProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def __exit__(self, *exc) -> None:
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def cut(self, prefix: str) -> None:
        """Sever every connection of a client whose id starts with ``prefix``; refuse new ones
        (after their first request, which names them)."""
        self._call(self._cut(prefix))

    def stop_listening(self) -> None:
        """As if the broker were down for everyone: sever every connection, refuse new ones at connect."""
        self._call(self._stop())

    def restore(self) -> None:
        self._call(self._restore())

    def _call(self, coroutine):
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for _, downstream, upstream in list(self._links):
            downstream.transport.abort()
            upstream.transport.abort()

    async def _cut(self, prefix: str) -> None:
        self.cut_prefix = prefix
        for link in list(self._links):
            if link[0].startswith(prefix):
                link[1].transport.abort()
                link[2].transport.abort()

    async def _restore(self) -> None:
        self.cut_prefix = None
        if self._server is None:
            await self._start()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readexactly(4)
            request = await reader.readexactly(struct.unpack(">i", head)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.transport.abort()
            return
        name = client_id(request)
        if self.cut_prefix is not None and name.startswith(self.cut_prefix):
            self.refused += 1
            writer.transport.abort()  # as if the broker were gone
            return
        try:
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        upstream.write(head + request)
        link = (name, writer, upstream)
        self._links.add(link)
        try:
            await asyncio.gather(_pipe(reader, upstream), _pipe(upstream_reader, writer))
        finally:
            self._links.discard(link)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either side ends, then end the other."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.transport.abort()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
