"""``smqp-local``: the whole system on one machine, on embedded defaults.

Starts a one-node Apache Kafka (deploy/broker.py) with its log under the data
directory, creates the topics, then the Spark streaming job (local mode), one
SMQP gateway (with its Prometheus status page) and the ops dashboard as child
processes (and the farm's link process, ``smqp-link``, when ``[[federation.links]]`` are
configured), waits until the job has routed its first micro-batch (a cold Spark
takes tens of seconds), prints where everything is, starts the job again if it fails (up to
:data:`MAX_JOB_RESTARTS` times), and on Ctrl-C stops them in order: the
dashboard, the gateway (clients get ``NOTIFY SERVER BYE``), then the job (it
finishes its micro-batch), then Kafka; SIGTERM and SIGHUP (its terminal closed)
do the same.  The dashboard is an onlooker: if it cannot start (its port is
taken), the rest keeps running.

The children die with the launcher however it ends: each gets SIGTERM from the
kernel when it does (``PR_SET_PDEATHSIG``, :mod:`deploy.children`), so a launcher
killed with SIGKILL leaves no Kafka, job, gateway or dashboard holding its port.
Output that goes nowhere any more (a pipe whose reader ended) does not keep it
from stopping them.  A launch whose ports are taken says which process holds
each and starts nothing.

Everything lives in the data directory and a restart on the same one goes on
where the last run stopped: Kafka's log (``kafka/``) keeps every command and
delivery, the job resumes from its checkpoint (``checkpoints/<query_name>``),
and the Delta tables (``tables/``) keep the history.  A checkpoint without the
Kafka log it was made on is refused: its offsets would point into nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Collection

from deploy.broker import BrokerError, KafkaBroker, create_topics, free_port, wait_for_port
from deploy.children import dying_with, taken_ports
from deploy.jars import JarsUnavailable
from kafka_edge.offsets import topic_ends
from schemas.config import DashboardConfig, SMQPConfig, load_config
from streaming import EXIT_REFUSED


#: How many times a run starts the streaming job again after it failed, before it gives up.
MAX_JOB_RESTARTS = 5


def _say(text: str, stream=None) -> None:
    """Print and flush, unless the output is gone (the reader of its pipe ended): the launcher
    must still stop its children."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=stream or sys.stdout, flush=True)


def _stop(process: subprocess.Popen, name: str, timeout: float = 30.0) -> None:
    if process.poll() is not None:
        return
    _say(f"stopping {name} ...")
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


#: Seconds between the lines that say the launcher still waits for the job's first micro-batch.
WAITING_NOTE_S = 15


def routed_records(config: SMQPConfig) -> int:
    """How many records the deliveries topic holds.  Only the routing job writes there, and it ends
    every micro-batch, idle ones too, with a ``Progress`` record after its Delta commit: a count
    grown since the job started says the job has routed, committed and announced a batch."""
    ends = asyncio.run(asyncio.wait_for(
        topic_ends(config.kafka, config.kafka.deliveries_topic, client_id="smqp-local"), 5))
    return sum(ends.values())


def job_has_routed(config: SMQPConfig, before: int) -> bool:
    """Whether the deliveries topic grew past ``before`` (:func:`routed_records`); a Kafka that does
    not answer within its bound says no, and is asked again on the next turn."""
    try:
        return routed_records(config) > before
    except Exception as error:  # noqa: BLE001 - a timeout, a refused connection, a Kafka error: not yet
        print(f"(asking Kafka whether the job has routed: {error!r})", file=sys.stderr)
        return False


#: How many ports a launch tries for a dashboard whose port it chose itself.
DASHBOARD_PORT_TRIES = 3


def _launch_dashboard(env: dict, preexec_fn, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "deploy.dashboard"], env=dict(env, SMQP_DASHBOARD_PORT=str(port)),
                            start_new_session=True, preexec_fn=preexec_fn)


def start_dashboard(launch, host: str, port: int, chosen: bool,
                    tries: int = DASHBOARD_PORT_TRIES) -> tuple[subprocess.Popen, int]:
    """The dashboard ``launch(port)`` started, and the port it listens on.  A port this launch
    ``chosen`` itself was free when chosen, but another process may bind it first (the JVMs starting
    beside it take ephemeral ports too): then the dashboard exits at once, and it is started again on
    another free port, ``tries`` ports in all.  A configured port is never changed."""
    for attempt in range(1, tries + 1):
        dashboard = launch(port)
        if not chosen or _dashboard_listens(dashboard, host, port) or attempt == tries:
            return dashboard, port
        port = free_port()


def _dashboard_listens(dashboard: subprocess.Popen, host: str, port: int) -> bool:
    """Whether ``dashboard`` runs with its port open (waiting up to 30 s for it); a dashboard that
    found its port taken has exited by then."""
    try:
        wait_for_port(host, port, timeout=30)
        time.sleep(0.2)  # a dashboard that lost its port to another process exits at once
    except TimeoutError:
        pass
    return dashboard.poll() is None


