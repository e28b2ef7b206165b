"""Which subscribers may get a message under ``[federation] peers``: a peer farm's link only as the
message's Depth and Hops allow (:func:`schemas.topics.forwards`), in SQL.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from pyspark.sql.types import ArrayType, StringType

from streaming.routing.sql import string_literal


#: No ``[federation] peers``: every subscriber may get every message.
NO_PEERS: Mapping[str, str] = MappingProxyType({})

#: SQL: no hops (an empty ``array<string>``), what a message never forwarded carries.
NO_HOPS = f"CAST(array() AS {ArrayType(StringType()).simpleString()})"

#: SQL: a message's federation fields (``schemas.spark.FEDERATION``) of relation ``{r}``, a null depth
#: (a record older than federation) read as 0 and null hops as none.
_FEDERATION = ("coalesce({r}depth, 0) AS depth, coalesce({r}hops, " + NO_HOPS + ") AS hops, "
               "{r}origin AS origin, {r}origin_topic AS origin_topic")


def federation_sql(relation: str = "") -> str:
    """SQL: the message's federation columns of ``relation`` (a name, or ``""``: unqualified)."""
    return _FEDERATION.format(r=f"{relation}." if relation else "")


def forwards_sql(peer_domain: str, depth: str, hops: str) -> str:
    """SQL of :func:`schemas.topics.forwards`: whether a message of ``depth`` and ``hops`` (SQL
    expressions; null read as 0 and none) may go on to the farm ``peer_domain``."""
    passed = f"transform(coalesce({hops}, {NO_HOPS}), _hop -> lower(_hop))"
    return f"(coalesce({depth}, 0) <> 0 AND NOT array_contains({passed}, {string_literal(peer_domain.lower())}))"


def may_receive_sql(account: str, depth: str, hops: str, peers: Mapping[str, str] = NO_PEERS) -> str:
    """SQL: whether subscriber ``account`` (SQL expression) may get a message of ``depth`` and ``hops``:
    an account of ``[federation] peers`` (another farm's link) only when :func:`forwards_sql` allows, any
    other always.  The peers rule of :func:`schemas.topics.recipients`, which the gateways and the
    driver's simple batches apply; each peer a ``WHEN`` of one ``CASE``, built from the configuration,
    and ``TRUE`` with no peers (nothing added to the plan)."""
    if not peers:
        return "TRUE"
    cases = " ".join(f"WHEN {string_literal(peer)} THEN {forwards_sql(domain, depth, hops)}"
                     for peer, domain in sorted(peers.items()))
    return f"coalesce(CASE {account} {cases} ELSE TRUE END, FALSE)"


def and_may_receive(account: str, depth: str, hops: str, peers: Mapping[str, str]) -> str:
    """`` AND`` :func:`may_receive_sql` for a join's condition, or nothing with no peers: a constant
    ``AND TRUE`` there trips Catalyst in :func:`late_sql` ("key not found: smuid")."""
    return f" AND {may_receive_sql(account, depth, hops, peers)}" if peers else ""
