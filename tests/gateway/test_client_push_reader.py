"""The client's connections read by push (``gateway.client.channel._PushReader``): each chunk the
transport delivers goes straight to the channel's parser.  These check the edges of that
hand-over: bytes that arrive before the channel is attached, a connection that ends before it
is, plain asyncio streams (a client built on them reads with a task, as before), and bytes
that fit no frame."""

from __future__ import annotations

import asyncio

import pytest

from gateway.client import wire as cp
from gateway.client import SMQPClient
from gateway.client.channel import open_connection

pytestmark = pytest.mark.timeout(30)

GREETING = b"SMQP/1.0 Ready. Push test\r\n"


async def _serve(script):
    """A server on 127.0.0.1 running ``script(reader, writer)`` per connection; returns (server, port)."""
    server = await asyncio.start_server(script, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _greet_then_answer_noops(reader, writer, *, answer=b"200 OK\r\n\r\n"):
    writer.write(GREETING)
    while (line := await reader.readline()):
        if line.strip() == b"NOOP":
            writer.write(answer)
    writer.close()


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 15))


def test_bytes_that_arrive_before_the_channel_is_attached_are_read():
    async def body():
        server, port = await _serve(_greet_then_answer_noops)
        async with server:
            reader, writer = await open_connection("127.0.0.1", port, None)
            await asyncio.sleep(0.2)  # the greeting is in before anyone reads it
            client = SMQPClient(reader, writer)
            assert await asyncio.wait_for(client._greeted, 5) == GREETING.decode().strip()
            await client.noop()
            await client.close()
    run(body())


def test_a_connection_that_ended_before_the_channel_was_attached_fails_the_greeting():
    async def close_at_once(reader, writer):
        writer.close()

    async def body():
        server, port = await _serve(close_at_once)
        async with server:
            reader, writer = await open_connection("127.0.0.1", port, None)
            await asyncio.sleep(0.2)
            client = SMQPClient(reader, writer)
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(client._greeted, 5)
            assert client.closed.is_set()
            await client.close()
    run(body())


def test_a_client_on_plain_asyncio_streams_still_reads_with_a_task():
    async def body():
        server, port = await _serve(_greet_then_answer_noops)
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            client = SMQPClient(reader, writer)
            assert client._main.task is not None
            await asyncio.wait_for(client._greeted, 5)
            for _ in range(3):
                await client.noop()
            await client.close()
    run(body())


@pytest.mark.parametrize("plain", [False, True])
def test_bytes_that_fit_no_frame_fail_the_pending_request_and_close(plain):
    async def garbage(reader, writer):
        await _greet_then_answer_noops(reader, writer, answer=b"garbage\r\n\r\n")

    async def body():
        server, port = await _serve(garbage)
        async with server:
            opened = asyncio.open_connection("127.0.0.1", port) if plain else open_connection("127.0.0.1", port, None)
            client = SMQPClient(*await opened)
            await asyncio.wait_for(client._greeted, 5)
            with pytest.raises(cp.ServerProtocolError):
                await client.noop()
            await asyncio.wait_for(client.closed.wait(), 5)
            with pytest.raises(cp.ServerProtocolError):
                await client.noop()
            await client.close()
    run(body())


def test_many_replies_in_one_chunk_each_reach_their_request():
    async def batched(reader, writer):
        writer.write(GREETING)
        await reader.readuntil(b"NOOP\r\n\r\n" * 5)
        writer.write(b"200 OK\r\n\r\n" * 5)  # one write, one chunk
        await reader.read()

    async def body():
        server, port = await _serve(batched)
        async with server:
            client = await SMQPClient.connect("127.0.0.1", port)
            await asyncio.gather(*(client.noop() for _ in range(5)))
            await client.close()
    run(body())