def banner_text(config: SMQPConfig, broker: KafkaBroker, dashboard_url: str, gateway_status: str,
                waited_s: float) -> str:
    """Where everything is, printed once the job routes."""
    return (
        f"\nSMQP on Spark is running (the streaming job routed its first batch after {waited_s:.0f} s):\n"
        f"  SMQP gateway     {config.gateway.host}:{config.gateway.port}   "
        f"(try: smqp sub '/stocks/*'  and  smqp pub /stocks/quotes/ibm 24.567)\n"
        f"  Kafka broker     {config.kafka.bootstrap}   (Apache Kafka, log in {broker.data_dir}; "
        f"output {broker.log_path})\n"
        f"  streaming job    Spark {config.streaming.master}, query {config.streaming.query_name}, "
        f"checkpoint {config.checkpoint_dir}\n"
        f"  Delta tables     {config.data_dir}/tables/{{messages,deliveries,subscriptions,metrics}}\n"
        f"  dashboard        {dashboard_url}   (Prometheus: {dashboard_url.rstrip('/')}/metrics)\n"
        f"  gateway metrics  {gateway_status}\n"
        "Press Ctrl-C to stop.\n")


def child_modules(config: SMQPConfig) -> list[tuple[str, str]]:
    """The children this launch runs (name, module), in start order: the job, the gateway, and the
    farm's link process (``smqp-link``) when ``[[federation.links]]`` name peers.  Stopped in reverse."""
    children = [("streaming job", "streaming.job"), ("gateway", "gateway.server")]
    if config.federation.links:
        children.append(("federation link", "federation"))
    return children


def with_link_status_port(config: SMQPConfig, avoid: Collection[int] = ()) -> SMQPConfig:
    """``config`` whose link process (when links are configured) serves /metrics on a port: its own,
    else a free one (none of ``avoid``), so the dashboard shows the links as it shows the gateway."""
    if config.federation.links and not config.federation.status_port:
        return replace(config, federation=replace(config.federation, status_port=free_port(avoid=avoid)))
    return config


