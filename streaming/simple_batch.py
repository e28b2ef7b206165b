"""The common micro-batch, routed on the driver: publishes, ACKs and (UN)SUBSCRIBEs.

Why: Spark plans the routing query (:func:`streaming.sink.query.batch_sql`) anew for every micro-batch,
and planning alone took 0.4-1.1 s of each (analysis and optimisation of ~26,000 characters of
SQL), then running its dozen stages about as long: a batch took 1.9-2.4 s (p50) however few
commands it held.  Most batches of a broker at work hold only publishes of DELIVERY ALL
messages and the ACKs of their subscribers; for those, the routing query reduces to a lookup of
each publish's subscribers and a join of the ACKs, which this module does in Python over the
batch's decoded records.  Measured with ``python -m deploy.job_latency``: see docs/design.md.

A batch is *simple* (:func:`is_simple`) when it holds no REMOVE TOPIC: publishes (DELIVERY ONE ones
too), ACKs, NACKs (:mod:`streaming.simple_nacks`: retries, and DELIVERY ONE messages handed on),
SUBSCRIBEs and UNSUBSCRIBEs (:mod:`streaming.simple_subscriptions`, late subscribers included; what
a SINCE clears, :mod:`streaming.simple_clearing`), expiry into the Trash and receipts
(:mod:`streaming.simple_receipts`); a REMOVE TOPIC still goes to the routing query, which stays the
definition.  Every output here equals that query's for the same batch and
state: ``tests/streaming/test_simple_batch.py`` proves it by property test.  The subscribers come
from the rule the gateways route early by (:func:`schemas.topics.recipients`).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Container, Mapping

import pyarrow as pa

from schemas.events import Acked, RemoveTopic
from schemas.spark import TRASH_FROM_MESSAGE
from schemas.topics import recipients
from streaming import simple_clearing as clearing
from streaming import simple_nacks as nacks
from streaming import simple_receipts as receipts
from streaming import simple_subscriptions as subs

#: Everything :func:`route` decides, each as the routing query's output of that name.
ROUTED = ("deliver", "acked", "expired", "messages", "trash", "deliveries", "subscriptions", "receipts")


@dataclass(frozen=True)
class Shape:
    """What a batch holds beyond publishes and ACKs, as the sink's reads before routing found it."""

    removals: bool = False  # a REMOVE TOPIC, or a removed topic's message its ACKs may settle


#: How the records of the commands that may make a batch not simple begin (:meth:`schemas.events._Event.head`):
#: the job's reader ends a batch soon after one (``[streaming] max_records_per_query_batch``), so the
#: routing query is not handed a backlog with it.
NOT_SIMPLE_HEADS = (RemoveTopic.head(),)


def is_simple(shape: Shape) -> bool:
    """Whether :func:`route` may route a batch of ``shape`` in place of the routing query."""
    return not shape.removals


def _valid(event: dict) -> bool:
    """A publish, an ACK, a NACK or a (UN)SUBSCRIBE with the fields it needs (:data:`streaming.routing.commands._VALID`;
    other kinds are not routed here)."""
    if event["type"] == "publish":
        return None not in (event["account"], event["smuid"], event["topic"])
    if event["type"] in ("subscribe", "unsubscribe"):
        return None not in (event["account"], event["pattern"])
    return event["type"] in ("ack", "nack") and None not in (event["account"], event["smuid"])


def _first_per(events: list[dict], key) -> dict:
    """``key(event)`` → the first such event by position: a repeat in the batch counts once."""
    first: dict = {}
    for event in sorted(events, key=subs.position):
        first.setdefault(key(event), event)
    return first


def _unguaranteed(headers: list | None) -> bool:
    """``Guarantee: NO`` among ``headers`` (:func:`streaming.routing.commands.unguaranteed_sql`)."""
    return any(len(h) > 1 and h[0] is not None and h[0].lower() in ("guarantee", "guar")
               and h[1] is not None and h[1].strip(" ").upper() == "NO" for h in headers or ())


def _expired(expires_at: int | None, now: int | None) -> bool:
    return None not in (expires_at, now) and expires_at <= now


