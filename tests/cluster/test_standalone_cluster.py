"""The routing job, unchanged, on a real Spark standalone cluster.

One master and two workers (1 core, 1 GiB each) from the pip-installed
pyspark; the job submitted with ``deploy/spark-submit.sh --master
spark://…`` (client mode: the driver is the submitting process, the
executors run on the workers); two gateways of one farm (node ids 1 and 2)
and a real Kafka node.  Two publishers publish through different gateways, two
subscribers listen on different gateways: each subscriber is NOTIFYed every
message exactly once and acknowledges it, and the Delta tables hold every
message once and every delivery once, acknowledged.  The master, the workers
and the driver's REST API show that the application ran on the cluster with
an executor on each worker, both of which ran tasks; SIGTERM to the submit
script stops the job cleanly (exit code 0).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack
from dataclasses import replace

import pytest
from deltalake import DeltaTable

from deploy.broker import free_port
from gateway.accounts import hash_password
from gateway.client import SMQPClient
from tests.cluster.standalone import StandaloneCluster, SubmittedJob, get_json, spark_env, tail
from tests.e2e.stack import GatewayThread, stack_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PASSWORDS = {"pub1": "pub1-pw", "pub2": "pub2-pw", "sub1": "sub1-pw", "sub2": "sub2-pw"}
ACCOUNTS = {name: hash_password(password, iterations=1000) for name, password in PASSWORDS.items()}
TOPICS = ("/cluster/a", "/cluster/b")
PER_PUBLISHER = 40
STARTUP_S = 300  # cluster, spark-submit and the first micro-batch, on two shared cores
FLOW_S = 300


def job_config_file(config, path) -> str:
    """The TOML the submitted job reads: this test's broker, topics, tables, query name and commands source."""
    path.write_text(
        f'data_dir = "{config.data_dir}"\n'
        f'[kafka]\nbootstrap = "{config.kafka.bootstrap}"\n'
        f'commands_topic = "{config.kafka.commands_topic}"\ndeliveries_topic = "{config.kafka.deliveries_topic}"\n'
        f'[streaming]\nquery_name = "{config.streaming.query_name}"\nsource = "{config.streaming.source}"\n')
    return str(path)


def gateway_config(config, node_id: int):
    return replace(config, gateway=replace(config.gateway, node_id=node_id, port=free_port()))


def running_app(cluster: StandaloneCluster, name: str, job: SubmittedJob) -> dict:
    """The master's record of application ``name`` once it holds every core of the cluster."""
    deadline = time.monotonic() + STARTUP_S
    while True:
        apps = [app for app in cluster.state()["activeapps"] if app["name"] == name]
        if apps and apps[0]["state"] == "RUNNING" and apps[0]["cores"] == cluster.workers * cluster.cores:
            return apps[0]
        assert job.running(), f"spark-submit exited with {job.process.returncode}:\n{tail(job.log)}"
        assert time.monotonic() < deadline, f"application {name} not running after {STARTUP_S}s:\n{tail(job.log)}"
        time.sleep(1)


async def publish(address, account: str, count: int) -> list[int]:
    """``count`` guaranteed PUBs from ``account``, alternating over TOPICS, pipelined; SMUIDs in order."""
    async with await SMQPClient.open(*address, account, PASSWORDS[account]) as client:
        smuids = await asyncio.gather(*(
            client.publish(TOPICS[i % 2], f"{account} {i}".encode(), cmuid=f"{account}-{i}") for i in range(count)))
        await client.quit()
    return list(smuids)


async def receive_all(client: SMQPClient, count: int) -> list[tuple[str, int]]:
    """``count`` NOTIFY MESSAGEs, each two-phase ACKed; then 3 s in which nothing more may come."""
    received = []
    deadline = time.monotonic() + FLOW_S
    while len(received) < count:
        note = await client.next_notification(max(0.1, deadline - time.monotonic()))
        publisher = note.data.split()[0].decode()
        assert note.topic in TOPICS and note.header("Cmuid").startswith(f"{publisher}/")
        await note.ack()
        received.append((publisher, note.smuid))
    with pytest.raises(asyncio.TimeoutError):
        extra = await client.next_notification(3)
        pytest.fail(f"notified twice or unexpectedly: {extra.smuid}")
    return received


async def flow(first, second) -> tuple[dict[str, list[int]], dict[str, list[tuple[str, int]]]]:
    """Topics made on both gateways, a subscriber on each, a publisher on each."""
    async with await SMQPClient.open(*first, "pub1", PASSWORDS["pub1"]) as admin:
        await admin.create_topic(TOPICS[0])
    async with await SMQPClient.open(*second, "pub2", PASSWORDS["pub2"]) as admin:
        await admin.create_topic(TOPICS[1])
    sub1 = await SMQPClient.open(*first, "sub1", PASSWORDS["sub1"])
    sub2 = await SMQPClient.open(*second, "sub2", PASSWORDS["sub2"])
    for subscriber in (sub1, sub2):  # the pattern, not the topics it matches now, is what routes
        assert set(await subscriber.subscribe("/cluster/*")) <= set(TOPICS)
    receiving = [asyncio.ensure_future(receive_all(s, 2 * PER_PUBLISHER)) for s in (sub1, sub2)]
    published = dict(zip(("pub1", "pub2"), await asyncio.gather(publish(first, "pub1", PER_PUBLISHER),
                                                                publish(second, "pub2", PER_PUBLISHER))))
    received = dict(zip(("sub1", "sub2"), await asyncio.gather(*receiving)))
    await sub1.quit(), await sub2.quit()
    return published, received


