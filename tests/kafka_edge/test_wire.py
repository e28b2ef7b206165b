"""The hand-written Produce v9 and Fetch v11 codecs against kafka-python's own: the same request
bytes, the same reading of any answer kafka-python can write."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from kafka_edge.connection import BrokerConnection, KafkaUnavailable
from kafka_edge.wire import (FETCH, FETCH_VERSION, PRODUCE, PRODUCE_VERSION, Fetched, Produced, fetch_answer,
                             fetch_request, produce, produce_answer, produce_request, request_header)

topics = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=200).map(str.encode)
int32s = st.integers(0, 2**31 - 1)
offsets = st.integers(0, 2**62)
client_ids = st.text(max_size=40)


def kafka_python_bytes(request, correlation_id: int, client_id: str) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return request.encode(header=True)


@given(topics, int32s, st.binary(max_size=3000), int32s, int32s, client_ids)
def test_a_produce_request_is_the_bytes_kafka_python_writes(topic, partition, records, timeout_ms, correlation_id,
                                                            client_id):
    data = ProduceRequest.TopicProduceData
    theirs = ProduceRequest(acks=-1, timeout_ms=timeout_ms, version=PRODUCE_VERSION, topic_data=[data(
        name=topic.decode(), partition_data=[data.PartitionProduceData(index=partition, records=records)])])
    ours = (request_header(PRODUCE, PRODUCE_VERSION, correlation_id, client_id.encode(), flexible=True)
            + produce_request(topic, partition, records, timeout_ms))
    assert ours == kafka_python_bytes(theirs, correlation_id, client_id)


@given(topics, st.dictionaries(int32s, offsets, min_size=1, max_size=8), int32s, int32s, int32s, int32s,
       int32s, client_ids)
def test_a_fetch_request_is_the_bytes_kafka_python_writes(topic, positions, max_wait_ms, min_bytes, max_bytes,
                                                          partition_max_bytes, correlation_id, client_id):
    fetch = FetchRequest.FetchTopic
    theirs = FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=0,
        version=FETCH_VERSION, topics=[fetch(topic=topic.decode(), partitions=[fetch.FetchPartition(
            partition=p, fetch_offset=o, partition_max_bytes=partition_max_bytes) for p, o in positions.items()])])
    ours = (request_header(FETCH, FETCH_VERSION, correlation_id, client_id.encode(), flexible=False)
            + fetch_request(topic, positions, max_wait_ms, min_bytes, max_bytes, partition_max_bytes))
    assert ours == kafka_python_bytes(theirs, correlation_id, client_id)


def kafka_python_answer(response, correlation_id: int) -> bytes:
    response.with_header(correlation_id=correlation_id)
    return response.encode(header=True)


errors = st.lists(st.tuples(int32s, st.none() | st.text(max_size=50)), max_size=3)


@given(topics, int32s, st.integers(-1, 200), offsets, errors, st.none() | st.text(max_size=300), int32s)
def test_a_produce_answer_reads_as_kafka_python_wrote_it(topic, partition, error_code, base_offset, record_errors,
                                                         message, correlation_id):
    answer = ProduceResponse.TopicProduceResponse
    partition_answer = answer.PartitionProduceResponse
    response = ProduceResponse(version=PRODUCE_VERSION, throttle_time_ms=3, responses=[answer(
        name=topic.decode(), partition_responses=[partition_answer(
            index=partition, error_code=error_code, base_offset=base_offset, log_append_time_ms=-1,
            log_start_offset=0, error_message=message,
            record_errors=[partition_answer.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                           for i, m in record_errors])])])
    assert produce_answer(kafka_python_answer(response, correlation_id)) == Produced(error_code, base_offset, message)


fetched = st.tuples(int32s, st.integers(-1, 200), offsets, st.lists(st.tuples(offsets, offsets), max_size=3),
                    st.none() | st.binary(max_size=2000))


@given(topics, st.lists(fetched, max_size=5), st.integers(0, 200), int32s)
def test_a_fetch_answer_reads_as_kafka_python_wrote_it(topic, partitions, error_code, correlation_id):
    answer = FetchResponse.FetchableTopicResponse
    data = answer.PartitionData
    response = FetchResponse(version=FETCH_VERSION, throttle_time_ms=0, error_code=error_code, session_id=0,
                             responses=[answer(topic=topic.decode(), partitions=[data(
                                 partition_index=p, error_code=e, high_watermark=hw, last_stable_offset=hw,
                                 log_start_offset=0, preferred_read_replica=-1, records=records,
                                 aborted_transactions=[data.AbortedTransaction(producer_id=i, first_offset=f)
                                                       for i, f in aborted])
                                 for p, e, hw, aborted, records in partitions])])
    assert fetch_answer(kafka_python_answer(response, correlation_id)) == (
        error_code, [Fetched(p, e, hw, records or b"") for p, e, hw, _, records in partitions])


def test_an_answer_cut_short_is_an_error_not_a_wrong_answer():
    answer = ProduceResponse.TopicProduceResponse
    response = ProduceResponse(version=PRODUCE_VERSION, throttle_time_ms=0, responses=[answer(
        name="t", partition_responses=[answer.PartitionProduceResponse(
            index=0, error_code=0, base_offset=5, error_message="x" * 40)])])
    whole = kafka_python_answer(response, 1)
    with pytest.raises((ValueError, IndexError)):
        produce_answer(whole[:-20])


@pytest.mark.parametrize("answer", [
    lambda cid: struct.pack(">ii", 4, cid + 1),  # an answer to another request
    lambda cid: struct.pack(">iih", 6, cid, 0),  # a produce answer that ends before its topic
    lambda cid: struct.pack(">i", -5),  # a frame of no size
], ids=["other-correlation-id", "short-answer", "negative-size"])
def test_a_broker_answering_nonsense_fails_the_request_and_closes(answer):
    """A peer on the Kafka port that answers what no Kafka broker would (a real socket on
    127.0.0.1): the append fails at once with KafkaUnavailable, nothing waits for its timeout."""

    async def scenario():
        async def broker(reader, writer):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            request = await reader.readexactly(size)
            writer.write(answer(struct.unpack_from(">i", request, 4)[0]))
            await writer.drain()
            await reader.read()  # until the client closes

        server = await asyncio.start_server(broker, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, connection = await asyncio.get_running_loop().create_connection(
            lambda: BrokerConnection("test"), "127.0.0.1", port)
        started = time.monotonic()
        with pytest.raises(KafkaUnavailable, match="bad response"):
            await connection.call(produce(b"t", 0, b"records", 1000), timeout=30)
        assert time.monotonic() - started < 5 and connection.closed
        server.close()
        await server.wait_closed()

    asyncio.run(asyncio.wait_for(scenario(), 20))