def pick_order(smuid: int, account: str) -> tuple[int, str]:
    """The order a DELIVERY ONE message's candidate subscribers are picked in, the first getting it:
    :func:`streaming.routing.route.pick_order_sql`."""
    return zlib.crc32(f"{smuid}/{account}".encode()), account


def _json(fields: dict) -> str:
    """``fields`` as Spark's ``to_json`` writes them: compact, null fields left out."""
    return json.dumps({name: value for name, value in fields.items() if value is not None},
                      separators=(",", ":"), ensure_ascii=False)


def _deliver_value(account: str, publish: dict) -> str:
    """The Deliver JSON :func:`streaming.routing.records.deliver_records_sql` writes."""
    sections = [{name: value for name, value in section.items() if value is not None}
                for section in publish["sections"] or []]
    return _json({"type": "deliver", "account": account, "smuid": publish["smuid"], "topic": publish["topic"],
                  "cmuid": publish["cmuid"], "publisher": publish["account"], "publisher_guid": publish["guid"],
                  "accepted_at": publish["accepted_at"], "priority": publish["priority"] or 0,
                  "headers": publish["headers"] or [], "sections": sections,
                  "delivery": _lower(publish["delivery"], "all"), "expires_at": publish["expires_at"],
                  **_federation(publish)})


def _federation(publish: dict) -> dict:
    """The publish's federation fields (:func:`streaming.routing.federation.federation_sql`): a null depth
    read as 0, null hops as none."""
    return {"depth": publish["depth"] or 0, "hops": publish["hops"] or [], "origin": publish["origin"],
            "origin_topic": publish["origin_topic"]}


def _acked_value(account: str, smuid: int) -> str:
    return _json({"type": "acked", "account": account, "smuid": smuid})


def _lower(value: str | None, default: str) -> str:
    return (value if value is not None else default).lower()


