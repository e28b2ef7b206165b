"""What a batch's Kafka records say, read on the driver before routing: its clock, the kinds of command
it holds and what they name.

Cheap reads (regexes over the JSON text, or decoding only the rare kinds): they decide which steps
the routing query (:mod:`streaming.sink.query`) needs and which stored rows to read for it.
"""

from __future__ import annotations

import contextlib
import json
import re

import pyarrow as pa
import pyarrow.compute as pc

from schemas.events import Ack, Nack, Publish, RemoveTopic, Subscribe, Unsubscribe


def any_record(records: pa.Table, pattern: str) -> bool:
    """Whether the value of any of the batch's records matches the regex ``pattern``."""
    values = pc.cast(records.column("value"), pa.string())
    return bool(records.num_rows) and pc.any(pc.match_substring_regex(values, pattern)).as_py()


_ONE = re.compile(r'"delivery"\s*:\s*"one"')


def has_delivery_one(records: pa.Table) -> bool:
    """Whether a record of the batch may be a DELIVERY ONE publish (a cheap over-approximation:
    a false positive only keeps the pick-one step in the plan)."""
    return any_record(records, _ONE.pattern)


_RECEIPT = re.compile(r'"receipt"\s*:\s*"(?i:one|all)"')


def asks_for_receipt(records: pa.Table) -> bool:
    """Whether a record of the batch may be a publish asking for a receipt (RECEIPT ONE / ALL; a cheap
    over-approximation: a false positive only keeps the receipt steps in the plan)."""
    return any_record(records, _RECEIPT.pattern)


def batch_now(records: pa.Table) -> int | None:
    """The batch's clock (microseconds): the largest tick ``at`` or ``accepted_at`` among the
    Kafka records ``records`` (their ``value`` column), None when none has one.

    Read from the records themselves, so a replayed batch gets the same "now"
    and expires the same messages (DESIGN Property 4).  The fields are found in
    the JSON text: every event is encoded with its fields at the top level, and
    nested strings are escaped, so ``"at":`` / ``"accepted_at":`` only match
    the event's own fields.
    """
    if not records.num_rows:
        return None
    values = pc.cast(records.column("value"), pa.string())
    found = []
    for pattern in (r'^\{\s*"type"\s*:\s*"tick"\s*,\s*"at"\s*:\s*(?P<n>-?\d+)', r'"accepted_at"\s*:\s*(?P<n>-?\d+)'):
        numbers = pc.struct_field(pc.extract_regex(values, pattern), [0])
        found.append(pc.max(pc.cast(numbers, pa.int64())).as_py())
    found = [n for n in found if n is not None]
    return max(found) if found else None


def may_expire(records: pa.Table, now: int | None, pending: pa.Table) -> tuple[bool, bool]:
    """Whether a delivery of this batch (a publish whose ``expires_at`` is at or before ``now``),
    and whether a stored one (``pending``, already read for ``now``), can expire in this batch.

    Only an optimisation: what this rules out is left out of the batch's plan;
    a publish it missed is stored ``pending`` and expires in a later batch.
    """
    if now is None:
        return False, False
    values = pc.cast(records.column("value"), pa.string())
    expiries = pc.struct_field(pc.extract_regex(values, r'"expires_at"\s*:\s*(?P<n>-?\d+)'), [0])
    earliest = pc.min(pc.cast(expiries, pa.int64())).as_py()
    return earliest is not None and earliest <= now, pending.num_rows > 0


def of_type(type_: str) -> str:
    """Regex: a record value that is an event of ``type_`` (every event's JSON starts with its type)."""
    return rf'^\{{\s*"type"\s*:\s*"{type_}"'


def _is(records: pa.Table, type_: str) -> pa.ChunkedArray:
    """Which of the batch's records are events of ``type_``."""
    return pc.match_substring_regex(pc.cast(records.column("value"), pa.string()), of_type(type_))


def _events_at(records: pa.Table, type_: str) -> list[tuple[tuple, dict]]:
    """The batch's events of ``type_``, decoded in Python (the pre-reads need only rare kinds), each
    with its position (Kafka timestamp, partition, offset: the order of ``seq``)."""
    chosen = records.filter(_is(records, type_))
    positions = zip(chosen.column("timestamp").to_pylist(), chosen.column("partition").to_pylist(),
                    chosen.column("offset").to_pylist())
    found = []
    for raw, position in zip(chosen.column("value").to_pylist(), positions):
        with contextlib.suppress(ValueError):
            event = json.loads(raw)
            if isinstance(event, dict):
                found.append((position, event))
    return found


def events_of(records: pa.Table, type_: str) -> list[dict]:
    """The batch's events of ``type_``, decoded in Python: the pre-reads need only rare kinds."""
    return [event for _, event in _events_at(records, type_)]


def distinct_fields(events: list[dict], make) -> list:
    """``make(event)`` of each event it fits, sorted and without repeats (malformed events skipped)."""
    made = set()
    for event in events:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            made.add(make(event))
    return sorted(made)


def nacked_keys(records: pa.Table) -> list[tuple[str, int]]:
    """The (account, smuid) pairs the batch's NACK records name."""
    return distinct_fields(events_of(records, "nack"), lambda e: (str(e["account"]), int(e["smuid"])))


def subscribes(records: pa.Table) -> list[tuple[str, str, bool]]:
    """The (account, pattern, with SINCE) of the batch's SUBSCRIBE records."""
    return distinct_fields(events_of(records, "subscribe"),
                   lambda e: (str(e["account"]), str(e["pattern"]), e.get("since") is not None))


