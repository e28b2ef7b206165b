"""The link process's ``/metrics`` (Prometheus text) on ``[federation] status_port``.

Per link (a peer's forwarding session, named by the peer's domain, or a remote virtual topic's pull,
``pull:<domain>:<login>``): whether it is logged in, its lag (NOTIFYs received, not yet appended here
or dropped; and in time, how old the last message it appended was by then), what it forwarded, what
it dropped and why (:mod:`federation.inbound`'s reasons), its failed connection attempts, and the
patterns the peer refused (401/404).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.metrics import CONTENT_TYPE, Counter, Gauge, Response, render, serve_http


@dataclass
class LinkState:
    """What one session reports: read by the gauges at each scrape."""

    up: bool = False
    received: int = 0  # NOTIFY MESSAGEs taken in
    settled: int = 0  # of those, appended or dropped
    refused: int = 0  # patterns the peer refused, as of the last reconciliation
    lag_seconds: float = 0.0  # how old the last message appended was when appended (0 before any)

    @property
    def lag(self) -> int:
        return self.received - self.settled

    def appended(self, created: int | None, now: int) -> None:
        """A message was appended here at ``now`` (microseconds): its age then, from its ``Created``
        as the peer rendered it (its publisher's, else when the peer accepted it), is the link's lag
        in time.  Never negative (a peer's clock ahead of this one's); no ``Created``: unchanged."""
        if created is not None:
            self.lag_seconds = max(0, now - created) / 1_000_000


class LinkMetrics:
    """Counters the sessions bump, gauges read from their :class:`LinkState`."""

    def __init__(self):
        self.states: dict[str, LinkState] = {}
        self.forwarded = Counter("smqp_link_forwarded_total",
                                 "Messages of a peer appended to this farm's commands topic.", ("link",))
        self.dropped = Counter("smqp_link_dropped_total",
                               "Messages of a peer dropped: own-origin, looped, depth, seen, malformed.",
                               ("link", "reason"))
        self.connect_failures = Counter("smqp_link_connect_failures_total",
                                        "Attempts to connect and log in to a peer that failed.", ("link",))
        self.families = [
            Gauge("smqp_link_up", "1 while the link is logged in at its peer.",
                  lambda: {(name,): int(state.up) for name, state in self.states.items()}, ("link",)),
            Gauge("smqp_link_lag", "NOTIFYs received from the peer not yet appended or dropped.",
                  lambda: {(name,): state.lag for name, state in self.states.items()}, ("link",)),
            Gauge("smqp_link_lag_seconds", "Age of the last message appended from the peer when appended "
                  "(now - its Created), 0 before any.",
                  lambda: {(name,): state.lag_seconds for name, state in self.states.items()}, ("link",)),
            Gauge("smqp_link_refused_patterns", "Patterns the peer refused (401/404), retried on change.",
                  lambda: {(name,): state.refused for name, state in self.states.items()}, ("link",)),
            self.forwarded, self.dropped, self.connect_failures]

    def state(self, link: str) -> LinkState:
        return self.states.setdefault(link, LinkState())

    def render(self) -> str:
        return render(self.families)


async def serve_metrics(metrics: LinkMetrics, host: str, port: int) -> asyncio.Server:
    """``/metrics`` and ``/healthz`` on ``host:port``."""

    async def page(query: str) -> Response:
        return Response(metrics.render(), CONTENT_TYPE)

    async def health(query: str) -> Response:
        return Response("ok\n")

    return await serve_http(host, port, {"/metrics": page, "/healthz": health})
