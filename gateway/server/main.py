"""``smqp-gateway`` / ``python -m gateway.server``: run one gateway until a signal stops it."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
from dataclasses import replace

from gateway.server.gateway import Gateway
from schemas.config import SMQPConfig, load_config


#: The gateway process's cyclic garbage collector thresholds (Python's default: 700, 10, 10).  A busy
#: gateway allocates a few objects per frame and holds a book of pending deliveries that grows with
#: every backlog; at the default, a full collection walked those ~300k objects 31 times in a short
#: benchmark (fan-out and drain windows): 3.2 s of the gateway's CPU, 2.5 s of it in full collections
#: of ~80 ms each, which also stall every connection.  Collecting the young generation every 10,000
#: allocations instead of 700 lets most of them die first; full collections still come, ~14x rarer.
GC_THRESHOLDS = (10_000, 10, 10)


async def serve(config: SMQPConfig, ready: asyncio.Event | None = None) -> None:
    """Run a gateway until SIGINT (closes at once), SIGTERM (closes after ``[gateway]
    shutdown_grace_s``) or ``python -m gateway.admin bye`` naming its node (closes after the grace
    it names): :meth:`Gateway.plan_shutdown`."""
    gateway = Gateway(config)
    await gateway.start()
    host, port = gateway.address
    print(f"SMQP gateway ready on {host}:{port} (node {config.gateway.node_id})", flush=True)
    if gateway.tls_address:
        print("SMQPS (TLS) on {}:{}".format(*gateway.tls_address), flush=True)
    if gateway.status_address:
        print("status page on http://%s:%s/metrics" % gateway.status_address, flush=True)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, gateway.plan_shutdown, 0.0)  # Ctrl-C: at once
    loop.add_signal_handler(signal.SIGTERM, gateway.plan_shutdown, config.gateway.shutdown_grace_s)
    if ready:
        ready.set()
    await gateway.shutdown_asked.wait()
    await gateway.close(gateway.shutdown_grace_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="smqp-gateway",
        description="Run one SMQP gateway: clients connect over TCP; PUBLISH/SUBSCRIBE/ACK go to Kafka; "
                    "NOTIFYs come from the streaming job's deliveries topic.",
    )
    parser.add_argument("--config", help="TOML configuration file (default: $SMQP_CONFIG, else built-in defaults)")
    parser.add_argument("--host", help="listen address (overrides [gateway] host)")
    parser.add_argument("--port", type=int, help="listen port (overrides [gateway] port)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO is per-connection chatter
    config = load_config(args.config)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = replace(config, gateway=replace(config.gateway, **overrides))
    gc.set_threshold(*GC_THRESHOLDS)  # here, not in serve: the process's, not an embedding program's
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
