"""One TCP connection to one Kafka broker, in the event loop: requests written, responses matched.

Frames written and read here, over an asyncio transport: no client threads (see the package's
docstring for why).  The requests sent for each message are written by :mod:`kafka_edge.wire`;
the rest (metadata, offsets, versions) are kafka-python's request and response classes.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from functools import partial

import kafka.errors as Errors
from kafka.protocol.broker_version_data import BrokerVersionData
from kafka.protocol.metadata import ApiVersionsRequest

from kafka_edge.wire import Encoded, request_header

#: Longest pause between attempts to reach an unreachable broker: a client has a handful of
#: connections, and retrying each every second at most lets it recover within a second of Kafka.
RECONNECT_BACKOFF_MAX_S = 1.0
RECONNECT_BACKOFF_S = 0.05
#: The largest response frame a connection takes (kafka-python's limit too).
MAX_FRAME_BYTES = 100_000_000
_SIZE = struct.Struct(">i")


class KafkaUnavailable(Errors.KafkaConnectionError):
    """No broker could be reached, or the connection broke before the answer came."""


class BrokerConnection(asyncio.Protocol):
    """One TCP connection to a broker: requests written, answers matched by correlation id.  A
    broken connection, or an answer it cannot read, fails every request awaiting an answer."""

    def __init__(self, client_id: str):
        self._client_id = client_id
        self._client_id_bytes = client_id.encode()
        self._correlation_id = 0
        self._waiting: dict[int, tuple[asyncio.Future, object]] = {}  # correlation id → (waiter, reader)
        # (deadline, correlation id) of the requests awaiting an answer, oldest first: the broker
        # answers in order, so only the oldest one's deadline can pass first (one timer, not one each)
        self._deadlines: deque[tuple[float, int]] = deque()
        self._watch: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._inbox = bytearray()
        self._versions: BrokerVersionData | None = None
        self.closed = False

    @classmethod
    async def open(cls, host: str, port: int, client_id: str, timeout: float) -> BrokerConnection:
        """Connect and learn the request versions the broker speaks (ApiVersions v0, which every
        broker answers)."""
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: cls(client_id), host, port), timeout)
        except (OSError, asyncio.TimeoutError) as error:
            raise KafkaUnavailable(f"cannot connect to Kafka at {host}:{port}: {error or 'timed out'}") from None
        versions = await connection.call(ApiVersionsRequest(version=0), timeout)
        connection._versions = BrokerVersionData(api_versions={
            key.api_key: (key.min_version, key.max_version) for key in versions.api_keys})
        return connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        inbox = self._inbox
        inbox += data
        while len(inbox) >= 4 and not self.closed:
            (size,) = _SIZE.unpack_from(inbox)
            if not 4 <= size <= MAX_FRAME_BYTES:
                self._fail(KafkaUnavailable(f"bad response from Kafka: a frame of {size} bytes"))
                return
            if len(inbox) < 4 + size:
                return
            with memoryview(inbox) as view:  # one copy of a fetch's megabytes, not two
                frame = bytes(view[4:4 + size])
            del inbox[:4 + size]
            self._answer(frame)

    def _answer(self, frame: bytes) -> None:
        """Hand a response frame to the request it answers (its correlation id comes first)."""
        (correlation_id,) = _SIZE.unpack_from(frame)
        waiting = self._waiting.pop(correlation_id, None)
        if waiting is None:
            self._fail(KafkaUnavailable(f"bad response from Kafka: an answer to no request ({correlation_id})"))
            return
        waiter, read = waiting
        try:
            response = read(frame)
        except (ValueError, IndexError, struct.error, Errors.KafkaError) as error:
            self._waiting[correlation_id] = waiting  # failed below with the others
            self._fail(KafkaUnavailable(f"bad response from Kafka: {error!r}"))
            return
        if not waiter.done():
            waiter.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(KafkaUnavailable(f"connection to Kafka lost{f': {exc}' if exc else ''}"))

    def _fail(self, error: Exception) -> None:
        self.closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._deadlines.clear()
        waiting, self._waiting = self._waiting, {}
        for waiter, _ in waiting.values():
            if not waiter.done():
                waiter.set_exception(error)
        if self._transport is not None:
            self._transport.close()

    def close(self) -> None:
        self._fail(KafkaUnavailable("connection closed"))

    def call(self, request, timeout: float) -> asyncio.Future:
        """Send ``request`` (an :class:`~kafka_edge.wire.Encoded` one, or kafka-python's); the future
        resolves to its answer.  An answer that does not come within ``timeout`` closes the
        connection (the next one would be out of step)."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        if self.closed:
            waiter.set_exception(KafkaUnavailable("connection closed"))
            return waiter
        self._correlation_id = correlation_id = (self._correlation_id + 1) % 2**31
        try:
            frame, read = self._frame(request, correlation_id)
        except Errors.UnsupportedVersionError as error:
            waiter.set_exception(error)
            return waiter
        if read is not None:
            self._waiting[correlation_id] = (waiter, read)
            self._deadlines.append((loop.time() + timeout, correlation_id))
            if self._watch is None:
                self._watch = loop.call_at(self._deadlines[0][0], self._check_deadlines)
        else:
            waiter.set_result(None)
        self._transport.write(_SIZE.pack(len(frame)) + frame)
        return waiter

    def _frame(self, request, correlation_id: int) -> tuple[bytes, object]:
        """``request``'s header and body, and what reads its answer (None: it expects none)."""
        if isinstance(request, Encoded):
            spoken = {} if self._versions is None else self._versions.api_versions
            low, high = spoken.get(request.api_key, (request.version, request.version))
            if not low <= request.version <= high:
                raise Errors.UnsupportedVersionError(
                    f"this Kafka broker speaks versions {low}-{high} of API {request.api_key}, not "
                    f"{request.version}: the engine needs Apache Kafka 2.8 or later")
            return (request_header(request.api_key, request.version, correlation_id, self._client_id_bytes,
                                   request.flexible) + request.body, request.read)
        if self._versions is not None and request.API_VERSION is None:
            request.API_VERSION = self._versions.api_version(request)
        request.with_header(correlation_id=correlation_id, client_id=self._client_id)
        frame = request.encode(header=True)
        if not request.expect_response():
            return frame, None
        return frame, partial(_read_with, request.header.get_response_class())

    def _check_deadlines(self) -> None:
        """The oldest request's deadline came: close if it is still unanswered, else look again
        at the next one's."""
        self._watch = None
        loop = asyncio.get_running_loop()
        while self._deadlines and self._deadlines[0][1] not in self._waiting:
            self._deadlines.popleft()
        if not self._deadlines:
            return
        deadline, _ = self._deadlines[0]
        if deadline <= loop.time():
            self._fail(KafkaUnavailable("no answer from Kafka in time"))
        else:
            self._watch = loop.call_at(deadline, self._check_deadlines)



def _read_with(response_class, frame: bytes):
    """kafka-python's reading of a response frame, header included."""
    return response_class.decode(frame, header=True)


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` (a bootstrap address) as a pair; the port defaults to 9092."""
    host, _, port = address.strip().rpartition(":")
    return host or "127.0.0.1", int(port or 9092)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): doubling, at most
    :data:`RECONNECT_BACKOFF_MAX_S`."""
    return min(RECONNECT_BACKOFF_MAX_S, RECONNECT_BACKOFF_S * (2 ** min(attempt, 10)))