def route(events: list[dict], current: pa.Table, pending: pa.Table, stored: pa.Table, batch_id: int,
          routed_at: datetime, now: int | None, new_may_expire: bool = True, one: bool = True,
          peers: Mapping[str, str] = MappingProxyType({}), late_stored: pa.Table | None = None,
          late_held: pa.Table | None = None, receipt_state: pa.Table | None = None,
          receipted: Container[int] = frozenset(), retrying: pa.Table | None = None,
          clearable: pa.Table | None = None) -> dict[str, list[dict]]:
    """The rows of each :data:`ROUTED` output of a simple batch (:func:`is_simple`), as the routing
    query's columns (timestamps as microseconds): ``events`` its records, as :data:`routing.EVENTS` rows in
    Python (``streaming.sink.decoding.decoded_events``), ``current`` the active subscriptions before it
    (``SUBSCRIPTIONS_TABLE`` columns), ``pending`` the stored deliveries that expire by its clock
    ``now`` (:data:`routing.PENDING`), ``stored`` their messages (``MESSAGES_TABLE`` columns);
    ``new_may_expire``: whether a message of the batch may (``streaming.sink.records.may_expire``: when not,
    the query does not look for stored deliveries the batch routes again); ``one``: whether a
    publish may be DELIVERY ONE (``streaming.sink.records.has_delivery_one``: when not, none is treated so);
    ``peers``: the ``[federation] peers`` (account → domain); ``late_stored`` and ``late_held``: the stored
    messages the batch's SUBSCRIBEs may get and which of them their accounts hold
    (``CommandSink.late_candidates``); ``receipt_state`` the stored deliveries of the messages that
    asked for a receipt and may be owed one (``CommandSink.receipt_state``), ``receipted`` those of them
    answered already; ``retrying`` the stored deliveries of the messages the batch's NACKs name
    (``CommandSink.retry_candidates``); ``clearable`` the stored pending deliveries of the accounts
    SUBSCRIBing with SINCE (``CommandSink.clearable``).  A delivery a later SUBSCRIBE of the batch
    clears is withheld (:mod:`streaming.simple_clearing`)."""
    events = [event for event in events if _valid(event)]
    publishes = _first_per([e for e in events if e["type"] == "publish"], lambda e: e["smuid"])
    acks = _first_per([e for e in events if e["type"] == "ack"], lambda e: (e["account"], e["smuid"]))
    spans = subs.intervals(current, [e for e in events if e["type"] in ("subscribe", "unsubscribe")])
    clearings = clearing.clearings(events)
    subscribed = subs.subscribers_at(spans)
    out: dict[str, list[dict]] = {kind: [] for kind in ROUTED}
    out["subscriptions"] = subs.subscription_rows(spans, batch_id)
    routed: set[tuple[str, int]] = set()
    withheld: set[tuple[str, int]] = set()  # routed, but cleared by a later SUBSCRIBE: never sent
    asking: list[tuple[str, int, str]] = []  # (account, smuid, receipt) of the deliveries first routed
    expiring: dict[int, list[str]] = {}  # smuid → the accounts whose delivery of it expires ('': nobody's)
    unreached = []  # publishes that reached nobody and can expire
    for smuid, publish in publishes.items():
        out["messages"].append(_message_row(publish, batch_id))
        at = subs.position(publish)
        reached = recipients(publish["topic"], publish["accepted_at"], lambda pattern: subscribed(pattern, at),
                             publish["depth"] or 0, publish["hops"] or (), peers)
        if one and reached and _lower(publish["delivery"], "all") == "one":
            reached = {min(reached, key=lambda account: pick_order(smuid, account))}
        for account in sorted(reached):
            routed.add((account, smuid))
            asking.append((account, smuid, _lower(publish["receipt"], "none")))
            if _withhold(out, withheld, clearings, publish, account, at, acks, batch_id, routed_at, now):
                continue
            if _deliver(out, publish, account, acks, batch_id, routed_at, now):
                expiring.setdefault(smuid, []).append(account)  # routed already expired: never sent
        if not reached and publish["expires_at"] is not None:
            unreached.append(publish)
    late = _late(spans, publishes, routed, late_stored, late_held, now, peers)
    for given in late:  # never expired: late leaves those out
        routed.add((given.account, given.message["smuid"]))
        message = {**given.message, "seq": given.seq}
        if not _withhold(out, withheld, clearings, message, given.account, subs.position(message), acks, batch_id,
                         routed_at, now):
            _deliver(out, message, given.account, acks, batch_id, routed_at, now)
    late_smuids = {given.message["smuid"] for given in late}
    out["deliveries"] += [{**_SETTLED, "account": "", "smuid": smuid, "status": "routed"} for smuid in late_smuids]
    for publish in unreached:
        if publish["smuid"] not in late_smuids:
            out["deliveries"].append(_unrouted_row(publish, batch_id, routed_at, now))
            if _expired(publish["expires_at"], now):
                expiring.setdefault(publish["smuid"], []).append("")
    for (account, smuid), ack in acks.items():
        out["acked"].append({"key": account.encode(), "value": _acked_value(account, smuid), "seq": ack["seq"]})
        if (account, smuid) not in routed:  # acknowledges a stored delivery (or none: then it updates nothing)
            out["deliveries"].append(_stored_ack_row(ack))
    for account, smuid in _stored_expiring(pending, now, acks, routed - withheld if new_may_expire else set()):
        expiring.setdefault(smuid, []).append(account)
        out["deliveries"].append({**_SETTLED, "account": account, "smuid": smuid, "status": "expired"})
    messages = {}  # smuid → its earliest row, this batch's or stored (a replay may hold both)
    for row in sorted(stored.to_pylist() + out["messages"], key=lambda m: m["batch_id"]):
        messages.setdefault(row["smuid"], row)
    _trash(out, expiring, messages, batch_id, now)
    settled = set(acks) | {(account, smuid) for smuid, accounts in expiring.items() for account in accounts}
    nacked: set[tuple[str, int]] = set()
    if any(event["type"] == "nack" for event in events):
        nacked = _nacks(out, events, retrying, publishes, stored, spans, acks, settled, messages, batch_id,
                        routed_at, now, peers)
    for account, smuid, at in clearing.cleared(spans, clearable, settled | nacked):
        out["deliveries"].append({**_SETTLED, "account": account, "smuid": smuid, "status": "cleared"})
        out["expired"].append(_reason(account, smuid, "cleared", subs.as_seq(at)))
    if receipt_state is not None:
        owed = receipts.due(receipt_state, asking, acks, expiring, receipted, messages)
        _answer(out, receipts.answers(owed, messages, now), acks, batch_id, routed_at, now)
    return out


