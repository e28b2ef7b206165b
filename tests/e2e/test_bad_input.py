"""Bad input over real sockets: reply codes or a clean close, nothing published
from a partial frame, and other sessions unaffected."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from gateway.client import SMQPClient
from gateway.server.feeds import RawPublish
from schemas.events import CreateTopic, Publish, decode
from tests.e2e.stack import GatewayThread, create_smqp_topics, stack_config

pytestmark = pytest.mark.e2e


async def raw_session(host, port):
    reader, writer = await asyncio.open_connection(host, port)
    greeting = await reader.readuntil(b"\r\n")
    assert greeting.startswith(b"SMQP/1.0 Ready.")
    return reader, writer


async def read_reply(reader) -> bytes:
    """Read one server frame (a reply ends with its last line and an empty line)."""
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)


def published_events(config) -> list[Publish]:
    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap, group_id=None, enable_auto_commit=False)
    tp = TopicPartition(config.kafka.commands_topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    events, deadline = [], time.monotonic() + 5
    while time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            events += [decode(r.value) for r in records]
        if consumer.highwater(tp) is not None and consumer.position(tp) >= consumer.highwater(tp):
            break
    consumer.close()
    return [e for e in events if isinstance(e, Publish)]


@pytest.fixture
def gateway(broker, tmp_path):
    config = stack_config(broker, tmp_path, frame_timeout_s=1.0, max_line_bytes=1024)
    with GatewayThread(config) as running:
        asyncio.run(create_smqp_topics(running.address, "/a/b"))
        yield running


def test_bad_commands_get_reply_codes_and_the_session_goes_on(gateway):
    host, port = gateway.address

    async def scenario():
        reader, writer = await raw_session(host, port)
        writer.write(b"FROBNICATE now\r\n")
        assert (await read_reply(reader)).startswith(b"400")
        writer.write(b"PUB MESSAGE /a/b X1\r\n\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi\r\n.\r\n")
        assert (await read_reply(reader)).startswith(b"401")  # before LOGIN
        writer.write(b"NOOP " + b"x" * 5000 + b"\r\n")
        assert (await read_reply(reader)).startswith(b"400")  # line over the limit
        writer.write(b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n")
        assert (await read_reply(reader)) == b"200 OK\r\n\r\n"
        assert (await read_reply(reader)).startswith(b"200-OK")
        writer.write(b"NOOP\r\n")
        assert (await read_reply(reader)) == b"200 OK\r\n\r\n"
        writer.close()

    asyncio.run(scenario())


def test_partial_frames_publish_nothing_and_disturb_no_one(gateway):
    host, port = gateway.address
    config = gateway.config

    async def scenario():
        good = await SMQPClient.connect(host, port)
        await good.login("guest")
        # a client that vanishes mid-frame
        reader, writer = await raw_session(host, port)
        writer.write(b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n")
        await read_reply(reader), await read_reply(reader)
        writer.write(b"PUB MESSAGE /a/b LOST1\r\n\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nhalf")
        await writer.drain()
        writer.close()
        # a client whose Content-Length promises more than it sends: 408 and a clean close
        reader2, writer2 = await raw_session(host, port)
        writer2.write(b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n")
        await read_reply(reader2), await read_reply(reader2)
        writer2.write(b"PUB MESSAGE /a/b LOST2\r\n\r\nContent-Type: text/plain\r\nContent-Length: 99\r\n\r\nshort\r\n.\r\n")
        assert (await read_reply(reader2)).startswith(b"408")
        assert await asyncio.wait_for(reader2.read(), 5) == b""  # closed by the server
        # meanwhile the well-behaved session is unaffected
        smuid = await good.publish("/a/b", b"kept", cmuid="KEPT")
        await good.quit()
        return smuid

    smuid = asyncio.run(scenario())
    events = published_events(config)
    assert [(e.cmuid, e.smuid) for e in events] == [("KEPT", smuid)]


def test_command_line_client_reports_refusals_clearly(gateway):
    host, port = gateway.address
    refused = subprocess.run([sys.executable, "-m", "gateway.client.cli", "--port", str(port), "--user", "nobody",
                              "--password", "x", "pub", "/a/b", "hi"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "404" in refused.stderr
    unreachable = subprocess.run([sys.executable, "-m", "gateway.client.cli", "--port", "1", "pub", "/a/b", "hi"],
                                 capture_output=True, text=True, timeout=60)
    assert unreachable.returncode == 2 and "cannot reach" in unreachable.stderr


def test_a_pipelined_login_with_deliveries_waiting_that_quits_gets_every_reply(gateway):
    """Found by the adversarial run: a login whose messages wait for it, pipelined with a command
    that waits on Kafka and a QUIT in one write.  Its registration, carried out after the login's
    reply, met a session the core had already ended; the NOTIFY it tried raised, and nothing
    after it was ever written, the QUIT's reply included."""
    host, port = gateway.address

    async def scenario():
        async with await SMQPClient.open(host, port) as guest:
            await guest.subscribe("/a/b")
        async with await SMQPClient.open(host, port) as publisher:
            for n in range(3):
                await publisher.publish("/a/b", f"waiting {n}")
        reader, writer = await raw_session(host, port)
        writer.write(b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\nCREATE TOPIC /a/c\r\nLIST TOPIC /a\r\nQUIT\r\n")
        replies = [await read_reply(reader) for _ in range(5)]
        writer.close()
        return replies

    replies = asyncio.run(scenario())
    codes = [reply[:3] for reply in replies]
    assert codes[:3] == [b"200", b"200", b"200"], replies  # LOGIN, PASS, CREATE
    assert codes[3] == b"200" and b"/a/c" in replies[3]  # LIST TOPIC shows what CREATE made
    assert codes[4].startswith(b"2"), replies  # QUIT's goodbye


def test_a_failure_reacting_to_one_control_record_does_not_stop_the_fold(gateway):
    """A fault injected into the early routing of one publish (the adversarial run saw an error
    raised there once), with a CREATE TOPIC behind it in the same batch of the control tail: the
    CREATE is still folded, and a client waiting on it answered."""
    def faulty(offset, raw, own=None):
        raise RuntimeError("injected fault")

    gateway.gateway._route_early = faulty
    create = CreateTopic("request-after", "guest", "/a/after", 0)
    poison = RawPublish("/a/b", b'{"type":"publish"}')

    async def fold_both():
        applied = gateway.gateway.registry.applied
        gateway.gateway._on_control([(applied + 1, poison), (applied + 2, create)])
        await asyncio.wait_for(gateway.gateway.folded(applied + 2), 5)

    gateway.call(fold_both(), timeout=10)
    assert gateway.gateway.registry.live("/a/after")


def test_a_frame_dribbled_a_byte_at_a_time_still_times_out(gateway):
    """``frame_timeout_s`` (1 s here) is the age of an unfinished frame: a client sending one byte
    every 0.3 s gets 408 and is closed within a few seconds, not kept open by each byte (the
    adversarial run's slow writer was still connected after 45 s at 5 s per byte)."""
    host, port = gateway.address

    async def scenario():
        reader, writer = await raw_session(host, port)
        writer.write(b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\n")
        await read_reply(reader), await read_reply(reader)
        writer.write(b"PUB MESSAGE /a/b c1\r\n")
        reply = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
        for byte in b"Content-Type: text/plain; a long header that never ends":
            if reply.done():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(0.3)
        done = reply.done()
        reply.cancel()
        writer.close()
        return done and reply.result()

    assert (asyncio.run(scenario()) or b"").startswith(b"408")
