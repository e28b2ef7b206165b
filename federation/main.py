"""``smqp-link`` / ``python -m federation``: run this farm's link process until a signal stops it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from kafka.errors import KafkaError

from federation.process import LinkProcess
from schemas.config import SMQPConfig, load_config

log = logging.getLogger("smqp.federation")


async def serve(config: SMQPConfig) -> None:
    """Run the links until SIGINT or SIGTERM; a NOTIFY being taken in then is not ACKed (its peer
    sends it again to the next run, which drops it if it was appended)."""
    process = LinkProcess(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await process.start()
    domains = ", ".join(link.domain for link in config.federation.links) or "none"
    print(f"SMQP link of {config.domain} running (links: {domains})", flush=True)
    try:
        await stop.wait()
    finally:
        await process.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="smqp-link",
        description="Link this SMQP farm to the peers in [[federation.links]] (spec 2.3): log in to each as an "
                    "SMQP client, subscribe there to what this farm's subscribers want, and append what the "
                    "peers forward (their Depth allowing) and what remote virtual topics pull to this farm's "
                    "commands topic, once each. /metrics on [federation] status_port.")
    parser.add_argument("--config", help="TOML configuration file (default: $SMQP_CONFIG, else built-in defaults)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    config = load_config(args.config)
    if not config.federation.links:
        log.info("no [[federation.links]] configured: nothing to link to")
    try:
        asyncio.run(serve(config))
    except (KafkaError, TimeoutError, OSError) as error:  # Kafka unreachable at start, a port taken
        log.error("smqp-link could not start: %s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
