"""The dashboard's figures from the gateways: their Prometheus status pages scraped and summed
(connections, NOTIFYs in flight, ACK latency histograms, errors per reply code).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import deque
from dataclasses import dataclass

from gateway.metrics import ParsedFamily, histogram_quantile, parse


RECENT_S = 300  # window of the "recent" figures (ACK latency, per-minute rates)


@dataclass
class Scrape:
    url: str
    families: dict[str, ParsedFamily]
    error: str | None = None
    seconds: float = 0.0

    @property
    def up(self) -> bool:
        return self.error is None


def _fetch(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - configured status URLs
        return response.read().decode("utf-8")


async def scrape(url: str, timeout: float) -> Scrape:
    started = time.monotonic()
    try:
        text = await asyncio.wait_for(asyncio.to_thread(_fetch, url, timeout), timeout + 1)
        return Scrape(url, parse(text), seconds=time.monotonic() - started)
    except Exception as error:  # down, slow or not a metrics page: shown as down
        return Scrape(url, {}, error=str(error) or type(error).__name__, seconds=time.monotonic() - started)


def _by_label(families: dict[str, ParsedFamily], name: str, label: str) -> dict[str, float]:
    family = families.get(name)
    out: dict[str, float] = {}
    for _, labels, value in family.samples if family else ():
        out[labels.get(label, "")] = out.get(labels.get(label, ""), 0) + value
    return out


def _scalar(families: dict[str, ParsedFamily], name: str) -> float | None:
    family = families.get(name)
    return sum(v for _, _, v in family.samples) if family and family.samples else None


def _sample(families: dict[str, ParsedFamily], family: str, sample: str) -> float:
    """Sum of the samples named ``sample`` in ``family`` (a histogram's ``_sum`` / ``_count``)."""
    found = families.get(family)
    return sum(v for name, _, v in found.samples if name == sample) if found else 0


def _buckets(families: dict[str, ParsedFamily], name: str) -> dict[float, float]:
    family = families.get(name)
    out: dict[float, float] = {}
    for sample, labels, value in family.samples if family else ():
        if sample == f"{name}_bucket":
            bound = float(labels["le"])
            out[bound] = out.get(bound, 0) + value
    return out


def summarize_gateway(scraped: Scrape) -> dict:
    f = scraped.families
    return {
        "url": scraped.url, "up": scraped.up, "error": scraped.error, "scrape_s": scraped.seconds,
        "connections": _scalar(f, "smqp_gateway_connections"),
        "logins": _scalar(f, "smqp_gateway_logins"),
        "notify_in_flight": _scalar(f, "smqp_gateway_notify_in_flight"),
        "notify_queued": _scalar(f, "smqp_gateway_notify_queued"),
        "frames_in": _by_label(f, "smqp_gateway_frames_in_total", "verb"),
        "frames_out": _by_label(f, "smqp_gateway_frames_out_total", "verb"),
        "errors": _by_label(f, "smqp_gateway_errors_total", "code"),
        "ack_buckets": _buckets(f, "smqp_gateway_ack_latency_seconds"),
        "ack_count": _sample(f, "smqp_gateway_ack_latency_seconds", "smqp_gateway_ack_latency_seconds_count"),
        "ack_sum": _sample(f, "smqp_gateway_ack_latency_seconds", "smqp_gateway_ack_latency_seconds_sum"),
    }


def _add(into: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    for key, value in more.items():
        into[key] = into.get(key, 0) + value
    return into


def ack_buckets(gateways: list[dict]) -> dict[float, float]:
    """The cumulative NOTIFY -> ACK histogram of the gateways that answered, merged."""
    buckets: dict[float, float] = {}
    for gateway in gateways:
        if gateway["up"]:
            _add(buckets, gateway["ack_buckets"])
    return buckets


def latency_quantiles(buckets: dict[float, float]) -> dict:
    """count / p50 / p99 (seconds) of a cumulative histogram."""
    return {"count": max(buckets.values(), default=0),
            "p50": histogram_quantile(0.5, buckets.items()), "p99": histogram_quantile(0.99, buckets.items())}


def recent_ack_latency(snapshots: deque, window: float = RECENT_S) -> dict:
    """NOTIFY -> ACK over the last ``window`` seconds: the gateways' histogram now less the one scraped
    ``window`` ago (everything they counted, when the dashboard has not watched that long).

    Timed by the gateway from the NOTIFY the client got to its ACK, never from the job's record of the
    delivery: a gateway NOTIFYs a DELIVERY ALL message before the job routes it (route_early), so that
    record may come after the ACK.  A count that went down (a gateway restarted, or did not answer)
    makes the histogram now stand alone.  ``snapshots``: (time, buckets), oldest first; those older
    than the baseline are dropped."""
    newest_t, newest = snapshots[-1]
    while len(snapshots) > 2 and snapshots[1][0] <= newest_t - window:
        snapshots.popleft()
    oldest_t, oldest = snapshots[0]
    baseline = oldest if oldest_t <= newest_t - window else {}
    recent = {bound: count - baseline.get(bound, 0) for bound, count in newest.items()}
    if set(baseline) - set(newest) or any(count < 0 for count in recent.values()):
        recent = dict(newest)
    return latency_quantiles(recent)


def gateway_totals(gateways: list[dict]) -> dict:
    up = [g for g in gateways if g["up"]]
    buckets = ack_buckets(gateways)
    count = sum(g["ack_count"] for g in up)
    frames_in: dict[str, float] = {}
    errors: dict[str, float] = {}
    for gateway in up:
        _add(frames_in, gateway["frames_in"])
        _add(errors, gateway["errors"])
    return {
        "up": len(up), "configured": len(gateways),
        "connections": sum(g["connections"] or 0 for g in up),
        "logins": sum(g["logins"] or 0 for g in up),
        "notify_in_flight": sum(g["notify_in_flight"] or 0 for g in up),
        "notify_queued": sum(g["notify_queued"] or 0 for g in up),
        "frames_in": frames_in, "errors": errors, "errors_total": sum(errors.values()),
        "ack_latency_s": {"count": count, "mean": (sum(g["ack_sum"] for g in up) / count) if count else None,
                          "p50": histogram_quantile(0.5, buckets.items()),
                          "p99": histogram_quantile(0.99, buckets.items())},
    }
