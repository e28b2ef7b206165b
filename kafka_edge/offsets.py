"""Where partitions start and end, asked of their leaders (ListOffsets)."""

from __future__ import annotations

import kafka.errors as Errors
from kafka.protocol.consumer import ListOffsetsRequest

from kafka_edge.cluster import Cluster
from kafka_edge.settings import ClientSettings

EARLIEST, LATEST = -2, -1  # ListOffsets: the log start offset, the high watermark
#: The highest ListOffsets version used: the last one naming topics by name (later ones use topic ids).
LIST_OFFSETS_VERSION = 5


async def list_offsets(cluster: Cluster, topic: str, partitions: list[int], at: int) -> dict[int, int]:
    """Each of ``partitions``' offset ``at`` (:data:`EARLIEST` or :data:`LATEST`), one request per leader."""
    by_leader: dict[int | None, list[int]] = {}
    for partition in partitions:
        by_leader.setdefault(await cluster.leader_node(topic, partition), []).append(partition)
    found: dict[int, int] = {}
    for led in by_leader.values():
        connection = await cluster.leader(topic, led[0], "offsets")
        request_topic = ListOffsetsRequest.ListOffsetsTopic
        request = ListOffsetsRequest(
            replica_id=-1, isolation_level=0, max_version=LIST_OFFSETS_VERSION,
            topics=[request_topic(name=topic, partitions=[
                request_topic.ListOffsetsPartition(partition_index=p, timestamp=at) for p in led])])
        response = await connection.call(request, cluster.request_timeout)
        for answer in response.topics[0].partitions:
            if answer.error_code:
                raise Errors.for_code(answer.error_code)(f"offsets of {topic}/{answer.partition_index}")
            found[answer.partition_index] = answer.offset
    return found


async def topic_ends(settings: ClientSettings, topic: str, client_id: str,
                     partitions: list[int] | None = None) -> dict[int, int]:
    """The high watermark of ``partitions`` of ``topic`` (every one when None), on connections of
    its own (closed after)."""
    cluster = Cluster(settings, client_id=client_id)
    try:
        if partitions is None:
            partitions = await cluster.partitions(topic)
        return await list_offsets(cluster, topic, partitions, LATEST)
    finally:
        cluster.close()
