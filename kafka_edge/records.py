"""Kafka record batches (format v2), written and read without an object per record.

In this project every guaranteed PUB is written once into a record batch and read back once
by the gateway's fold of commands partition 0 (and every delivery once more
by its deliveries tail).  kafka-python's ``DefaultRecordBatchBuilder`` and
``MemoryRecords`` call a Python function per varint and build an object per
record with its timestamp and decoded headers: 14 % of the gateway's CPU
during the benchmark's ingest (py-spy).  This module writes the same bytes
(tested against kafka-python's builder) and reads only what the gateway uses
(offset, key, value): per record 3.1 -> 1.7 us to write, 3.3 -> 1.0 us to
read.  Batches it does not read itself (compressed ones, or an older format)
go to kafka-python's reader.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple, Sequence

from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c

Header = tuple[str, bytes | None]
#: A record to write: key, value, headers.
Outgoing = tuple[bytes | None, bytes, Sequence[Header]]
#: A record read: its offset, key and value.
Record = tuple[int, bytes | None, bytes | None]

#: BaseOffset, Length, PartitionLeaderEpoch, Magic, CRC — the part the CRC does not cover.
_PREFIX = struct.Struct(">qiibI")
#: Attributes, LastOffsetDelta, FirstTimestamp, MaxTimestamp, ProducerId, ProducerEpoch,
#: BaseSequence, record count — the header's part the CRC covers.
_CHECKED = struct.Struct(">hiqqqhii")
_HEADER_SIZE = _PREFIX.size + _CHECKED.size  # 61
_OFFSET_LENGTH = struct.Struct(">qi")  # how every format starts: the batch's Length counts what follows
_LENGTH_END = _OFFSET_LENGTH.size
_MAGIC_AT = 16
_CRC = struct.Struct(">I")
_COMPRESSION_MASK = 0x07
_CONTROL_MASK = 0x20
_NO_PRODUCER = -1


def _zigzag(value: int) -> bytes:
    """``value`` as Kafka's zig-zag varint."""
    value = (value << 1) ^ (value >> 63)
    if value < 0x80:  # most of them: no call
        return _ONE_BYTE[value]
    return uvarint(value)


def uvarint(value: int) -> bytes:
    """``value`` (not negative) as an unsigned varint: the protocol's compact lengths, and zig-zag
    varints once zig-zagged."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]
_NULL = _zigzag(-1)


def encode_batch(records: Sequence[Outgoing], timestamp_ms: int) -> bytes:
    """One uncompressed batch of ``records``, all stamped ``timestamp_ms``, as a producer without
    idempotence sends it (base offset 0: the broker assigns offsets)."""
    zigzag, null = _zigzag, _NULL
    body: list[bytes] = []
    for delta, (key, value, headers) in enumerate(records):
        offset_delta = zigzag(delta)
        key_length = null if key is None else zigzag(len(key))
        key = key or b""
        value_length = zigzag(len(value))
        tail = _headers(headers) if headers else b"\x00"
        size = 2 + len(offset_delta) + len(key_length) + len(key) + len(value_length) + len(value) + len(tail)
        # length, attributes and timestamp delta 0, offset delta, key, value, headers
        body += (zigzag(size), b"\x00\x00", offset_delta, key_length, key, value_length, value, tail)
    count = len(records)
    checked = _CHECKED.pack(0, count - 1, timestamp_ms, timestamp_ms, _NO_PRODUCER, -1, -1, count) + b"".join(body)
    length = _PREFIX.size - _LENGTH_END + len(checked)
    return _PREFIX.pack(0, length, 0, 2, calc_crc32c(checked)) + checked


def _headers(headers: Sequence[Header]) -> bytes:
    """A record's headers: their count, then each name and value."""
    parts = [_zigzag(len(headers))]
    for name, data in headers:
        encoded = name.encode()
        parts += (_zigzag(len(encoded)), encoded)
        parts += (_NULL,) if data is None else (_zigzag(len(data)), data)
    return b"".join(parts)


