"""Capacity measurements behind deploy/CAPACITY.md (a script, not a test).

Four bounded measurements on 127.0.0.1, with processes each starts and stops itself (and, for
``drain --master spark://…``, a Spark cluster you started):

- ``kafka``: one partition of a one-node Apache Kafka through the gateway's own Kafka edge
  (``kafka_edge``: acks=all, batched by the event loop, one request in flight) — append
  rate, durable appends one at a time (an ACK's wait), and the rate a tail reads it back.
- ``ingest``: one gateway process, no routing job — guaranteed 200-byte PUBs per second from
  pipelining publishers (each reply waits for Kafka's acks=all).
- ``connections``: one gateway process — logins per second and resident memory per idle
  logged-in connection.
- ``drain``: the routing job under a backlog — submits it with deploy/spark-submit.sh
  (``--master local[2]`` or a cluster's ``spark://…``; ``--launcher python`` runs
  ``python -m streaming.job`` instead), warms it up, then publishes N messages for K offline
  subscribers as fast as a gateway takes them, and reads the job's micro-batches back from the
  ``metrics`` Delta table: commands routed per second of batch time in the (nearly) full batches,
  wall time until every delivery is in Delta, and each executor's tasks and task seconds from the
  driver's REST API.

Prints a table per measurement; ``--json`` also writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploy.broker import KafkaBroker, create_topics, free_port, scratch_broker, wait_for_port
from deploy.stack import stopping_on_sigterm
from schemas.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure_kafka(records: int, size: int, serial: int) -> dict:
    """Through the project's own Kafka edge (``kafka_edge``): append ``records`` of ``size``
    bytes to one partition all at once (batched by the event loop, one request in flight), then
    ``serial`` more each awaited before the next (the latency of one durable append), then read
    them all back from offset 0 with a tail (a gateway's start-up fold)."""
    with scratch_broker() as broker:
        config = load_config(env={}, kafka={"bootstrap": broker.bootstrap, "commands_topic": "cap.p1",
                                            "deliveries_topic": "cap.unused"}).kafka
        create_topics(config)
        return asyncio.run(_kafka_figures(config, records, size, serial))


async def _kafka_figures(config, records: int, size: int, serial: int) -> dict:
    from kafka_edge import Cluster, DurableLog, Tail

    cluster = Cluster(config, client_id="capacity")
    log = await DurableLog.open(config, cluster, config.commands_topic)
    value = b"x" * size
    started = time.perf_counter()
    await asyncio.gather(*(log.append(None, value, partition=0) for _ in range(records)))
    produce_s = time.perf_counter() - started

    serial_started = time.perf_counter()
    for _ in range(serial):
        await log.append(None, value, partition=0)
    serial_s = time.perf_counter() - serial_started
    await log.close()

    counted = [0]
    tail = Tail(config, cluster, config.commands_topic, lambda items: counted.__setitem__(0, counted[0] + len(items)),
                lambda offset, key, value: offset, partitions=[0], name="capacity-reader")
    started = time.perf_counter()
    tail.start()
    await asyncio.wait_for(tail.ready.wait(), 300)
    fetch_s = time.perf_counter() - started
    await tail.stop()
    cluster.close()
    return {"records": records, "bytes": size,
            "produce_msgs_per_s": round(records / produce_s), "produce_mb_per_s": round(records * size / produce_s / 1e6, 1),
            "serial_appends": serial, "serial_appends_per_s": round(serial / serial_s),
            "serial_append_ms": round(serial_s / serial * 1000, 2),
            "fetched": counted[0], "fetch_msgs_per_s": round(counted[0] / fetch_s)}


def _gateway(broker: KafkaBroker, workdir: str, extra_env: dict[str, str] | None = None):
    """A gateway process on a free port; returns (process, config)."""
    config = load_config(env={}, data_dir=f"{workdir}/data", kafka={"bootstrap": broker.bootstrap},
                         gateway={"port": free_port()})
    create_topics(config.kafka)
    env = dict(os.environ, SMQP_DATA_DIR=config.data_dir, SMQP_KAFKA_BOOTSTRAP=broker.bootstrap,
               SMQP_GATEWAY_PORT=str(config.gateway.port), **(extra_env or {}))
    process = subprocess.Popen([sys.executable, "-m", "gateway.server"], env=env, start_new_session=True,
                               stdout=open(f"{workdir}/gateway.log", "wb"), stderr=subprocess.STDOUT)
    wait_for_port(config.gateway.host, config.gateway.port, 120)
    return process, config


def _stop(process: subprocess.Popen, grace: float = 60) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait(10)


def measure_connections(count: int) -> dict:
    """``count`` connections, each LOGIN guest and kept open; gateway RSS before and after."""
    from gateway.client import SMQPClient

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * count + 256)), hard))
    workdir = tempfile.mkdtemp(prefix="smqp-capacity-")
    with scratch_broker() as broker:
        gateway, config = _gateway(broker, workdir)
        try:
            address = (config.gateway.host, config.gateway.port)

            async def run() -> dict:
                before = _rss_mb(gateway.pid)
                clients = []
                started = time.perf_counter()
                for start in range(0, count, 100):  # 100 logins in flight at a time
                    clients += await asyncio.gather(*(SMQPClient.open(*address, timeout=60)
                                                      for _ in range(start, min(count, start + 100))))
                login_s = time.perf_counter() - started
                await asyncio.sleep(2)
                after = _rss_mb(gateway.pid)
                started = time.perf_counter()
                await asyncio.gather(*(client.noop() for client in clients))
                noop_s = time.perf_counter() - started
                await asyncio.gather(*(client.quit() for client in clients))
                return {"connections": count, "logins_per_s": round(count / login_s),
                        "rss_before_mb": round(before, 1), "rss_after_mb": round(after, 1),
                        "kib_per_connection": round((after - before) * 1024 / count, 1),
                        "noop_all_s": round(noop_s, 2)}

            return asyncio.run(run())
        finally:
            _stop(gateway)


