"""Administrator commands that SMQP clients may not issue, appended straight to the control log.

    python -m gateway.admin timeout 00:00:05:00

changes the server's default message timeout on every gateway of the farm
(they fold it from commands partition 0) and sends NOTIFY SERVER TIMEOUT to
the clients that subscribed to it (SUBSCRIBE SERVER TIMEOUT).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from kafka import KafkaProducer

from schemas.config import SMQPConfig, load_config
from schemas.events import SetServerTimeout
from schemas.timefmt import parse_timeout


def set_server_timeout(config: SMQPConfig, value: str) -> None:
    """Append the new default timeout to commands partition 0 (acks=all); raises if Kafka refuses."""
    parse_timeout(value)
    producer = KafkaProducer(bootstrap_servers=config.kafka.bootstrap, acks="all")
    try:
        event = SetServerTimeout(uuid.uuid4().hex, value, time.time_ns() // 1000)
        producer.send(config.kafka.commands_topic, value=event.to_bytes(), partition=0).get(timeout=30)
    finally:
        producer.close(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.admin", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML configuration file (default: $SMQP_CONFIG, else built-in defaults)")
    commands = parser.add_subparsers(dest="command", required=True)
    timeout = commands.add_parser("timeout", help="set the server's default message timeout")
    timeout.add_argument("value", help="dd:hh:mm:ss[:ff], hh:mm:ss or INF")
    args = parser.parse_args(argv)
    try:
        parse_timeout(args.value)
    except ValueError as error:
        parser.error(f"bad timeout {args.value!r}: {error}")
    config = load_config(args.config)
    try:
        set_server_timeout(config, args.value)
    except Exception as error:  # noqa: BLE001 - report any Kafka failure plainly
        print(f"smqp admin: could not append to {config.kafka.bootstrap}: {error}", file=sys.stderr)
        return 2
    print(f"server default timeout is now {args.value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
