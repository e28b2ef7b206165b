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
from pathlib import Path

import pytest

from deploy.stack import process_tree
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


def _jvm_of(pid: int) -> int | None:
    """The job's JVM: the ``java`` process among ``pid``'s descendants, once it is there."""
    for child in process_tree(pid):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == "java":
                return child
        except OSError:
            continue
    return None


@pytest.mark.timeout(300)
def test_a_job_whose_jvm_dies_exits_with_an_error_for_its_supervisor_to_restart(broker, tmp_path):
    """The JVM alone dies (as it does on OutOfMemoryError, ``-XX:+ExitOnOutOfMemoryError``): the job must
    not linger with nothing routing; it exits non-zero, and smqp-local or systemd start it again.

    Why: a job whose driver ran out of heap stayed up, idle, while gateways kept accepting publishes
    (``bench-results/drain-oom-2026-11-29-4c3e5bf-job.log``)."""
    config = stack_config(broker, tmp_path)
    job = JobProcess(config)
    with GatewayThread(config) as gateway:
        asyncio.run(create_smqp_topics(gateway.address, "/j/t"))
        try:
            job.start()
            deadline = time.monotonic() + 180
            while not (Path(config.checkpoint_dir) / "commits").is_dir() and time.monotonic() < deadline:
                time.sleep(0.5)  # its query runs: it has committed its first batch
            jvm = _jvm_of(job.process.pid)
            assert jvm is not None, "the job started no JVM"
            os.kill(jvm, signal.SIGKILL)
            assert job.process.wait(90) != 0
        finally:
            job.stop()