def _answer(out: dict[str, list[dict]], answers: list[tuple[receipts.Due, dict]], acks: dict, batch_id: int,
            routed_at: datetime, now: int | None) -> None:
    """Each receipt owed, as a message of record, a ``receipts`` row, and a delivery to its publisher's
    account (:func:`streaming.routing.receipts.receipt_rows_sql` and the query's ``receipt_deliveries``)."""
    for receipt, publish in answers:
        out["messages"].append(_message_row(publish, batch_id))
        out["receipts"].append(receipts.receipt_row(receipt, publish, batch_id))
        _deliver(out, publish, publish["account"].lower(), acks, batch_id, routed_at, now)


def _nacks(out: dict[str, list[dict]], events: list[dict], retrying: pa.Table | None, publishes: dict[int, dict],
           stored: pa.Table, spans: list[subs.Interval], acks: dict, settled: set[tuple[str, int]],
           messages: Mapping[int, dict], batch_id: int, routed_at: datetime, now: int | None,
           peers: Mapping[str, str]) -> set[tuple[str, int]]:
    """The batch's NACKs (:mod:`streaming.simple_nacks`): DELIVERY ONE messages handed on (a delivery and
    a Deliver to the new subscriber, ``released`` and an Acked to the old one), and retries counted,
    those out of retries into the Trash.  A delivery routed in this batch carries its count itself.
    ``settled``: the (account, smuid) the batch acknowledges or expires, which NACKs leave alone.
    Returns the (account, smuid) retried or handed on: a SINCE does not clear those."""
    counted = nacks.nacked(events)
    stored_deliveries = [] if retrying is None else nacks.stored_rows(retrying)
    gone = {e["account"] for e in events if e["type"] == "nack" and e["reason"] == "disconnect"}
    first = {**publishes, **{m["smuid"]: m for m in subs.stored_publishes(stored, set())}}  # stored first, as by batch
    handed_on = nacks.released(counted, stored_deliveries, settled, gone, spans, first, pick_order, peers)
    for release in handed_on:
        message = {**first[release.smuid], "delivery": "one"}
        ack = acks.get((release.to, release.smuid))
        out["deliveries"].append(_delivery_row(message, release.to, ack, _unguaranteed(message["headers"]),
                                               batch_id, routed_at, now))
        out["deliver"].append({"key": release.to.encode(), "value": _deliver_value(release.to, message),
                               "seq": release.seq})
        out["deliveries"].append({**_SETTLED, "account": release.account, "smuid": release.smuid,
                                  "status": "released"})
        out["expired"].append(_reason(release.account, release.smuid, "released", release.seq))
    taken = {(release.to, release.smuid) for release in handed_on}  # an ACK of one is on its new row
    out["deliveries"] = [row for row in out["deliveries"]
                         if row["is_new"] or row["status"] != "acked" or (row["account"], row["smuid"]) not in taken]
    new = {(row["account"], row["smuid"]): row for row in out["deliveries"] if row["is_new"] and row["account"]}
    stored_keys = {(account, smuid) for account, smuid, *_ in stored_deliveries}  # a replay: the stored count
    routed_all = [(account, smuid, "pending", None, row["delivery"]) for (account, smuid), row in new.items()
                  if row["delivery"] == "all" and row["status"] != "cleared" and (account, smuid) not in stored_keys]
    touched = {(release.account, release.smuid) for release in handed_on}
    for retry in nacks.retried(counted, stored_deliveries + routed_all, settled, handed_on):
        touched.add((retry.account, retry.smuid))
        row = new.get((retry.account, retry.smuid))
        if row is None:
            out["deliveries"].append({**_SETTLED, "account": retry.account, "smuid": retry.smuid,
                                      "status": "trashed" if retry.dead else "retry", "retries": retry.retries})
        else:
            row["retries"] = retry.retries
            if retry.dead and row["status"] in ("expired", "pending"):
                row["status"] = "trashed"
        if retry.dead:
            out["expired"].append(_reason(retry.account, retry.smuid, "max_retries", retry.seq))
            if (message := messages.get(retry.smuid)) is not None:
                out["trash"].append(_trash_row(message, "max_retries", retry.account, batch_id, now))
    return touched


