"""The two requests a gateway sends for each message, written and read by hand: Produce v9 and
Fetch v11 (Kafka's protocol guide, https://kafka.apache.org/protocol).

Why not kafka-python's request and response objects, as for every other request: they are
generic, and on this host cost 45 µs to encode a produce request, 52 µs a fetch request and 9 µs
to decode each answer, besides ``KafkaProtocol``'s framing: 17-19 % of the gateway's CPU for a
message published and delivered alone at 1,000 msg/s (py-spy, ``bench-results/ab-kafka-wire/``).
These write the very bytes kafka-python writes (``tests/kafka_edge/test_wire.py`` compares them)
in 2.0-2.4 µs, and read its encoding of the answers back in 2.3-3.3 µs.

Only what the edge sends: one topic a request, a produce request for one partition, a fetch
without a fetch session (``session_epoch`` -1), read uncommitted.
"""

from __future__ import annotations

import struct
from typing import Callable, NamedTuple

from kafka_edge.records import read_uvarint, uvarint

PRODUCE, PRODUCE_VERSION = 0, 9  # flexible (compact fields, tagged fields) from v9
FETCH, FETCH_VERSION = 1, 11  # not flexible before v12

_HEADER = struct.Struct(">hhih")  # api key, api version, correlation id, client id's length
_ACKS_TIMEOUT = struct.Struct(">hi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_FETCH_HEAD = struct.Struct(">iiiibii")  # replica, max wait, min bytes, max bytes, isolation, session id, epoch
_FETCH_PARTITION = struct.Struct(">iiqqi")  # partition, leader epoch, offset, log start offset, max bytes
_PRODUCED = struct.Struct(">ihqqq")  # partition, error, base offset, log append time, log start offset
_FETCH_ANSWER_HEAD = struct.Struct(">ihi")  # throttle time, error, session id
_FETCHED = struct.Struct(">ihqqq")  # partition, error, high watermark, last stable offset, log start offset
_NO_TAGS = b"\x00"


class Encoded(NamedTuple):
    """A request written here, as :meth:`kafka_edge.connection.BrokerConnection.call` sends it: its
    API key and version, its body (the header is the connection's), and how to read its answer."""

    api_key: int
    version: int
    flexible: bool
    body: bytes
    read: Callable[[bytes], object]


def request_header(api_key: int, version: int, correlation_id: int, client_id: bytes, flexible: bool) -> bytes:
    """Request header v1 (v2 when ``flexible``: with an empty tagged-field section)."""
    header = _HEADER.pack(api_key, version, correlation_id, len(client_id)) + client_id
    return header + _NO_TAGS if flexible else header


def _compact(data: bytes) -> bytes:
    """A compact string or bytes: its length + 1 as an unsigned varint, then the data."""
    return uvarint(len(data) + 1) + data


def produce(topic: bytes, partition: int, records: bytes, timeout_ms: int) -> Encoded:
    """Produce v9 with ``acks=all`` of ``records`` (encoded batches) to one partition; its answer
    reads as :class:`Produced`."""
    return Encoded(PRODUCE, PRODUCE_VERSION, True, produce_request(topic, partition, records, timeout_ms),
                   produce_answer)


def fetch(topic: bytes, offsets: dict[int, int], max_wait_ms: int, min_bytes: int, max_bytes: int,
          partition_max_bytes: int) -> Encoded:
    """Fetch v11 of one topic's partitions from ``offsets``; its answer reads as :func:`fetch_answer`'s."""
    return Encoded(FETCH, FETCH_VERSION, False,
                   fetch_request(topic, offsets, max_wait_ms, min_bytes, max_bytes, partition_max_bytes), fetch_answer)


def produce_request(topic: bytes, partition: int, records: bytes, timeout_ms: int) -> bytes:
    """The body of Produce v9 with ``acks=all`` for one partition's record batch(es)."""
    return b"".join((
        b"\x00",  # transactional id: null
        _ACKS_TIMEOUT.pack(-1, timeout_ms),
        b"\x02", _compact(topic),  # one topic
        b"\x02", _INT32.pack(partition), _compact(records), _NO_TAGS,  # one partition
        _NO_TAGS, _NO_TAGS))


def fetch_request(topic: bytes, offsets: dict[int, int], max_wait_ms: int, min_bytes: int,
                  max_bytes: int, partition_max_bytes: int) -> bytes:
    """The body of Fetch v11 for ``offsets`` (partition → offset) of one topic, no fetch session."""
    return b"".join((
        _FETCH_HEAD.pack(-1, max_wait_ms, min_bytes, max_bytes, 0, 0, -1),
        _INT32.pack(1), _INT16.pack(len(topic)), topic,
        _INT32.pack(len(offsets)),
        *(_FETCH_PARTITION.pack(partition, -1, offset, -1, partition_max_bytes) for partition, offset in offsets.items()),
        _INT32.pack(0),  # no forgotten topics
        b"\x00\x00"))  # rack id: ""


class _Reader:
    """A cursor over one response frame (after its size)."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def take(self, layout: struct.Struct) -> tuple:
        values = layout.unpack_from(self.data, self.pos)
        self.pos += layout.size
        return values

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.data, self.pos)
        return value

    def skip(self, size: int) -> None:
        if size < 0 or self.pos + size > len(self.data):
            raise ValueError("a Kafka response ends inside a field")
        self.pos += size

    def compact_string(self) -> str | None:
        size = self.uvarint() - 1
        if size < 0:
            return None
        start = self.pos
        self.skip(size)
        return self.data[start:self.pos].decode("utf-8", "replace")

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.skip(self.uvarint())


class Produced(NamedTuple):
    """Kafka's answer for the one partition of a produce request."""

    error_code: int
    base_offset: int
    error_message: str | None


def produce_answer(frame: bytes) -> Produced:
    """Read a Produce v9 response frame (response header v1 included)."""
    reader = _Reader(frame, 4)  # after the correlation id
    reader.skip_tags()
    if reader.uvarint() - 1 < 1:
        raise ValueError("a produce response without its topic")
    reader.compact_string()
    if reader.uvarint() - 1 < 1:
        raise ValueError("a produce response without its partition")
    _, error_code, base_offset, _, _ = reader.take(_PRODUCED)
    for _ in range(reader.uvarint() - 1):  # record errors: the message below says it
        reader.take(_INT32)
        reader.compact_string()
        reader.skip_tags()
    return Produced(error_code, base_offset, reader.compact_string())


class Fetched(NamedTuple):
    """One partition of a fetch response: its error, high watermark and record bytes."""

    partition: int
    error_code: int
    high_watermark: int
    records: bytes


def fetch_answer(frame: bytes) -> tuple[int, list[Fetched]]:
    """Read a Fetch v11 response frame (response header v0 included): its top-level error code,
    and the partitions of its one topic."""
    reader = _Reader(frame, 4)
    _, error_code, _ = reader.take(_FETCH_ANSWER_HEAD)
    partitions: list[Fetched] = []
    (topics,) = reader.take(_INT32)
    for _ in range(topics):
        (name_size,) = reader.take(_INT16)
        reader.skip(name_size)
        (count,) = reader.take(_INT32)
        for _ in range(count):
            partition, error, high_watermark, _, _ = reader.take(_FETCHED)
            (aborted,) = reader.take(_INT32)
            reader.skip(16 * max(aborted, 0))  # producer id, first offset
            reader.take(_INT32)  # preferred read replica
            (size,) = reader.take(_INT32)
            start = reader.pos
            reader.skip(max(size, 0))
            partitions.append(Fetched(partition, error, high_watermark, frame[start:reader.pos]))
    return error_code, partitions
