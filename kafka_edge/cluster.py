"""What a client knows of the Kafka cluster: each partition's leader, and its connections.

One connection per (broker, purpose): appends and each tail on their own, so a fetch held by
the broker never delays an append's answer behind it.  Leaders are learnt from Metadata
requests, for the topics the client has asked about, and again whenever a request finds one
moved.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import kafka.errors as Errors
from kafka.protocol.metadata import MetadataRequest

from kafka_edge.connection import BrokerConnection, KafkaUnavailable, host_port
from kafka_edge.settings import ClientSettings

#: The highest Metadata version used: the last one naming topics by name (later ones use topic ids).
METADATA_VERSION = 8


@dataclass
class _Leaders:
    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)
    partitions: dict[str, dict[int, int]] = field(default_factory=dict)  # topic -> partition -> leader node


class Cluster:
    """Leaders and connections of the cluster at ``settings.bootstrap``."""

    def __init__(self, settings: ClientSettings, client_id: str):
        self._client_id = client_id
        self._bootstrap = [host_port(address) for address in settings.bootstrap.split(",") if address.strip()]
        self._leaders = _Leaders()
        self._topics: set[str] = set()  # whose leaders a refresh asks for: every topic asked about
        # (broker, purpose) -> its connection, or the future of the attempt to open it
        self._connections: dict[tuple[int | str, str], BrokerConnection | asyncio.Future] = {}
        self._refreshing: asyncio.Future | None = None
        self._refreshing_for: frozenset[str] = frozenset()
        self.request_timeout = min(5.0, settings.delivery_timeout_ms / 1000)

    async def partitions(self, topic: str) -> list[int]:
        """The partitions of ``topic``, sorted (asks the cluster the first time)."""
        if topic not in self._leaders.partitions:
            await self._learn(topic)
        found = self._leaders.partitions.get(topic)
        if not found:
            raise Errors.UnknownTopicOrPartitionError(f"Kafka topic {topic!r} not found")
        return sorted(found)

    async def leader(self, topic: str, partition: int, purpose: str) -> BrokerConnection:
        """A connection to the leader of ``topic``/``partition`` for ``purpose``."""
        node = self._leaders.partitions.get(topic, {}).get(partition)
        if node is None or node not in self._leaders.brokers:
            await self._learn(topic)
            node = self._leaders.partitions.get(topic, {}).get(partition)
            if node is None or node not in self._leaders.brokers:
                raise Errors.LeaderNotAvailableError(f"no leader for {topic}/{partition}")
        return await self._connection(node, self._leaders.brokers[node], purpose)

    async def leader_node(self, topic: str, partition: int) -> int | None:
        if topic not in self._leaders.partitions:
            await self._learn(topic)
        return self._leaders.partitions.get(topic, {}).get(partition)

    async def _learn(self, topic: str) -> None:
        self._topics.add(topic)
        await self.refresh()

    async def _connection(self, key: int | str, address: tuple[str, int], purpose: str) -> BrokerConnection:
        """The open connection for ``purpose`` to broker ``key``; one attempt to open it at a time,
        shared by every caller that asks meanwhile."""
        connection = self._connections.get((key, purpose))
        if isinstance(connection, BrokerConnection) and not connection.closed:
            return connection
        if not isinstance(connection, asyncio.Future):
            connection = self._connections[(key, purpose)] = asyncio.ensure_future(
                BrokerConnection.open(*address, self._client_id, self.request_timeout))
        opening = connection
        try:
            opened = await asyncio.shield(opening)
        except BaseException:
            if self._connections.get((key, purpose)) is opening:
                del self._connections[(key, purpose)]
            raise
        if self._connections.get((key, purpose)) is opening:
            self._connections[(key, purpose)] = opened
        return opened

    async def refresh(self) -> None:
        """Ask a broker (a known one, else a bootstrap address) for the leaders of the topics asked
        about; one refresh at a time, which every caller that asks meanwhile shares (and one more
        if a topic was asked about after it began)."""
        while True:
            if self._refreshing is None:
                self._refreshing_for = frozenset(self._topics)
                self._refreshing = asyncio.ensure_future(self._refresh(self._refreshing_for))
            refreshing, covers = self._refreshing, self._refreshing_for
            try:
                await asyncio.shield(refreshing)
            finally:
                if refreshing.done() and self._refreshing is refreshing:
                    self._refreshing = None
            if self._topics <= covers:
                return

    async def _refresh(self, topics: frozenset[str]) -> None:
        request = lambda: MetadataRequest(  # noqa: E731 - a fresh request per attempt
            topics=[MetadataRequest.MetadataRequestTopic(name=t) for t in sorted(topics)],
            max_version=METADATA_VERSION)
        errors = []
        for key, address in [*self._leaders.brokers.items(), *((f"bootstrap:{a[0]}:{a[1]}", a)
                                                              for a in self._bootstrap)]:
            try:
                connection = await self._connection(key, address, "metadata")
                response = await connection.call(request(), self.request_timeout)
            except Errors.KafkaError as error:
                errors.append(str(error))
                continue
            self._leaders = _Leaders(
                brokers={b.node_id: (b.host, b.port) for b in response.brokers},
                partitions={t.name: {p.partition_index: p.leader_id for p in t.partitions if p.error_code == 0}
                            for t in response.topics if t.error_code == 0})
            return
        raise KafkaUnavailable(f"no Kafka broker answered ({'; '.join(errors) or 'none configured'})")

    def close(self) -> None:
        for connection in self._connections.values():
            if isinstance(connection, BrokerConnection):
                connection.close()
            else:
                connection.cancel()
        self._connections.clear()