def _reason(account: str, smuid: int, reason: str, seq: dict | None) -> dict:
    """The Acked record telling ``account``'s gateway its delivery of ``smuid`` ended for ``reason``."""
    return {"key": account.encode(), "value": Acked(account, smuid, reason).to_bytes().decode(), "seq": seq}


def _late(spans: list[subs.Interval], publishes: dict[int, dict], routed: set[tuple[str, int]],
          late_stored: pa.Table | None, late_held: pa.Table | None, now: int | None,
          peers: Mapping[str, str]) -> list[subs.Late]:
    """What the batch's new subscribers get (:func:`simple_subscriptions.late`): its ``publishes``
    and the stored messages, but what they hold or the batch ``routed`` to them already."""
    if not any(interval.from_seq is not None for interval in spans):
        return []  # no SUBSCRIBE: the common batch
    taken = {smuid for _, smuid in routed}
    held = set() if late_held is None else set(zip(late_held.column("account").to_pylist(),
                                                   late_held.column("smuid").to_pylist()))
    candidates = [{**publish, "delivery": _lower(publish["delivery"], "all")} for publish in publishes.values()]
    if late_stored is not None:
        candidates += subs.stored_publishes(late_stored, set(publishes))
    alive = [message for message in candidates if not _expired(message["expires_at"], now)
             and not (message["delivery"] == "one" and message["smuid"] in taken)]  # somebody got it
    return subs.late(spans, alive, held | routed, pick_order, peers)


def _withhold(out: dict[str, list[dict]], withheld: set[tuple[str, int]], clearings: list[clearing.Clearing],
              publish: dict, account: str, at: subs.Position, acks: dict, batch_id: int, routed_at: datetime,
              now: int | None) -> bool:
    """When a later SUBSCRIBE of the batch clears ``publish`` routed to ``account`` at ``at``
    (:func:`simple_clearing.withholds`): its delivery row, ``cleared`` at once, and True.  It is never
    sent, never expires and is never retried; the sink tells the gateways (an ``Acked``)."""
    if not clearing.withholds(clearings, account, publish["topic"], publish["accepted_at"], at):
        return False
    withheld.add((account, publish["smuid"]))
    row = _delivery_row(publish, account, acks.get((account, publish["smuid"])), _unguaranteed(publish["headers"]),
                        batch_id, routed_at, now)
    out["deliveries"].append({**row, "status": "cleared"})
    return True


def _deliver(out: dict[str, list[dict]], publish: dict, account: str, acks: dict, batch_id: int,
             routed_at: datetime, now: int | None) -> bool:
    """``publish`` routed to ``account`` (its ``seq`` the position the records answer): its delivery
    row, its Deliver unless the batch acknowledges it, and its Acked when no ACK will come.  True
    when it was expired already: never sent."""
    smuid = publish["smuid"]
    ack = acks.get((account, smuid))
    unguaranteed = _unguaranteed(publish["headers"])
    out["deliveries"].append(_delivery_row(publish, account, ack, unguaranteed, batch_id, routed_at, now))
    if not unguaranteed and ack is None and _expired(publish["expires_at"], now):
        return True
    if ack is None:
        out["deliver"].append({"key": account.encode(), "value": _deliver_value(account, publish),
                               "seq": publish["seq"]})
    if unguaranteed:  # settled as soon as sent: no ACK will come
        out["acked"].append({"key": account.encode(), "value": _acked_value(account, smuid), "seq": publish["seq"]})
    return False


def _stored_expiring(pending: pa.Table, now: int | None, acks: dict, routed: set) -> list[tuple[str, int]]:
    """(account, smuid) of the stored deliveries that expire in this batch: neither acknowledged nor
    routed again in it (:func:`streaming.routing.expiry.expiring_sql`'s last part)."""
    expires = pending.column("expires_at").cast(pa.int64()).to_pylist()
    return [(account, smuid) for account, smuid, status, expires_at in zip(
        pending.column("account").to_pylist(), pending.column("smuid").to_pylist(),
        pending.column("status").to_pylist(), expires)
        if status in ("pending", "unrouted", "waiting") and _expired(expires_at, now)
        and (account, smuid) not in acks and (account, smuid) not in routed]