def measure_ingest(messages: int, publishers: int, window: int) -> dict:
    """Guaranteed 200-byte PUBs through one gateway process with no routing job running: the
    gateway's own ceiling (each 200 waits for Kafka's acks=all, not for the job)."""
    from gateway.client import SMQPClient

    workdir = tempfile.mkdtemp(prefix="smqp-capacity-")
    with scratch_broker() as broker:
        gateway, config = _gateway(broker, workdir)
        try:
            address = (config.gateway.host, config.gateway.port)

            async def run() -> tuple[float, float]:
                async with await SMQPClient.open(*address) as admin:
                    await admin.create_topic("/drain/t")
                await _publish(address, 1000, publishers, window)  # warm-up
                return await _publish(address, messages, publishers, window), _rss_mb(gateway.pid)

            seconds, rss = asyncio.run(run())
        finally:
            _stop(gateway)
    total = messages - messages % publishers
    return {"messages": total, "publishers": publishers, "window": window, "seconds": round(seconds, 1),
            "msgs_per_s": round(total / seconds), "gateway_rss_mb": round(rss, 1)}


def _job_config(config, path: Path, batch: int, accounts: dict[str, str]) -> str:
    path.write_text(f'data_dir = "{config.data_dir}"\n[kafka]\nbootstrap = "{config.kafka.bootstrap}"\n'
                    f'[streaming]\nmax_records_per_batch = {batch}\n[accounts]\n'
                    + "".join(f'{name} = "{hashed}"\n' for name, hashed in accounts.items()))
    return str(path)


