"""The gateway's own counters, the Prometheus text format, and a tiny HTTP status server.

No metrics framework: a handful of instruments whose hot-path cost is one
dict update (:class:`Counter`) or one ``bisect`` (:class:`Histogram`), and
gauges read from the gateway's state only when scraped (:class:`Gauge`).
:func:`render` writes the Prometheus text exposition format 0.0.4
(``# HELP`` / ``# TYPE`` per family, counters ending in ``_total``, histogram
``_bucket{le=…}`` / ``_sum`` / ``_count``); :func:`parse` reads it back (the
dashboard aggregates the gateways' pages with it).

:class:`GatewayMetrics` is what ``gateway.server`` feeds:

* ``smqp_gateway_connections_total`` / ``smqp_gateway_connections`` /
  ``smqp_gateway_logins`` — accepted so far / open now / logged in now;
* ``smqp_gateway_frames_in_total{verb}`` — command lines by canonical verb
  (``PUB`` counts as ``PUBLISH``, ``310 ACK`` as ``ACK``; unknown verbs as
  ``UNKNOWN``, so the label set stays bounded);
* ``smqp_gateway_frames_out_total{verb}`` — server frames: ``REPLY``,
  ``NOTIFY MESSAGE`` / ``TOPIC`` / ``SUBSCRIBERS`` / ``SERVER``, ``GREETING``;
* ``smqp_gateway_replies_total{code}`` and ``smqp_gateway_errors_total{code}``
  (the replies with a 4xx/5xx code);
* ``smqp_gateway_notify_in_flight`` — NOTIFY MESSAGEs awaiting their two-phase
  ACK; ``smqp_gateway_notify_queued`` — deliveries waiting behind them;
* ``smqp_gateway_ack_latency_seconds`` — NOTIFY MESSAGE written → the client's
  ``310 ACK`` made durable in Kafka → server ``310 ACK`` (both phases);
* ``smqp_gateway_buffered_bytes`` / ``smqp_gateway_buffered_bytes_peak`` — bytes held for
  clients that have not read them (now, and the most one connection held);
  ``smqp_gateway_slow_clients_closed_total{reason}`` — clients closed for not reading
  (``stalled``, ``overflow``);
* ``smqp_gateway_routed_early_total`` — deliveries this gateway routed itself from
  the commands log, ahead of the job (``[gateway] route_early``).

Command verbs are counted through the session's ``on_command`` hook, so the
protocol module itself stays free of metrics.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable, Mapping
from urllib.parse import urlsplit

from gateway.protocol.vocabulary import VERBS

log = logging.getLogger("smqp.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Seconds; a two-phase ACK includes a client's think time and a Kafka append.
ACK_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


# --------------------------------------------------------------------------
# Instruments


def format_value(value: float) -> str:
    """A sample value as the text format writes it: integers without a point, ``+Inf``, ``NaN``."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_labels(names: Iterable[str], values: Iterable[str]) -> str:
    pairs = [f'{n}="{escape_label(str(v))}"' for n, v in zip(names, values)]
    return "{" + ",".join(pairs) + "}" if pairs else ""


class _Family:
    kind = "untyped"

    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()):
        if not _NAME.match(name) or not all(_LABEL.match(label) for label in labels):
            raise ValueError(f"bad metric or label name in {name}{labels}")
        self.name = name
        self.help = help
        self.labels = labels

    def samples(self) -> Iterable[tuple[str, tuple[str, ...], tuple[str, ...], float]]:
        """(sample name, label names, label values, value) tuples."""
        raise NotImplementedError


