"""The dashboard's figures from the link processes (``smqp-link``): their ``/metrics`` pages scraped
(:func:`deploy.dashboard_gateways.scrape`) and read into one row per link.

A link process serves, per link (a peer's forwarding session named by the peer's domain, or a remote
virtual topic's pull, ``pull:<domain>:<login>``; see :mod:`federation.metrics`): ``smqp_link_up``,
``smqp_link_lag`` (NOTIFYs received, not yet appended), ``smqp_link_lag_seconds`` (the age of the last
message appended, when appended), ``smqp_link_forwarded_total``, ``smqp_link_dropped_total`` by
reason, ``smqp_link_connect_failures_total`` and ``smqp_link_refused_patterns``.  A process that does
not answer is one row of its own, ``unreachable``: its links' state is then unknown, not "down".
"""

from __future__ import annotations

from deploy.dashboard_gateways import Scrape
from gateway.metrics import ParsedFamily

#: The families a link process serves, by the key its row gives each (the per-link numbers).
PER_LINK = {"lag": "smqp_link_lag", "lag_seconds": "smqp_link_lag_seconds",
            "forwarded": "smqp_link_forwarded_total", "connect_failures": "smqp_link_connect_failures_total",
            "refused_patterns": "smqp_link_refused_patterns"}


def _per_link(families: dict[str, ParsedFamily], name: str) -> dict[str, float]:
    family = families.get(name)
    return {labels.get("link", ""): value for _, labels, value in family.samples} if family else {}


def _dropped(families: dict[str, ParsedFamily]) -> dict[str, dict[str, float]]:
    """link -> reason -> messages dropped."""
    family = families.get("smqp_link_dropped_total")
    out: dict[str, dict[str, float]] = {}
    for _, labels, value in family.samples if family else ():
        out.setdefault(labels.get("link", ""), {})[labels.get("reason", "")] = value
    return out


def link_rows(scraped: Scrape) -> list[dict]:
    """One row per link the process at ``scraped.url`` reports; one ``unreachable`` row when it did
    not answer.  ``state``: ``up`` (logged in at its peer), ``down`` (retrying) or ``unreachable``."""
    if not scraped.up:
        return [{"process": scraped.url, "link": None, "state": "unreachable", "error": scraped.error}]
    families = scraped.families
    up = _per_link(families, "smqp_link_up")
    figures = {key: _per_link(families, name) for key, name in PER_LINK.items()}
    dropped = _dropped(families)
    rows = []
    for link in sorted(set(up) | set(dropped).union(*figures.values())):
        reasons = dropped.get(link, {})
        rows.append({"process": scraped.url, "link": link, "state": "up" if up.get(link) else "down",
                     "error": None, **{key: values.get(link, 0) for key, values in figures.items()},
                     "dropped": reasons, "dropped_total": sum(reasons.values())})
    return rows


def link_summary(scrapes: list[Scrape]) -> dict:
    """What ``/api/status`` shows of the links: the processes scraped, and every link's row."""
    rows = [row for scraped in scrapes for row in link_rows(scraped)]
    named = [row for row in rows if row["link"] is not None]
    return {
        "processes": [{"url": s.url, "up": s.up, "error": s.error, "scrape_s": s.seconds} for s in scrapes],
        "rows": rows,
        "configured": len(scrapes), "reachable": sum(s.up for s in scrapes),
        "up": sum(row["state"] == "up" for row in named), "total": len(named),
        "forwarded": sum(row["forwarded"] for row in named),
        "dropped": sum(row["dropped_total"] for row in named),
    }