def _count(path: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_dataset().count_rows() if DeltaTable.is_deltatable(path) else 0


async def _publish(address, count: int, publishers: int = 4, window: int = 100) -> float:
    """``count`` 200-byte guaranteed PUBs to /drain/t over ``publishers`` connections; seconds taken."""
    from gateway.client import SMQPClient

    async def one(share: int) -> None:
        async with await SMQPClient.open(*address) as pub:
            for start in range(0, share, window):
                await asyncio.gather(*(pub.publish("/drain/t", b"x" * 200) for _ in range(start, min(share, start + window))))

    started = time.perf_counter()
    await asyncio.gather(*(one(count // publishers) for _ in range(publishers)))
    return time.perf_counter() - started


def _job_command(launcher: str, master: str, toml: str, ui_port: int) -> tuple[list[str], dict[str, str]]:
    """How to start the job: deploy/spark-submit.sh with the driver's UI on ``ui_port`` (for the
    executors' task times), or ``python -m streaming.job`` with ``[streaming] master``."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    if launcher == "python":
        return [sys.executable, "-m", "streaming.job", "--config", toml], dict(env, SMQP_STREAMING_MASTER=master)
    return [str(ROOT / "deploy" / "spark-submit.sh"), "--master", master,
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=true",
            "--conf", f"spark.ui.port={ui_port}", "--", "--config", toml], env


def measure_drain(messages: int, subscribers: int, batch: int, master: str, launcher: str,
                  warmup: int) -> dict:
    """The job, submitted with deploy/spark-submit.sh and warmed up on ``warmup`` messages,
    routes ``messages`` more to ``subscribers`` offline accounts; its micro-batches are read
    back from the ``metrics`` table."""
    from deltalake import DeltaTable

    from gateway.accounts import hash_password
    from gateway.client import SMQPClient

    names = [f"sub{i}" for i in range(subscribers)]
    accounts = {name: hash_password(name, iterations=1000) for name in names}
    workdir = Path(tempfile.mkdtemp(prefix="smqp-drain-"))
    messages -= messages % 4
    warmup -= warmup % 4
    with scratch_broker() as broker:
        config = load_config(env={}, data_dir=str(workdir / "data"), kafka={"bootstrap": broker.bootstrap})
        toml = _job_config(config, workdir / "smqp.toml", batch, accounts)
        gateway, config = _gateway(broker, str(workdir), {"SMQP_CONFIG": toml})
        ui_port = free_port()
        executors: list[dict] = []
        command, env = _job_command(launcher, master, toml, ui_port)
        job = subprocess.Popen(command, env=env, cwd=ROOT, start_new_session=True,
                               stdout=open(workdir / "job.log", "wb"), stderr=subprocess.STDOUT)
        try:
            address = (config.gateway.host, config.gateway.port)

            async def subscribe() -> None:
                async with await SMQPClient.open(*address) as admin:
                    await admin.create_topic("/drain/t")
                for name in names:
                    async with await SMQPClient.open(*address, name, name) as sub:
                        await sub.subscribe("/drain/*")
                        await sub.quit()  # offline: its deliveries wait in its queue

            def routed(expected: int, timeout: float = 900) -> None:
                deadline = time.perf_counter() + timeout
                while _count(config.table_path("deliveries")) < expected:
                    if job.poll() is not None or time.perf_counter() > deadline:
                        raise RuntimeError(f"the job did not route {expected} deliveries; see {workdir}/job.log")
                    time.sleep(0.5)

            asyncio.run(subscribe())
            asyncio.run(_publish(address, warmup))
            routed(warmup * subscribers)
            # the last batch planned so far (its offsets are written before it runs): the warm-up's
            planned = Path(config.checkpoint_dir, "offsets")
            warm_last = max(int(f.name) for f in planned.iterdir() if f.name.isdigit())
            print(f"  {master}: job warmed up on {warmup} messages (logs in {workdir}); publishing {messages} more ...",
                  flush=True)
            started = time.perf_counter()
            ingest_s = asyncio.run(_publish(address, messages))
            routed((warmup + messages) * subscribers)
            wall_s = time.perf_counter() - started
            if launcher == "spark-submit":
                executors = _executors(ui_port)
            time.sleep(8)  # the metrics recorder flushes every 5 s
        finally:
            _stop(job, grace=120)
            _stop(gateway)
        rows = DeltaTable(config.table_path("metrics")).to_pyarrow_table(
            columns=["batch_id", "num_input_rows", "batch_duration_ms"]).to_pylist()
    # the batches after the warm-up that ran (nearly) full: the job's saturated rate
    timed = [r for r in rows if r["batch_id"] > warm_last and r["num_input_rows"] >= batch // 2]
    busy_s = sum(r["batch_duration_ms"] for r in timed) / 1000
    commands = sum(r["num_input_rows"] for r in timed)
    tasks = {f"executor {e['id']}: tasks / task seconds": f"{e['totalTasks']} / {e['totalDuration'] / 1000:.1f}"
             for e in executors}
    return {"master": master, "launcher": launcher, "messages": messages, "subscribers": subscribers,
            "max_records_per_batch": batch,
            "ingest_msgs_per_s_while_routing": round(messages / ingest_s),
            "publish_to_all_routed_s": round(wall_s, 1),
            "end_to_end_msgs_per_s": round(messages / wall_s),
            "full_batches": len(timed), "mean_full_batch_ms": round(busy_s * 1000 / max(1, len(timed))),
            "commands_per_s_of_batch_time": round(commands / busy_s) if busy_s else None,
            "deliveries_per_s_of_batch_time": round(commands * subscribers / busy_s) if busy_s else None,
            **tasks}


def _executors(ui_port: int) -> list[dict]:
    """The application's executors (and the driver, which runs the tasks in local mode) from
    the driver's REST API: tasks run and their summed duration since the job started."""
    import urllib.request

    def get(path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/api/v1/{path}", timeout=30) as response:
            return json.load(response)

    app = get("applications")[0]["id"]
    return [e for e in get(f"applications/{app}/executors") if e["totalTasks"] or e["id"] != "driver"]


def _table(title: str, figures: dict) -> None:
    print(f"\n{title}\n| figure | value |\n|---|---|")
    for key, value in figures.items():
        print(f"| {key} | {value} |")


def _measure(args) -> dict:
    if args.measure == "kafka":
        return measure_kafka(args.records, args.bytes, args.serial)
    if args.measure == "ingest":
        return measure_ingest(args.messages, args.publishers, args.window)
    if args.measure == "connections":
        return measure_connections(args.count)
    return measure_drain(args.messages, args.subscribers, args.batch, args.master, args.launcher, args.warmup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.capacity", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="measure", required=True)
    kafka = sub.add_parser("kafka", help="one Kafka partition: produce, serial append and fetch rates")
    kafka.add_argument("--records", type=int, default=50000, help="records to produce (default 50000)")
    kafka.add_argument("--bytes", type=int, default=200, help="record size (default 200)")
    kafka.add_argument("--serial", type=int, default=1000, help="appends awaited one by one (default 1000)")
    ingest = sub.add_parser("ingest", help="one gateway, no job: guaranteed PUBs per second")
    ingest.add_argument("--messages", type=int, default=20000, help="messages (default 20000)")
    ingest.add_argument("--publishers", type=int, default=8, help="publishing connections (default 8)")
    ingest.add_argument("--window", type=int, default=100, help="PUBs in flight per connection (default 100)")
    connections = sub.add_parser("connections", help="one gateway: logins/s and memory per idle connection")
    connections.add_argument("--count", type=int, default=2000, help="connections (default 2000)")
    drain = sub.add_parser("drain", help="the routing job draining a backlog, via deploy/spark-submit.sh")
    drain.add_argument("--messages", type=int, default=8000, help="backlog size (default 8000)")
    drain.add_argument("--subscribers", type=int, default=2, help="offline subscriber accounts (default 2)")
    drain.add_argument("--batch", type=int, default=2000, help="[streaming] max_records_per_batch (default 2000)")
    drain.add_argument("--warmup", type=int, default=4000,
                       help="messages routed before the measurement starts (JIT, first plans; default 4000)")
    drain.add_argument("--master", default="local[2]", help="spark-submit --master (default local[2])")
    drain.add_argument("--launcher", choices=("spark-submit", "python"), default="spark-submit",
                       help="deploy/spark-submit.sh (default), or python -m streaming.job with [streaming] master")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    print(f"{args.measure}: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    try:
        with stopping_on_sigterm():  # the broker, gateway and job it started are stopped on SIGTERM too
            figures = _measure(args)
    except KeyboardInterrupt:
        print(f"{args.measure}: interrupted; what it started is stopped", flush=True)
        return 130
    figures["load_average_after"] = round(os.getloadavg()[0], 1)
    _table(args.measure, figures)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