class Counter(_Family):
    """A monotonic count per label-value tuple; ``inc`` is one dict update."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()):
        if not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        super().__init__(name, help, labels)
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0}

    def inc(self, *label_values: str, amount: float = 1) -> None:
        self.values[label_values] = self.values.get(label_values, 0) + amount

    def get(self, *label_values: str) -> float:
        return self.values.get(label_values, 0)

    def samples(self):
        for values, value in sorted(self.values.items()):
            yield self.name, self.labels, values, value


class Gauge(_Family):
    """A value read when scraped: ``read()`` returns a number, or ``{label values: number}``."""

    kind = "gauge"

    def __init__(self, name: str, help: str, read: Callable[[], float | Mapping[tuple[str, ...], float]],
                 labels: tuple[str, ...] = ()):
        super().__init__(name, help, labels)
        self.read = read

    def samples(self):
        value = self.read()
        if isinstance(value, Mapping):
            for values, number in sorted(value.items()):
                yield self.name, self.labels, values, number
        else:
            yield self.name, (), (), value


class Histogram(_Family):
    """Observations counted into fixed buckets (rendered cumulative, plus ``+Inf``, sum, count)."""

    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Iterable[float]):
        super().__init__(name, help)
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is (largest bound, +Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def samples(self):
        running = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts):
            running += count
            yield f"{self.name}_bucket", ("le",), (format_value(float(bound)),), running
        yield f"{self.name}_sum", (), (), self.sum
        yield f"{self.name}_count", (), (), self.count


def render(families: Iterable[_Family]) -> str:
    """The Prometheus text exposition format (0.0.4) of ``families``."""
    out: list[str] = []
    for family in families:
        out.append(f"# HELP {family.name} {_escape_help(family.help)}")
        out.append(f"# TYPE {family.name} {family.kind}")
        for name, labels, values, value in family.samples():
            out.append(f"{name}{format_labels(labels, values)} {format_value(value)}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# Reading the text format back (the dashboard aggregates gateways with it)


@dataclass
class ParsedFamily:
    name: str
    kind: str = "untyped"
    help: str = ""
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?$')
_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def parse_value(text: str) -> float:
    return {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}.get(text) or float(text)


def parse(text: str) -> dict[str, ParsedFamily]:
    """Families by name from a text exposition; raises ValueError on a malformed line."""
    families: dict[str, ParsedFamily] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                family = families.setdefault(parts[2], ParsedFamily(parts[2]))
                if parts[1] == "HELP":
                    family.help = _unescape(parts[3]) if len(parts) > 3 else ""
                else:
                    family.kind = parts[3].strip() if len(parts) > 3 else "untyped"
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ValueError(f"line {number}: not a sample: {line!r}")
        labels: dict[str, str] = {}
        rest = match.group("labels") or ""
        position = 0
        while position < len(rest):
            pair = _PAIR.match(rest, position)
            if not pair:
                raise ValueError(f"line {number}: bad labels: {line!r}")
            labels[pair.group(1)] = _unescape(pair.group(2))
            position = pair.end()
        name = match.group("name")
        family = families.get(name)
        if family is None:
            base = next((name[:-len(s)] for s in ("_bucket", "_sum", "_count") if name.endswith(s)), None)
            family = families.get(base) if base else None
            if family is None or name[len(base):] not in _SUFFIXES.get(family.kind, ()):
                family = families.setdefault(name, ParsedFamily(name))
        family.samples.append((name, labels, parse_value(match.group("value"))))
    return families


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Prometheus' estimate of quantile ``q`` from cumulative (upper bound, count) buckets."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return previous_bound  # beyond the largest finite bucket: its bound is all we know
            if count == previous_count:
                return bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / (count - previous_count)
        previous_bound, previous_count = bound, count
    return previous_bound


# --------------------------------------------------------------------------
# The gateway's instruments


_VERB_LABELS = {verb.encode(): name for verb, name in VERBS.items()}
_NOTIFY_KINDS = {b"MESSAGE": "NOTIFY MESSAGE", b"MESS": "NOTIFY MESSAGE", b"TOPIC": "NOTIFY TOPIC",
                 b"SUB": "NOTIFY SUBSCRIBERS", b"SUBSCRIBERS": "NOTIFY SUBSCRIBERS", b"SERVER": "NOTIFY SERVER"}


class GatewayMetrics:
    """Counters the gateway's I/O layer bumps, plus gauges it reads on scrape."""

    def __init__(self, gateway=None):
        self.started = time.time()
        self.connections_total = Counter("smqp_gateway_connections_total", "TCP connections accepted.")
        self.frames_in = Counter("smqp_gateway_frames_in_total",
                                 "Command frames received, by canonical verb (UNKNOWN: not an SMQP verb).", ("verb",))
        self.frames_out = Counter("smqp_gateway_frames_out_total",
                                  "Frames sent: REPLY, NOTIFY <kind>, GREETING.", ("verb",))
        self.replies = Counter("smqp_gateway_replies_total", "Replies sent, by reply code.", ("code",))
        self.errors = Counter("smqp_gateway_errors_total", "Error replies (4xx, 5xx) sent, by reply code.", ("code",))
        self.ack_latency = Histogram("smqp_gateway_ack_latency_seconds",
                                     "NOTIFY MESSAGE written to the server's 310 ACK (client ACK made durable).",
                                     ACK_LATENCY_BUCKETS)
        self.slow_clients_closed = Counter(
            "smqp_gateway_slow_clients_closed_total",
            "Clients closed for not reading what they were sent: stalled (over half of max_buffered_bytes "
            "for stalled_client_timeout_s) or overflow (a notification would pass max_buffered_bytes).", ("reason",))
        self.routed_early = Counter(
            "smqp_gateway_routed_early_total",
            "Deliveries this gateway routed itself from the commands log, ahead of the job's micro-batch.")
        self.buffered_peak = 0  # the most bytes one connection has held unread, since start
        self._gateway = gateway

    # -- hot path

    def frame_in(self, line: bytes) -> None:
        """A command line the session dispatches (its first word names the verb)."""
        words = line.split(None, 1)
        if words:
            self.frames_in.inc(_VERB_LABELS.get(words[0].upper(), "UNKNOWN"))

    def frame_out(self, data: bytes) -> None:
        """A server frame about to be written."""
        head = data[:3]
        if head.isdigit():
            code = head.decode()
            self.frames_out.inc("REPLY")
            self.replies.inc(code)
            if head[0] >= 0x34:  # '4' and '5': errors
                self.errors.inc(code)
        elif data.startswith(b"NOTIFY "):
            end = data.find(b" ", 7)
            kind = data[7:end if end > 0 else data.find(b"\r")]
            self.frames_out.inc(_NOTIFY_KINDS.get(kind.upper(), "NOTIFY"))
        elif data.startswith(b"SMQP/"):
            self.frames_out.inc("GREETING")
        elif data:
            self.frames_out.inc("OTHER")

    def buffered(self, unread: int) -> None:
        """A connection now holds ``unread`` bytes for its client."""
        if unread > self.buffered_peak:
            self.buffered_peak = unread

    # -- scrape

    def families(self) -> list[_Family]:
        gateway = self._gateway
        connections = (lambda: list(gateway.connections)) if gateway else (lambda: [])
        node = str(gateway.config.gateway.node_id) if gateway else ""
        ident = gateway.config.gateway.server_ident if gateway else ""
        return [
            Gauge("smqp_gateway_info", "This gateway: SMQP node id and server identification (always 1).",
                  lambda: {(node, ident): 1}, ("node_id", "server_ident")),
            Gauge("smqp_gateway_start_time_seconds", "When this gateway started, seconds since the epoch.",
                  lambda: self.started),
            self.connections_total,
            Gauge("smqp_gateway_connections", "Open client connections.", lambda: len(connections())),
            Gauge("smqp_gateway_logins", "Logged-in sessions.",
                  lambda: sum(1 for c in connections() if c.session.logged_in)),
            self.frames_in,
            self.frames_out,
            self.replies,
            self.errors,
            Gauge("smqp_gateway_notify_in_flight", "NOTIFY MESSAGEs awaiting their two-phase 310 ACK.",
                  lambda: sum(len(c.in_flight) for c in connections())),
            Gauge("smqp_gateway_notify_queued", "Deliveries queued for logged-in sessions behind the one in flight.",
                  lambda: sum(len(c.queue) for c in connections())),
            self.ack_latency,
            Gauge("smqp_gateway_buffered_bytes", "Bytes held for clients that have not read them yet, all connections.",
                  lambda: sum(c.buffered for c in connections())),
            Gauge("smqp_gateway_buffered_bytes_peak", "The most bytes one connection has held unread, since start.",
                  lambda: self.buffered_peak),
            self.slow_clients_closed,
            self.routed_early,
        ]

    def render(self) -> str:
        return render(self.families())


