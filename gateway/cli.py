"""``smqp``: the reference client's command line.

    smqp pub /stocks/quotes/ibm "24.567"          # prints the SMUID once durable
    smqp sub /stocks/* --count 10                 # prints and acknowledges notifications

Connection and login come from ``--host/--port/--user/--password`` or the
environment (``SMQP_HOST``, ``SMQP_PORT``, ``SMQP_USER``, ``SMQP_PASSWORD``);
the defaults reach the local gateway as ``guest``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from gateway.client import SMQPClient, SMQPError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smqp", description="Reference SMQP client.")
    parser.add_argument("--host", default=os.environ.get("SMQP_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SMQP_PORT", "7720")))
    parser.add_argument("--user", default=os.environ.get("SMQP_USER", "guest"))
    parser.add_argument("--password", default=os.environ.get("SMQP_PASSWORD", ""))
    commands = parser.add_subparsers(dest="command", required=True)

    pub = commands.add_parser("pub", help="publish one message (data from the argument or stdin)")
    pub.add_argument("topic")
    pub.add_argument("data", nargs="?", help="message text; read from stdin when omitted")
    pub.add_argument("--content-type", default="text/plain")
    pub.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                     help="extra header attribute, e.g. --header 'Priority: 5' (repeatable)")

    sub = commands.add_parser("sub", help="subscribe and print notifications, acknowledging each")
    sub.add_argument("pattern", help="topic or wildcard like /stocks/*")
    sub.add_argument("--count", type=int, default=0, help="exit after this many messages (0: run until Ctrl-C)")
    sub.add_argument("--timeout", type=float, default=None, help="exit after this many idle seconds")

    unsub = commands.add_parser("unsub", help="unsubscribe from a topic or wildcard")
    unsub.add_argument("pattern")
    return parser


async def _run(args: argparse.Namespace) -> int:
    async with await SMQPClient.connect(args.host, args.port) as client:
        await client.login(args.user, args.password)
        if args.command == "pub":
            data = args.data.encode() if args.data is not None else sys.stdin.buffer.read()
            headers = [tuple(part.strip() for part in h.split(":", 1)) for h in args.header]
            print(await client.publish(args.topic, data, content_type=args.content_type, headers=headers))
        elif args.command == "sub":
            for line in await client.subscribe(args.pattern):
                print(f"subscribed {line}", file=sys.stderr)
            received = 0
            while not args.count or received < args.count:
                try:
                    note = await client.next_notification(args.timeout)
                except asyncio.TimeoutError:
                    break
                print(f"{note.topic} {note.smuid} {note.data.decode(errors='replace')}", flush=True)
                await note.ack()
                received += 1
        elif args.command == "unsub":
            for line in await client.unsubscribe(args.pattern):
                print(line)
        await client.quit()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except SMQPError as error:
        print(f"smqp: server replied {error}", file=sys.stderr)
        return 1
    except (ConnectionError, OSError) as error:
        print(f"smqp: cannot reach {args.host}:{args.port}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
