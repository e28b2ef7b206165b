"""Fault test with real processes (issue 6): the streaming job killed with SIGKILL in the middle
of a stream and started again on its checkpoint.  Every message published with a 200 ends
acknowledged exactly once; Delta holds no duplicate row (Properties 3 and 4)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from gateway.client import SMQPClient
from tests.e2e.stack import GatewayThread, create_smqp_topics, stack_config
from tests.e2e.test_walking_skeleton import wait_for_acked

pytestmark = pytest.mark.e2e


class JobProcess:
    """``python -m streaming.job`` in its own process group (the JVM goes with it)."""

    def __init__(self, config):
        self.env = dict(os.environ, SMQP_DATA_DIR=config.data_dir, SMQP_KAFKA_BOOTSTRAP=config.kafka.bootstrap,
                        SMQP_KAFKA_COMMANDS_TOPIC=config.kafka.commands_topic,
                        SMQP_KAFKA_DELIVERIES_TOPIC=config.kafka.deliveries_topic,
                        SMQP_STREAMING_QUERY_NAME=config.streaming.query_name, PYSPARK_PYTHON=sys.executable)
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "streaming.job"], env=self.env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.kill()


@pytest.mark.timeout(600)  # two job start-ups on a loaded 2-core machine
def test_sigkill_of_the_streaming_job_mid_stream(broker, tmp_path):
    config = stack_config(broker, tmp_path)
    job = JobProcess(config)
    with GatewayThread(config) as gateway:
        asyncio.run(create_smqp_topics(gateway.address, "/j/t"))

        async def scenario():
            async with await SMQPClient.open(*gateway.address) as sub, await SMQPClient.open(*gateway.address) as pub:
                await sub.subscribe("/j/t")
                published = list(await asyncio.gather(*(pub.publish("/j/t", f"m{i}") for i in range(100))))
                got = []
                while len(got) < 30:
                    note = await sub.next_notification(180)
                    if note.resource == "MESSAGE":
                        await note.ack()
                        got.append(note.smuid)
                await asyncio.to_thread(job.kill)  # mid-stream: ACKs keep going to Kafka meanwhile
                await asyncio.sleep(1)  # time itself: the job stays down while ACKs go on
                await asyncio.to_thread(job.start)
                deadline = time.monotonic() + 240
                while len(got) < 100 and time.monotonic() < deadline:
                    note = await sub.next_notification(max(1, deadline - time.monotonic()))
                    await note.ack()
                    got.append(note.smuid)
                assert sorted(got) == sorted(published) and len(set(got)) == 100, len(got)
                with pytest.raises(asyncio.TimeoutError):
                    await sub.next_notification(2)

        try:
            job.start()
            asyncio.run(scenario())
            assert wait_for_acked(config, 100, timeout=180) == (100, 100, 100)
        finally:
            job.stop()