# --------------------------------------------------------------------------
# A minimal HTTP/1.1 server on asyncio (status pages, the dashboard)


@dataclass
class Response:
    body: bytes | str
    content_type: str = "text/plain; charset=utf-8"
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)


Route = Callable[[str], Awaitable[Response]]  # called with the query string

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            500: "Internal Server Error", 503: "Service Unavailable"}


async def serve_http(host: str, port: int, routes: Mapping[str, Route]) -> asyncio.Server:
    """Serve ``routes`` (path → coroutine) on ``host:port``: GET and HEAD, one request per connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = False
        try:
            try:
                request = await asyncio.wait_for(_read_request(reader), 10)
            except (asyncio.TimeoutError, ValueError, asyncio.LimitOverrunError) as error:
                response = Response(f"bad request: {error}\n", status=400)
            else:
                method, target = request
                head = method == "HEAD"
                parts = urlsplit(target)
                route = routes.get(parts.path)
                if method not in ("GET", "HEAD"):
                    response = Response("only GET\n", status=405, headers={"Allow": "GET, HEAD"})
                elif route is None:
                    response = Response(f"not found: {parts.path}\n", status=404)
                else:
                    try:
                        response = await route(parts.query)
                    except Exception as error:  # a page that fails says so; the server keeps serving
                        log.exception("status page %s failed", parts.path)
                        response = Response(f"error: {error}\n", status=500)
            body = response.body.encode() if isinstance(response.body, str) else response.body
            lines = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}",
                     f"Content-Type: {response.content_type}", f"Content-Length: {len(body)}",
                     "Cache-Control: no-store", "Connection: close",
                     *(f"{k}: {v}" for k, v in response.headers.items())]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port, limit=16384)


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    line = (await reader.readline()).decode("latin-1").split()
    if len(line) != 3 or not line[2].startswith("HTTP/"):
        raise ValueError("not an HTTP request line")
    for _ in range(100):  # headers: read and ignore
        if (await reader.readline()) in (b"\r\n", b"\n", b""):
            return line[0].upper(), line[1]
    raise ValueError("too many header lines")
