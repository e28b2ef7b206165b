"""The gateway's record batch codec against kafka-python's: the same bytes written, the same
records read (compressed and older-format batches through kafka-python itself), a batch whose
checksum fails refused.  The real broker's side is in test_append_and_tail (appends read back)."""

from __future__ import annotations

import struct

import pytest
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c

from kafka_edge.records import encode_batch, read_batches

RECORDS = [
    (b"/stocks/ibm", b'{"type":"publish"}', []),
    (None, b"keyless", [("smqp.after", b"41")]),
    (b"k", b"", [("a", None), ("\u00e9t\u00e9", b"x" * 200)]),
    (b"/big", b"v" * 20_000, []),  # lengths of three varint bytes
    *[(b"/many", f"record {i}".encode(), []) for i in range(200)],  # offset deltas past one byte
]


def kafka_python_batch(records, timestamp_ms: int, compression: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 31)
    for delta, (key, value, headers) in enumerate(records):
        builder.append(delta, timestamp=timestamp_ms, key=key, value=value, headers=headers)
    return bytes(builder.build())


def at_offset(batch: bytes, base_offset: int) -> bytes:
    """``batch`` as the broker returns it: its base offset filled in (outside the checksum)."""
    return struct.pack(">q", base_offset) + batch[8:]


def kafka_python_reads(data: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    found, batches = [], MemoryRecords(data)
    while (batch := batches.next_batch()) is not None:
        found += [(record.offset, record.key, record.value) for record in batch]
    return found


def test_a_batch_is_written_byte_for_byte_as_kafka_python_writes_it():
    assert encode_batch(RECORDS, 1_764_000_000_123) == kafka_python_batch(RECORDS, 1_764_000_000_123)
    assert encode_batch(RECORDS[:1], 0) == kafka_python_batch(RECORDS[:1], 0)


def test_batches_are_read_as_kafka_python_reads_them_with_each_next_offset():
    first, second = RECORDS[:3], RECORDS[3:]
    data = at_offset(encode_batch(first, 5), 100) + at_offset(encode_batch(second, 6), 103)
    batches = list(read_batches(data))
    assert [batch.next_offset for batch in batches] == [103, 103 + len(second)]
    assert [record for batch in batches for record in batch.records] == kafka_python_reads(data)
    assert batches[0].records[1] == (101, None, b"keyless")


def test_a_batch_cut_off_at_the_end_of_a_fetch_is_left_for_the_next_one():
    whole = at_offset(encode_batch(RECORDS[:2], 5), 0)
    cut = at_offset(encode_batch(RECORDS[2:4], 5), 2)[:-10]
    assert [batch.next_offset for batch in read_batches(whole + cut)] == [2]
    assert list(read_batches(whole[:30])) == []


def test_compressed_and_older_format_batches_are_read_through_kafka_python():
    gzip = at_offset(kafka_python_batch(RECORDS[:3], 7, compression=1), 10)
    legacy = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    for offset in range(3):
        legacy.append(offset, timestamp=7, key=b"old", value=f"v{offset}".encode())
    older = bytes(legacy.build())
    batches = list(read_batches(gzip + older))
    assert [record for batch in batches for record in batch.records] == [
        (10, b"/stocks/ibm", b'{"type":"publish"}'), (11, None, b"keyless"), (12, b"k", b""),
        (0, b"old", b"v0"), (1, b"old", b"v1"), (2, b"old", b"v2")]
    assert [batch.next_offset for batch in batches] == [13, 1, 2, 3]  # a message set: a message at a time


def test_a_transaction_marker_is_a_control_batch_without_records():
    marker = bytearray(at_offset(encode_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [])], 9), 50))
    struct.pack_into(">h", marker, 21, 0x20 | 0x10)  # control + transactional attributes
    struct.pack_into(">I", marker, 17, calc_crc32c(bytes(marker[21:])))
    [batch] = read_batches(bytes(marker))
    assert batch.control and batch.records == [] and batch.next_offset == 51


def test_a_batch_whose_checksum_fails_is_refused_with_its_place():
    data = bytearray(at_offset(encode_batch(RECORDS[:3], 5), 70))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="smqp.commands/0: record batch at 70 fails its CRC"):
        list(read_batches(bytes(data), "smqp.commands/0"))