class Batch(NamedTuple):
    """One record batch as read: the offset after it, whether the broker wrote it (a transaction
    marker, no data), and its records."""

    next_offset: int
    control: bool
    records: list[Record]


def read_batches(data: bytes, where: str = "") -> Iterator[Batch]:
    """The complete batches in a fetch response's ``data``, in order (a fetch may end in part of
    one, which is left for the next fetch).  ``where`` (topic/partition) names a batch whose
    CRC fails in the :class:`CorruptRecordError`."""
    data = data if isinstance(data, bytes) else bytes(data)
    view = memoryview(data)
    size, pos = len(data), 0
    while pos + _LENGTH_END < size:
        base, length = _OFFSET_LENGTH.unpack_from(view, pos)
        end = pos + _LENGTH_END + length
        if end > size:
            return
        ours = end >= pos + _HEADER_SIZE and view[pos + _MAGIC_AT] == 2
        if ours:
            attributes, last_delta, *_, count = _CHECKED.unpack_from(view, pos + _PREFIX.size)
            ours = not attributes & _COMPRESSION_MASK
        if not ours:
            yield _read_other(bytes(view[pos:end]), where)
        else:
            crc = _CRC.unpack_from(view, pos + _MAGIC_AT + 1)[0]
            if calc_crc32c(view[pos + _PREFIX.size:end]) != crc:
                raise CorruptRecordError(f"{where}: record batch at {base} fails its CRC")
            control = bool(attributes & _CONTROL_MASK)
            records = [] if control else _records(data, pos + _HEADER_SIZE, end, base, count, where)
            yield Batch(base + last_delta + 1, control, records)
        pos = end


def _records(data: bytes, pos: int, end: int, base: int, count: int, where: str) -> list[Record]:
    """The ``count`` records of an uncompressed batch from ``pos``: offset, key, value (the
    attributes, timestamp and headers are skipped by the record's length).  One-byte varints,
    most of them, are read inline."""
    varint, out = _varint, []
    for _ in range(count):
        length, pos = varint(data, pos)
        following = pos + length
        pos += 1  # attributes
        pos = pos + 1 if data[pos] < 0x80 else varint(data, pos)[1]  # timestamp delta
        delta = data[pos]
        if delta < 0x80:
            delta, pos = (delta >> 1) ^ -(delta & 1), pos + 1
        else:
            delta, pos = varint(data, pos)
        key_length = data[pos]
        if key_length < 0x80:
            key_length, pos = (key_length >> 1) ^ -(key_length & 1), pos + 1
        else:
            key_length, pos = varint(data, pos)
        key = None
        if key_length >= 0:
            key = data[pos:pos + key_length]
            pos += key_length
        value_length, pos = varint(data, pos)
        out.append((base + delta, key, None if value_length < 0 else data[pos:pos + value_length]))
        pos = following
        if pos > end:
            raise CorruptRecordError(f"{where}: a record of the batch at {base} runs past its end")
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The zig-zag varint at ``pos`` and the position after it."""
    byte = data[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    value, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), pos + 1
        shift += 7


def read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it (:func:`_varint` keeps its own loop:
    it reads two multi-byte varints a record, and a call more each cost ~0.2 µs a record here)."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _read_other(data: bytes, where: str) -> Batch:
    """A compressed or older-format batch (or message set), read by kafka-python."""
    batch = MemoryRecords(data).next_batch()
    if not batch.validate_crc():
        raise CorruptRecordError(f"{where}: record batch at {_OFFSET_LENGTH.unpack_from(data)[0]} fails its CRC")
    records = [(r.offset, r.key, r.value) for r in batch]
    if isinstance(batch, DefaultRecordBatch):
        return Batch(batch.next_offset, batch.is_control_batch, [] if batch.is_control_batch else records)
    return Batch(records[-1][0] + 1, False, records)  # format 0/1: a message set, its last offset
