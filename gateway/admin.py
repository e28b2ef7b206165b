"""Administrator commands that SMQP clients may not issue, appended straight to the control log.

    python -m gateway.admin timeout 00:00:05:00
    python -m gateway.admin bye --node 3 00:05:00

``timeout`` changes the server's default message timeout on every gateway of
the farm (they fold it from commands partition 0) and sends NOTIFY SERVER
TIMEOUT to the clients that subscribed to it (SUBSCRIBE SERVER TIMEOUT).

``bye`` shuts one gateway down, planned: gateway ``--node`` tells its clients
``NOTIFY SERVER BYE <timeout>``, takes no new connection, serves the ones it
has for that long, then closes and exits.  Clients of the reference library
opened with the farm's other addresses move to one of them.
"""

from __future__ import annotations

import argparse
import sys
import uuid

from kafka import KafkaProducer

from schemas.config import SMQPConfig, load_config
from schemas.events import PlannedShutdown, SetServerTimeout
from schemas.timefmt import now_micros, parse_timeout


def _append_control(config: SMQPConfig, event) -> None:
    """Append ``event`` to commands partition 0 (acks=all); raises if Kafka refuses."""
    producer = KafkaProducer(bootstrap_servers=config.kafka.bootstrap, acks="all")
    try:
        producer.send(config.kafka.commands_topic, value=event.to_bytes(), partition=0).get(timeout=30)
    finally:
        producer.close(timeout=5)


def set_server_timeout(config: SMQPConfig, value: str) -> None:
    """Append the new default timeout to commands partition 0; raises if Kafka refuses."""
    parse_timeout(value)
    _append_control(config, SetServerTimeout(uuid.uuid4().hex, value, now_micros()))


def plan_shutdown(config: SMQPConfig, node: int, grace: str) -> None:
    """Ask gateway ``node`` to say BYE with ``grace`` and close after it; raises if Kafka refuses."""
    if parse_timeout(grace) is None:
        raise ValueError("a shutdown needs a finite grace")
    _append_control(config, PlannedShutdown(uuid.uuid4().hex, node, grace))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gateway.admin", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML configuration file (default: $SMQP_CONFIG, else built-in defaults)")
    commands = parser.add_subparsers(dest="command", required=True)
    timeout = commands.add_parser("timeout", help="set the server's default message timeout")
    timeout.add_argument("value", help="dd:hh:mm:ss[:ff], hh:mm:ss or INF")
    bye = commands.add_parser("bye", help="shut one gateway down after NOTIFY SERVER BYE <grace>")
    bye.add_argument("--node", type=int, required=True, help="the gateway's [gateway] node_id")
    bye.add_argument("value", metavar="grace", help="how long its clients are still served: dd:hh:mm:ss[:ff] or hh:mm:ss")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if parse_timeout(args.value) is None and args.command == "bye":
            raise ValueError("a shutdown needs a finite grace")
    except ValueError as error:
        parser.error(f"bad timeout {args.value!r}: {error}")
    config = load_config(args.config)
    try:
        if args.command == "bye":
            plan_shutdown(config, args.node, args.value)
        else:
            set_server_timeout(config, args.value)
    except Exception as error:  # noqa: BLE001 - report any Kafka failure plainly
        print(f"smqp admin: could not append to {config.kafka.bootstrap}: {error}", file=sys.stderr)
        return 2
    if args.command == "bye":
        print(f"gateway {args.node} says NOTIFY SERVER BYE {args.value} and closes after it")
    else:
        print(f"server default timeout is now {args.value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
