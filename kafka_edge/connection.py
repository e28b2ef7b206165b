"""One TCP connection to one Kafka broker, in the event loop: requests written, responses matched.

Built on kafka-python's sans-I/O protocol layer (its request and response classes and
``KafkaProtocol`` framing) over an asyncio transport: no client threads (see the package's
docstring for why).
"""

from __future__ import annotations

import asyncio
from collections import deque

import kafka.errors as Errors
from kafka.protocol.broker_version_data import BrokerVersionData
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.parser import KafkaProtocol

#: Longest pause between attempts to reach an unreachable broker: a client has a handful of
#: connections, and retrying each every second at most lets it recover within a second of Kafka.
RECONNECT_BACKOFF_MAX_S = 1.0
RECONNECT_BACKOFF_S = 0.05


class KafkaUnavailable(Errors.KafkaConnectionError):
    """No broker could be reached, or the connection broke before the answer came."""


class BrokerConnection(asyncio.Protocol):
    """One TCP connection to a broker: requests written, responses matched in order
    (``KafkaProtocol``).  A broken connection fails every request awaiting an answer."""

    def __init__(self, client_id: str):
        self._protocol = KafkaProtocol(client_id=client_id)
        self._waiting: dict[int, asyncio.Future] = {}
        # (deadline, correlation id) of the requests awaiting an answer, oldest first: the broker
        # answers in order, so only the oldest one's deadline can pass first (one timer, not one each)
        self._deadlines: deque[tuple[float, int]] = deque()
        self._watch: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._versions: BrokerVersionData | None = None
        self.closed = False

    @classmethod
    async def open(cls, host: str, port: int, client_id: str, timeout: float) -> BrokerConnection:
        """Connect and agree on request versions (ApiVersions v0, which every broker answers)."""
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
        try:
            responses = self._protocol.receive_bytes(data)
        except Errors.KafkaError as error:
            self._fail(KafkaUnavailable(f"bad response from Kafka: {error}"))
            return
        for correlation_id, response in responses:
            waiter = self._waiting.pop(correlation_id, None)
            if waiter is not None and not waiter.done():
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
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(error)
        if self._transport is not None:
            self._transport.close()

    def close(self) -> None:
        self._fail(KafkaUnavailable("connection closed"))

    def call(self, request, timeout: float) -> asyncio.Future:
        """Send ``request``; the future resolves to its response.  A response that does not come
        within ``timeout`` closes the connection (the next one would be out of step)."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        if self.closed:
            waiter.set_exception(KafkaUnavailable("connection closed"))
            return waiter
        if self._versions is not None and request.API_VERSION is None:
            request.API_VERSION = self._versions.api_version(request)
        correlation_id = self._protocol.send_request(request)
        if request.expect_response():
            self._waiting[correlation_id] = waiter
            self._deadlines.append((loop.time() + timeout, correlation_id))
            if self._watch is None:
                self._watch = loop.call_at(self._deadlines[0][0], self._check_deadlines)
        else:
            waiter.set_result(None)
        self._transport.write(self._protocol.send_bytes())
        return waiter

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



def host_port(address: str) -> tuple[str, int]:
    """``host:port`` (a bootstrap address) as a pair; the port defaults to 9092."""
    host, _, port = address.strip().rpartition(":")
    return host or "127.0.0.1", int(port or 9092)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): doubling, at most
    :data:`RECONNECT_BACKOFF_MAX_S`."""
    return min(RECONNECT_BACKOFF_MAX_S, RECONNECT_BACKOFF_S * (2 ** min(attempt, 10)))
