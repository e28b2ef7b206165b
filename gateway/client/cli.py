"""``smqp``: the reference client's command line, one subcommand per SMQP command.

    smqp pub /stocks/quotes/ibm "24.567"          # prints the SMUID once durable
    smqp sub /stocks/* --count 10                 # prints and acknowledges notifications
    smqp reply /stocks/quotes/ibm ann/g1/C4 "thanks"
    smqp topics / -r                              # the topic tree
    smqp create /stocks/ibm -k IBM -k "BIG BLUE"
    smqp get /stocks/quotes/ibm 1845-1890,1905    # stored messages, headers and data
    smqp count message /stocks/quotes/ibm
    smqp passwd                                   # prompts for the new password
    smqp --user ann --auth scram-sha-256 passwd   # neither password crosses the wire

``smqp <subcommand> --help`` describes each.  Connection and login come from
``--host/--port/--user/--password/--auth`` or the environment (``SMQP_HOST``,
``SMQP_PORT``, ``SMQP_USER``, ``SMQP_PASSWORD``, ``SMQP_AUTH``); the defaults
reach the local gateway as ``guest`` with CLEAR.  A 311 redirect at login is
followed.

Exit codes: 0 done; 1 the server refused (4xx/5xx, the reply on stderr);
2 bad usage, or the server could not be reached or the connection was lost;
3 the server sent something that is not SMQP; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys

from gateway.client import wire as cp
from gateway.client import LOGIN_ATTRIBUTES, Message, Notification, SMQPClient, SMQPError

AUTH_METHODS = ("CLEAR", "SCRAM-SHA-256")
_COUNT_RESOURCES = {"topic": "topics", "topics": "topics", "message": "messages", "messages": "messages",
                    "sub": "subscribers", "subscriber": "subscribers", "subscribers": "subscribers"}


class _Session:
    """What ``main`` needs to know to word a connection error."""

    connected = False


def _headers(values: list[str]) -> list[tuple[str, str]]:
    headers = []
    for value in values:
        name, colon, text = value.partition(":")
        if not colon or not name.strip():
            raise ValueError(f"--header {value!r}: expected NAME:VALUE")
        headers.append((name.strip(), text.strip()))
    return headers


def _data(args: argparse.Namespace) -> bytes:
    return args.data.encode() if args.data is not None else sys.stdin.buffer.read()


# --------------------------------------------------------------------------
# Subcommands: each takes the logged-in client and its arguments, returns the exit code


async def _pub(client: SMQPClient, args: argparse.Namespace) -> int:
    print(await client.publish(args.topic, _data(args), content_type=args.content_type,
                               headers=_headers(args.header), cmuid=args.cmuid))
    return 0


async def _reply(client: SMQPClient, args: argparse.Namespace) -> int:
    print(await client.publish_reply(args.topic, args.replied_to, _data(args), content_type=args.content_type,
                                     headers=_headers(args.header), cmuid=args.cmuid))
    return 0


def _describe(note: Notification, verbose: bool) -> str:
    """One notification as printed by ``smqp sub``."""
    if note.resource == "MESSAGE":
        text = note.data.decode(errors="replace")
        if not verbose:
            return f"{note.topic} {note.smuid} {text}"
        head = "".join(f"{name}: {value}\n" for name, value in note.headers)
        return f"NOTIFY MESSAGE {note.topic}\n{head}\n{text}\n"
    if note.resource == "TOPIC":
        return " ".join(part for part in ("TOPIC", note.topic, note.action, note.value) if part)
    if note.resource == "SUBSCRIBERS":
        return f"SUBSCRIBERS {note.topic} {note.count if note.count is not None else '?'}"
    if note.resource == "SERVER":
        return f"SERVER {note.topic}".rstrip()
    return " ".join([note.resource, note.topic, *(f"{n}: {v}" for n, v in note.headers)])


async def _sub(client: SMQPClient, args: argparse.Namespace) -> int:
    if args.window > 1:
        await client.set_notify_window(args.window)
    if args.notify_port is not None:
        port = await client.notify_port(args.notify_port)
        print(f"notifications on port {port}", file=sys.stderr)
    if args.resource == "message":
        subscribed = await client.subscribe(args.pattern, since=args.since, until=args.until)
    elif args.since or args.until:
        raise ValueError("--since/--until apply to --resource message only")
    elif args.resource == "topic":
        subscribed = await client.subscribe_topic(args.pattern)
    else:
        subscribed = await client.subscribe_subscribers(args.pattern)
    for line in subscribed:
        print(f"subscribed {line}", file=sys.stderr)
    if args.server_timeout:
        await client.subscribe_server_timeout()
    received, bye = 0, False
    acks: set[asyncio.Future] = set()  # in a window, messages are acknowledged without waiting
    try:
        while not args.count or received < args.count:
            note = await _next(client, args, bye)
            if note is None:
                break
            print(_describe(note, args.verbose), flush=True)
            if args.window > 1:
                acks.add(note.acknowledge())
                for done in [ack for ack in acks if ack.done()]:
                    acks.discard(done)
                    done.result()  # a refused or lost ACK ends the command with its error
            else:
                await note.ack()
            bye = bye or (note.resource == "SERVER" and note.action == "BYE")
            received += 1
    finally:
        if acks:
            await asyncio.gather(*acks)
    return 0


async def _next(client: SMQPClient, args: argparse.Namespace, bye: bool):
    """The next notification; None once ``--timeout`` passes idle or the server said BYE and left."""
    try:
        return await client.next_notification(args.timeout)
    except TimeoutError:
        return None
    except ConnectionError:
        if bye:  # the server said it was going: not an error
            return None
        raise



async def _unsub(client: SMQPClient, args: argparse.Namespace) -> int:
    if args.all:
        if args.pattern:
            raise ValueError("unsub --all takes no pattern")
        ended = await client.unsubscribe_all()
    elif not args.pattern:
        raise ValueError("unsub needs a pattern (or --all)")
    elif args.resource == "topic":
        ended = await client.unsubscribe_topic(args.pattern)
    elif args.resource == "subscribers":
        ended = await client.unsubscribe_subscribers(args.pattern)
    else:
        ended = await client.unsubscribe(args.pattern)
    for resource, topic in ended:
        print(f"{resource} {topic}")
    return 0


async def _topics(client: SMQPClient, args: argparse.Namespace) -> int:
    depth = args.depth if args.depth is not None else (0 if args.recursive else 1)

    async def walk(topic: str, level: int) -> None:
        for path, target in await client.list_topics(topic):
            print("  " * level + (f"{path} > {target}" if target else path), flush=True)
            if target is None and (depth == 0 or level + 1 < depth):
                await walk(path, level + 1)

    await walk(args.topic, 0)
    return 0


async def _create(client: SMQPClient, args: argparse.Namespace) -> int:
    await client.create_topic(args.topic, args.keyword, args.target)
    return 0


async def _remove(client: SMQPClient, args: argparse.Namespace) -> int:
    print(f"{await client.remove_topic(args.topic)} messages pending")
    return 0


async def _rename(client: SMQPClient, args: argparse.Namespace) -> int:
    await client.rename_topic(args.topic, args.new_topic)
    return 0


async def _keywords(client: SMQPClient, args: argparse.Namespace) -> int:
    if args.action == "set":
        await client.set_keywords(args.topic, args.keywords)
    else:
        for keyword in await client.get_keywords(args.topic):
            print(keyword)
    return 0


async def _find(client: SMQPClient, args: argparse.Namespace) -> int:
    for path, keywords in await client.find_topics(args.pattern, args.keywords):
        print(f"{path} ({','.join(keywords)})" if keywords else path)
    return 0


async def _count(client: SMQPClient, args: argparse.Namespace) -> int:
    count = getattr(client, f"count_{_COUNT_RESOURCES[args.resource]}")
    print(await count(args.topic))
    return 0


def _print_message(message: Message) -> None:
    out = sys.stdout
    for name, value in message.headers:
        out.write(f"{name}: {value}\n")
    for section in message.sections:
        out.write("\n")
        for name, value in section.headers:
            out.write(f"{name}: {value}\n")
        out.write("\n")
        kind = next((v for n, v in section.headers if n.lower() == "content-type"), "").lower()
        if kind.startswith("text/") or any(word in kind for word in ("json", "xml")):
            text = section.data.decode(errors="replace")
            out.write(text if text.endswith("\n") else text + "\n")
        else:
            out.write(f"[{len(section.data)} bytes of {kind or 'data'}]\n")
    out.write(".\n")


async def _get(client: SMQPClient, args: argparse.Namespace) -> int:
    messages = await client.get_messages(args.topic, args.selector)
    if args.data_only:
        for message in messages:
            sys.stdout.buffer.write(message.data)
        sys.stdout.buffer.flush()
        return 0
    for index, message in enumerate(messages):
        if index:
            print()
        _print_message(message)
    return 0


async def _list_subs(client: SMQPClient, args: argparse.Namespace) -> int:
    for pattern in await client.list_subscriptions():
        print(pattern)
    return 0


async def _set_login(client: SMQPClient, args: argparse.Namespace) -> int:
    await client.set_login(args.attribute, " ".join(args.value))
    return 0


async def _passwd(client: SMQPClient, args: argparse.Namespace) -> int:
    await client.change_password(args.password or "", args.new_password, method=args.method or args.auth)
    print("password changed", file=sys.stderr)
    return 0


async def _login(client: SMQPClient, args: argparse.Namespace) -> int:
    print(client.greeting)
    for name, value in client.login_attributes.items():
        print(f"{name}: {value}")
    return 0


# --------------------------------------------------------------------------
# The parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smqp", description="Reference SMQP client: one subcommand per command.",
                                     epilog="Exit codes: 0 done, 1 refused by the server, 2 usage or connection "
                                            "error, 3 not SMQP, 130 interrupted.")
    parser.add_argument("--host", default=os.environ.get("SMQP_HOST", "127.0.0.1"), help="server (SMQP_HOST)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("SMQP_PORT", "7720")), help="(SMQP_PORT)")
    parser.add_argument("--user", default=os.environ.get("SMQP_USER", "guest"), help="account (SMQP_USER)")
    parser.add_argument("--password", default=os.environ.get("SMQP_PASSWORD"), help="(SMQP_PASSWORD; default empty)")
    parser.add_argument("--auth", type=str.upper, choices=AUTH_METHODS, default=os.environ.get("SMQP_AUTH", "CLEAR"),
                        help="login method (SMQP_AUTH): CLEAR sends the password, SCRAM-SHA-256 never does")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        return sub

    def body_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("data", nargs="?", help="message text; read from stdin when omitted")
        sub.add_argument("--content-type", default="text/plain")
        sub.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                         help="extra header attribute, e.g. --header 'Priority: 5' (repeatable)")
        sub.add_argument("--cmuid", help="this message's client message id (default: generated)")

    pub = command("pub", _pub, "publish one message (PUB MESSAGE); prints its SMUID")
    pub.add_argument("topic")
    body_options(pub)

    reply = command("reply", _reply, "reply to a message (PUB REPLY); prints the SMUID")
    reply.add_argument("topic", help="the topic the message replied to came from")
    reply.add_argument("replied_to", metavar="CMUID", help="the Cmuid of the message replied to (account/guid/uid)")
    body_options(reply)

    sub = command("sub", _sub, "subscribe and print notifications, acknowledging messages")
    sub.add_argument("pattern", help="topic or wildcard like /stocks/*")
    sub.add_argument("--resource", choices=("message", "topic", "subscribers"), default="message",
                     help="what to watch: messages (default), topic changes, subscriber counts")
    sub.add_argument("--since", metavar="DATE-TIME", help="only messages since, e.g. D20010915T080000Z")
    sub.add_argument("--until", metavar="DATE-TIME", help="only messages until, e.g. D20010915T123000Z")
    sub.add_argument("--server-timeout", action="store_true", help="also SUB SERVER TIMEOUT")
    sub.add_argument("--notify-port", type=int, metavar="PORT",
                     help="receive notifications on a listener of ours (SET NOTIFY PORT; 0: any free port)")
    sub.add_argument("--count", type=int, default=0, help="exit after this many notifications (0: until Ctrl-C)")
    sub.add_argument("--window", type=int, default=1, metavar="N",
                     help="let up to N messages await their ACK at once (SET NOTIFY WINDOW, a server "
                          "extension; default 1, the spec's one at a time)")
    sub.add_argument("--timeout", type=float, default=None, help="exit after this many idle seconds")
    sub.add_argument("-v", "--verbose", action="store_true", help="print messages with their header attributes")

    unsub = command("unsub", _unsub, "unsubscribe; prints each subscription ended")
    unsub.add_argument("pattern", nargs="?", help="topic, wildcard like /stocks/*, or * for all of the resource")
    unsub.add_argument("--resource", choices=("message", "topic", "subscribers"), default="message")
    unsub.add_argument("--all", action="store_true", help="UNSUB *: everything, every resource")

    topics = command("topics", _topics, "list child topics (LIST TOPIC); virtual ones as 'path > target'")
    topics.add_argument("topic", nargs="?", default="/")
    topics.add_argument("-r", "--recursive", action="store_true", help="the whole tree below, indented")
    topics.add_argument("--depth", type=int, help="levels to list (default 1, with -r 0: unlimited)")

    create = command("create", _create, "create a topic (CREATE TOPIC)")
    create.add_argument("topic")
    create.add_argument("-k", "--keyword", action="append", default=[], help="a keyword (repeatable)")
    create.add_argument("--target", help="make it a virtual topic mapped to this topic")

    remove = command("remove", _remove, "remove a topic (REMOVE TOPIC); prints the messages still pending")
    remove.add_argument("topic")

    rename = command("rename", _rename, "rename a topic (SET TOPIC NAME)")
    rename.add_argument("topic")
    rename.add_argument("new_topic")

    keywords = command("keywords", _keywords, "get or set a topic's keywords")
    keyword_actions = keywords.add_subparsers(dest="action", required=True, metavar="ACTION")
    get_keywords = keyword_actions.add_parser("get", help="GET TOPIC KEYWORDS: one per line",
                                              description="GET TOPIC KEYWORDS: one per line")
    get_keywords.add_argument("topic")
    set_keywords = keyword_actions.add_parser("set", help="SET TOPIC KEYWORD: replace them (none: clear)",
                                              description="SET TOPIC KEYWORD: replace them (none: clear)")
    set_keywords.add_argument("topic")
    set_keywords.add_argument("keywords", nargs="*", help='e.g. IBM "BIG BLUE"')

    find = command("find", _find, "find topics (FIND TOPIC), optionally by keyword; prints 'path (keywords)'")
    find.add_argument("pattern", help="topic or wildcard like /stocks/*")
    find.add_argument("keywords", nargs="*", help="match any of these keywords")

    count = command("count", _count, "count child topics, messages or subscribers of a topic (COUNT)")
    count.add_argument("resource", choices=sorted(_COUNT_RESOURCES))
    count.add_argument("topic")

    get = command("get", _get, "fetch stored messages (GET MESSAGE) and print headers and data")
    get.add_argument("topic")
    get.add_argument("selector", nargs="?", default="*", help="SMUID, ranges like 1845-1890,1905, or * (default)")
    get.add_argument("--data-only", action="store_true", help="write only the data bytes to stdout")

    command("list-subs", _list_subs, "list this account's subscriptions (LIST SUBSCRIPTIONS)")

    set_login = command("set-login", _set_login, "set an account attribute (SET LOGIN)")
    set_login.add_argument("attribute", type=str.upper, choices=LOGIN_ATTRIBUTES)
    set_login.add_argument("value", nargs="+", help="the new value (several words are joined by spaces)")

    passwd = command("passwd", _passwd, "change this account's password (SET LOGIN PASSWORD); prompts for it")
    passwd.add_argument("--method", type=str.upper, choices=AUTH_METHODS,
                        help="CLEAR sends both passwords; SCRAM-SHA-256 proves the old one and sends the new one "
                             "only as a masked salted hash (default: the --auth method)")

    command("login", _login, "log in and print the server's greeting and login attributes")
    return parser


def _prompt_passwords(args: argparse.Namespace) -> None:
    """passwd: the current password (unless given) and the new one twice, before connecting."""
    if args.password is None:
        args.password = getpass.getpass(f"Current password for {args.user}: ")
    new = getpass.getpass("New password: ")
    if getpass.getpass("Retype new password: ") != new:
        raise ValueError("the new passwords do not match")
    args.new_password = new


async def _run(args: argparse.Namespace, session: _Session) -> int:
    client = await SMQPClient.open(args.host, args.port, args.user, args.password or "", method=args.auth)
    session.connected = True
    async with client:
        code = await args.handler(client, args)
        if not client.closed.is_set():
            await client.quit()
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    session = _Session()
    try:
        if args.command == "passwd":
            _prompt_passwords(args)
        return asyncio.run(_run(args, session))
    except SMQPError as error:
        print(f"smqp: server replied {error}", file=sys.stderr)
        return 1
    except cp.ServerProtocolError as error:
        print(f"smqp: {args.host}:{args.port} does not speak SMQP: {error}", file=sys.stderr)
        return 3
    except ValueError as error:
        print(f"smqp: {error}", file=sys.stderr)
        return 2
    except (ConnectionError, OSError) as error:
        if session.connected:
            print(f"smqp: connection to {args.host}:{args.port} lost: {error}", file=sys.stderr)
        else:
            print(f"smqp: cannot reach {args.host}:{args.port}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