def starting(records: pa.Table, subscribed: list[tuple[str, str, bool]], active: pa.Table) -> list[tuple[str, str]]:
    """The (account, pattern) of the batch's SUBSCRIBEs (``subscribed``, :func:`subscribes`) that may start
    a subscription, and so take late messages (:func:`streaming.routing.late`): all but those of a
    subscription ``active`` before the batch whose account UNSUBSCRIBEs nothing in it, which only
    redefine its SINCE/UNTIL.

    Why: looking for late messages reads four tables; a clearing re-SUBSCRIBE spent 66 of its batch's
    ~209 ms there, on both ways of routing, for nothing (``bench-results/since-on-driver-2026-12-07/``)."""
    if not subscribed:
        return []
    active_pairs = set(zip(active.column("account").to_pylist(), active.column("pattern").to_pylist()))
    leaving = set(distinct_fields(events_of(records, "unsubscribe"), lambda e: str(e["account"])))
    return sorted({(account, pattern) for account, pattern, _ in subscribed
                   if (account, pattern) not in active_pairs or account in leaving})


def publish_before_subscribe(records: pa.Table) -> bool:
    """Whether a publish of the batch may precede one of its SUBSCRIBEs (by Kafka timestamp, an
    over-approximation of ``seq`` order): only then can a late subscriber take a message of the
    batch itself."""
    stamps = records.column("timestamp")
    last_subscribe = pc.max(stamps.filter(_is(records, "subscribe"))).as_py()
    first_publish = pc.min(stamps.filter(_is(records, "publish"))).as_py()
    return last_subscribe is not None and first_publish is not None and first_publish <= last_subscribe


def removed_topics(records: pa.Table) -> list[str]:
    """The topics the batch's REMOVE TOPIC records name."""
    return distinct_fields(events_of(records, "remove_topic"), lambda e: str(e["topic"]))


def published_before_removal(records: pa.Table) -> list[int]:
    """The smuids of the batch's publishes that precede (in ``seq`` order) a REMOVE TOPIC of the
    batch naming their topic or an ancestor: the removal orphans them too when nobody holds them."""
    removals = [(at, str(event["topic"]).rstrip("/")) for at, event in _events_at(records, "remove_topic")
                if "topic" in event]
    if not removals:
        return []
    found = set()
    for at, event in _events_at(records, "publish"):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            topic, smuid = str(event["topic"]), int(event["smuid"])
            if any(at < removed_at and (topic == removed or topic.startswith(removed + "/"))
                   for removed_at, removed in removals):
                found.add(smuid)
    return sorted(found)


#: Regex: an event's ``smuid`` field (a top-level one: quotes nested in strings are escaped).
SMUID_FIELD = r'"smuid"\s*:\s*(?P<n>\d+)'


def _smuids_of(records: pa.Table, type_: str) -> list[int]:
    """The smuids the batch's records of ``type_`` name (read by regex, not decoded)."""
    values = pc.cast(records.column("value"), pa.string()).filter(_is(records, type_))
    numbers = pc.struct_field(pc.extract_regex(values, SMUID_FIELD), [0])
    return sorted(set(pc.cast(numbers, pa.int64()).drop_null().to_pylist()))


def acked_smuids(records: pa.Table) -> list[int]:
    """The smuids the batch's ACK records name (common: read by regex, not decoded)."""
    return _smuids_of(records, "ack")


def published_smuids(records: pa.Table) -> list[int]:
    """The smuids of the batch's publishes."""
    return _smuids_of(records, "publish")


def acks_its_own_receipt_publish(records: pa.Table) -> bool:
    """Whether an ACK of the batch names a publish of the same batch that asked for a receipt (a
    gateway routed it early): its receipt may be due now.  Only the receipt-asking publishes are
    read, by regex, so a batch without one costs a scan."""
    values = pc.cast(records.column("value"), pa.string())
    asking = values.filter(pc.and_(_is(records, "publish"), pc.match_substring_regex(values, _RECEIPT.pattern)))
    if not len(asking):
        return False
    smuids = pc.cast(pc.struct_field(pc.extract_regex(asking, SMUID_FIELD), [0]), pa.int64()).drop_null()
    return bool(set(smuids.to_pylist()) & set(acked_smuids(records)))


#: The event types the routing query acts on; the other control events (topic registry, logins,
#: presence) are the gateways' alone.
_ROUTED_TYPES = "|".join(sorted(cls.TYPE for cls in (Publish, Subscribe, Unsubscribe, Ack, Nack, RemoveTopic)))


def nothing_to_route(records: pa.Table) -> bool:
    """True when no record of the batch is an event the job routes: only the clock moved (ticks), or
    only the gateways' control events came (a login's presence, a topic created …)."""
    return bool(records.num_rows) and not any_record(records, of_type(f"({_ROUTED_TYPES})"))


def progress_rows(records: pa.Table) -> list[dict]:
    """:data:`PROGRESS` rows of a batch, computed from its records in Python: how far each partition was read."""
    grouped = records.group_by("partition").aggregate([("offset", "max"), ("offset", "count")])
    return [{"partition": p, "end": m + 1, "records": n} for p, m, n in zip(
        grouped.column("partition").to_pylist(), grouped.column("offset_max").to_pylist(),
        grouped.column("offset_count").to_pylist())]