def delta_rows(config, name: str) -> list[dict]:
    if not DeltaTable.is_deltatable(config.table_path(name)):
        return []
    return DeltaTable(config.table_path(name)).to_pyarrow_table().to_pylist()


def wait_for_acked(config, expected: int) -> None:
    """Until the job has committed ``expected`` acknowledged deliveries (ACKs are routed a batch later)."""
    deadline = time.monotonic() + FLOW_S
    while sum(d["status"] == "acked" for d in delta_rows(config, "deliveries")) < expected:
        assert time.monotonic() < deadline, f"not {expected} acked deliveries after {FLOW_S}s"
        time.sleep(1)


def assert_executors_on_both_workers(cluster: StandaloneCluster, app: dict, ui_port: int) -> None:
    """Each worker runs one executor of the app, and the driver saw both executors run tasks."""
    workers = cluster.state()["workers"]
    assert len(workers) == 2 and all(w["state"] == "ALIVE" and w["coresused"] == 1 for w in workers)
    hosting = {w["webuiaddress"]: [e["id"] for e in get_json(w["webuiaddress"] + "/json/")["executors"]
                                   if e["appid"] == app["id"]] for w in workers}
    assert all(len(executors) == 1 for executors in hosting.values()), hosting
    executors = [e for e in get_json(f"http://127.0.0.1:{ui_port}/api/v1/applications/{app['id']}/executors")
                 if e["id"] != "driver"]
    assert len(executors) == 2 and all(e["isActive"] for e in executors), executors
    # each executor's log link names the worker that runs it: one executor per worker
    assert {e["executorLogs"]["stderr"].split("/logPage")[0] for e in executors} == set(hosting)
    assert all(e["totalTasks"] > 0 for e in executors), [(e["id"], e["totalTasks"]) for e in executors]


def finished_state(cluster: StandaloneCluster, app: dict, timeout: float = 30) -> str | None:
    """The state the master records for ``app`` once it completed (None if it never does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for completed in cluster.state()["completedapps"]:
            if completed["id"] == app["id"]:
                return completed["state"]
        time.sleep(0.5)
    return None


@pytest.mark.parametrize("source", ["python", "kafka"])
def test_the_job_runs_unchanged_on_a_standalone_cluster_exactly_once(broker, tmp_path, source):
    """With either commands source; Spark's own Kafka connector reads on the executors, its jars
    (and delta-spark's) shipped by spark-submit.sh's --jars from the Maven cache."""
    started = time.monotonic()
    config = stack_config(broker, tmp_path, ACCOUNTS)
    config = replace(config, streaming=replace(config.streaming, source=source))
    ui_port = free_port()
    with ExitStack() as stack:
        cluster = stack.enter_context(StandaloneCluster(tmp_path / "spark", workers=2, cores=1, memory="1g"))
        job = stack.enter_context(SubmittedJob(
            ["--master", cluster.url, "--conf", "spark.driver.host=127.0.0.1",
             # the driver's UI and REST API, for the executor check (the job's default is off;
             # spark-submit's --conf wins over it)
             "--conf", "spark.ui.enabled=true", "--conf", f"spark.ui.port={ui_port}"],
            ["--config", job_config_file(config, tmp_path / "job.toml")],
            log=tmp_path / "job.log", env=spark_env(tmp_path / "spark")))
        app = running_app(cluster, config.streaming.query_name, job)
        phases = {"cluster up, job running": time.monotonic() - started}
        first = stack.enter_context(GatewayThread(gateway_config(config, node_id=1))).address
        second = stack.enter_context(GatewayThread(gateway_config(config, node_id=2))).address

        published, received = asyncio.run(flow(first, second))
        phases["published and notified"] = time.monotonic() - started

        every = published["pub1"] + published["pub2"]
        assert len(set(every)) == 2 * PER_PUBLISHER
        for account, notes in received.items():  # exactly once each, each publisher's in its order
            assert sorted(smuid for _, smuid in notes) == sorted(every), account
            for publisher, smuids in published.items():
                assert [smuid for who, smuid in notes if who == publisher] == smuids, (account, publisher)
        wait_for_acked(config, 2 * len(every))
        phases["acks in Delta"] = time.monotonic() - started
        assert_executors_on_both_workers(cluster, app, ui_port)

        assert job.stop() == 0, tail(job.log)
        assert finished_state(cluster, app) == "FINISHED"
        phases["job stopped"] = time.monotonic() - started

    messages, deliveries = delta_rows(config, "messages"), delta_rows(config, "deliveries")
    assert sorted(m["smuid"] for m in messages) == sorted(every)
    assert sorted((d["account"], d["smuid"], d["status"]) for d in deliveries) == sorted(
        (account, smuid, "acked") for account in ("sub1", "sub2") for smuid in every)
    phases["all stopped"] = time.monotonic() - started
    print(f"cluster test: {len(every)} messages, {len(deliveries)} deliveries; at "
          + ", ".join(f"{name} {at:.0f} s" for name, at in phases.items()))