def _ports(config: SMQPConfig, broker_port: int, status_port: int) -> dict[str, tuple[str, int]]:
    """The ports this launch listens on (the dashboard's aside: it is an onlooker)."""
    gateway = config.gateway
    ports = {"Kafka broker": ("127.0.0.1", broker_port),
             "Kafka controller": ("127.0.0.1", config.local_kafka.controller_port),
             "SMQP gateway": (gateway.host, gateway.port), "gateway status page": (gateway.host, status_port)}
    if gateway.tls_port:
        ports["SMQPS gateway"] = (gateway.host, gateway.tls_port)
    if config.federation.links and config.federation.status_port:
        ports["link status page"] = (gateway.host, config.federation.status_port)
    return ports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="smqp-local",
        description="Run broker + streaming job + one gateway locally. Ctrl-C stops everything.",
    )
    parser.add_argument("--config", help="TOML configuration file (see deploy/smqp.example.toml)")
    parser.add_argument("--data-dir", help="where Kafka's log, the Delta tables and the job's checkpoint live; a restart on the "
                             "same directory goes on where the last run stopped (default ./smqp-data)")
    args = parser.parse_args(argv)

    config = load_config(args.config)
    if args.data_dir:
        config = replace(config, data_dir=args.data_dir)
    Path(config.data_dir).mkdir(parents=True, exist_ok=True)
    data_dir = str(Path(config.data_dir).absolute())
    config = replace(config, data_dir=data_dir)
    broker_port = int(config.kafka.bootstrap.rsplit(":", 1)[1])
    chosen = {broker_port, config.gateway.port, config.local_kafka.controller_port}  # no two listeners on one
    status_port = config.gateway.status_port or free_port(avoid=chosen)  # the dashboard scrapes the gateway here
    config = with_link_status_port(config, avoid=chosen | {status_port})  # ... and the link process here
    dashboard_port = config.dashboard.port or free_port(avoid=chosen | {status_port, config.federation.status_port})
    gateway_status = DashboardConfig().gateway_urls(replace(config.gateway, status_port=status_port))[0]

    stop_requested = False
    job_restarts = 0

    def request_stop(*_):
        nonlocal stop_requested
        stop_requested = True

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, request_stop)

    taken = taken_ports(_ports(config, broker_port, status_port))
    if taken:
        for line in taken:
            _say(f"smqp-local: {line}", sys.stderr)
        _say("smqp-local: not started: stop what holds the port (an earlier smqp-local?) or configure "
             "another one", sys.stderr)
        return 1
    taken = taken_ports({"dashboard": (config.dashboard.host, dashboard_port)})
    for line in taken:
        _say(f"smqp-local: {line}: the dashboard will not run", sys.stderr)
    die_with_me = dying_with(os.getpid())
    broker = KafkaBroker(Path(data_dir, "kafka"), broker_port, settings=config.local_kafka,
                         controller_port=config.local_kafka.controller_port, preexec_fn=die_with_me)
    children: list[tuple[str, subprocess.Popen]] = []
    dashboard: subprocess.Popen | None = None
    try:
        print(f"starting Kafka on {config.kafka.bootstrap} (log {broker.log_path}) ...", flush=True)
        broker.start()
        checkpoint = Path(config.checkpoint_dir)
        if broker.formatted and checkpoint.exists():
            raise BrokerError(
                f"Kafka's log under {broker.data_dir} is new, but the job's checkpoint {checkpoint} was made on "
                "an older one: its offsets point into nothing. Restore that log, or go on with another "
                "[streaming] query_name (e.g. SMQP_STREAMING_QUERY_NAME=smqp-router-2): a new checkpoint on the "
                f"new log, whose batches the Delta tables under {data_dir}/tables (the old history) count apart")
        create_topics(config.kafka)
        routed_before = routed_records(config)
        env = dict(os.environ, SMQP_DATA_DIR=data_dir, SMQP_KAFKA_BOOTSTRAP=config.kafka.bootstrap,
                   PYSPARK_PYTHON=sys.executable, SMQP_GATEWAY_STATUS_PORT=str(status_port),
                   SMQP_FEDERATION_STATUS_PORT=str(config.federation.status_port))
        if args.config:
            env["SMQP_CONFIG"] = str(Path(args.config).absolute())
        start = {name: functools.partial(subprocess.Popen, [sys.executable, "-m", module], env=env,
                                         start_new_session=True, preexec_fn=die_with_me)
                 for name, module in child_modules(config)}
        for name, launch in start.items():
            children.append((name, launch()))
        dashboard_env = dict(env)
        if not config.dashboard.gateways:
            dashboard_env["SMQP_DASHBOARD_GATEWAYS"] = gateway_status
        dashboard, dashboard_port = start_dashboard(
            functools.partial(_launch_dashboard, dashboard_env, die_with_me), config.dashboard.host, dashboard_port,
            chosen=not config.dashboard.port)
        wait_for_port(config.gateway.host, config.gateway.port, timeout=90)
        dashboard_url = f"http://{config.dashboard.host}:{dashboard_port}/"
        if dashboard.poll() is not None:
            dashboard_url = "not running (see its error above)"
        print("waiting for the streaming job's first micro-batch (Spark starts cold: up to a minute or two) ...",
              flush=True)
        started, ready = time.monotonic(), False
        next_note = started + WAITING_NOTE_S
        while not stop_requested:
            if not ready and job_has_routed(config, routed_before):
                ready = True
                print(banner_text(config, broker, dashboard_url, gateway_status, time.monotonic() - started),
                      flush=True)
            elif not ready and time.monotonic() >= next_note:
                print(f"... still waiting for the streaming job ({time.monotonic() - started:.0f} s)", flush=True)
                next_note += WAITING_NOTE_S
            if dashboard is not None and dashboard.poll() is not None:
                print(f"dashboard exited with code {dashboard.returncode}; the rest keeps running", file=sys.stderr)
                dashboard = None
            for index, (name, child) in enumerate(children):
                if child.poll() is None:
                    continue
                if name != "streaming job" or job_restarts >= MAX_JOB_RESTARTS or child.returncode == EXIT_REFUSED:
                    print(f"{name} exited with code {child.returncode}; stopping", file=sys.stderr)
                    return 1
                job_restarts += 1  # as systemd's Restart=on-failure does for smqp-router.service
                print(f"streaming job exited with code {child.returncode}; starting it again "
                      f"({job_restarts} of {MAX_JOB_RESTARTS}): it goes on from its checkpoint", file=sys.stderr)
                children[index] = (name, start[name]())
            time.sleep(0.2)
        return 0
    except BrokenPipeError:  # our output's reader is gone (``smqp-local | tee`` and Ctrl-C): stop
        return 1
    except (TimeoutError, OSError, BrokerError, JarsUnavailable) as error:  # asyncio's timeout is TimeoutError
        print(f"smqp-local: could not start: {error}", file=sys.stderr)
        return 1
    finally:
        if dashboard is not None:
            _stop(dashboard, "dashboard", timeout=10)
        for name, child in reversed(children):  # the gateway serves its clients its grace first
            _stop(child, name, timeout=30 + (config.gateway.shutdown_grace_s if name == "gateway" else 0))
        broker.stop()
        _say("stopped.")


if __name__ == "__main__":
    sys.exit(main())