def _trash(out: dict[str, list[dict]], expiring: dict[int, list[str]], messages: Mapping[int, dict], batch_id: int,
           now: int | None) -> None:
    """The expired messages into their topics' Trash, and their subscribers told
    (:func:`streaming.routing.expiry.trash_sql`, :func:`streaming.routing.records.expired_records_sql`)."""
    for smuid, accounts in expiring.items():
        out["expired"] += [_reason(account, smuid, "expired", None) for account in accounts if account]
        if (message := messages.get(smuid)) is not None:
            out["trash"].append(_trash_row(message, "undeliverable" if not any(accounts) else "expired", "",
                                           batch_id, now))


def _trash_row(message: dict, reason: str, account: str, batch_id: int, now: int | None) -> dict:
    """``message`` (a ``messages`` row) into its topic's Trash (:func:`streaming.routing.expiry.trash_sql`)."""
    return {"smuid": message["smuid"], "topic": message["topic"], "trash_topic": message["topic"] + "/Trash",
            "reason": reason, "trashed_at": now, "publisher": message["publisher"], "cmuid": message["cmuid"],
            "headers": message["headers"], "sections": message["sections"], "batch_id": batch_id,
            "account": account, **{name: message[name] for name in TRASH_FROM_MESSAGE}}


def _message_row(publish: dict, batch_id: int) -> dict:
    """A ``messages`` row (:func:`streaming.routing.commands.message_rows_sql`)."""
    return {"smuid": publish["smuid"], "topic": publish["topic"], "cmuid": publish["cmuid"],
            "publisher": publish["account"], "publisher_guid": publish["guid"], "priority": publish["priority"],
            "headers": publish["headers"], "sections": publish["sections"], "accepted_at": publish["accepted_at"],
            "kafka_partition": publish["kafka_partition"], "kafka_offset": publish["kafka_offset"],
            "batch_id": batch_id, "expires_at": publish["expires_at"], "receipt": _lower(publish["receipt"], "none"),
            "delivery": _lower(publish["delivery"], "all"), **_federation(publish)}


#: A ``deliveries`` output row's columns no simple batch sets.
_UNSET = {"acked_at": None, "acked_guid": None, "retries": None}

#: A ``deliveries`` output row that settles a stored delivery, but its key and status.
_SETTLED = {**_UNSET, "topic": None, "priority": None, "routed_at": None, "routed_batch_id": None,
            "expires_at": None, "receipt": None, "delivery": None, "is_new": False}


def _delivery_row(publish: dict, account: str, ack: dict | None, unguaranteed: bool, batch_id: int,
                  routed_at: datetime, now: int | None) -> dict:
    """A new delivery (:func:`streaming.routing.delivery_updates.delivery_updates_sql`'s first part),
    acknowledged already when the batch holds its ACK (a gateway routed it early)."""
    acked = ack is not None and (ack["accepted_at"] is not None or ack["guid"] is not None)
    status = ("sent" if unguaranteed else "acked" if acked else
              "expired" if _expired(publish["expires_at"], now) else "pending")
    return {"account": account, "smuid": publish["smuid"], "topic": publish["topic"], "priority": publish["priority"],
            "status": status, "routed_at": routed_at, "routed_batch_id": batch_id,
            "acked_at": ack and ack["accepted_at"], "acked_guid": ack and ack["guid"],
            "expires_at": publish["expires_at"], "retries": None, "receipt": _lower(publish["receipt"], "none"),
            "delivery": _lower(publish["delivery"], "all"), "is_new": True}


def _unrouted_row(publish: dict, batch_id: int, routed_at: datetime, now: int | None) -> dict:
    """The row of a publish that reached nobody and can expire (account ``''``)."""
    return {**_UNSET, "account": "", "smuid": publish["smuid"], "topic": publish["topic"],
            "priority": publish["priority"],
            "status": "expired" if _expired(publish["expires_at"], now) else "unrouted",
            "routed_at": routed_at, "routed_batch_id": batch_id, "expires_at": publish["expires_at"],
            "receipt": None, "delivery": None, "is_new": True}


def _stored_ack_row(ack: dict) -> dict:
    """An ACK of a delivery of an earlier batch: updates its row, never inserts one."""
    return {**_SETTLED, "account": ack["account"], "smuid": ack["smuid"], "status": "acked",
            "acked_at": ack["accepted_at"], "acked_guid": ack["guid"]}
