"""DELIVERY ONE's in-flight limit: who holds each message the batch picked, handed on, cleared or left
waiting (:func:`streaming.dispatch.assign` decides), and the batch's rows and Delivers rewritten to match.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder

from schemas.events import Deliver, Section
from streaming import dispatch
from streaming.sink.records import SMUID_FIELD, events_of


_ACCOUNT_TOPIC = r"^/accounts/[^/]+$"

#: Statuses of the non-new ``deliveries`` rows that end a stored delivery in this batch.
_SETTLING = ["acked", "expired", "trashed", "released", "cleared"]


def _picked_one(deliveries: pa.Table) -> pa.Table:
    """The routing query's new, unacknowledged DELIVERY ONE deliveries (not those of account topics,
    which have one possible holder, their owner)."""
    mask = pc.and_(pc.and_(deliveries.column("is_new"), pc.equal(deliveries.column("status"), "pending")),
                   pc.and_(pc.equal(deliveries.column("delivery"), "one"),
                           pc.not_equal(deliveries.column("account"), "")))
    mask = pc.and_(mask, pc.invert(pc.match_substring_regex(deliveries.column("topic"), _ACCOUNT_TOPIC)))
    return deliveries.filter(pc.fill_null(mask, False))


def _withheld_one(deliveries: pa.Table) -> dict[int, str]:
    """smuid → account of the batch's DELIVERY ONE deliveries a SINCE later in the batch withheld
    (new rows, status ``cleared``)."""
    rows = deliveries.filter(pc.fill_null(pc.and_(
        pc.and_(deliveries.column("is_new"), pc.equal(deliveries.column("status"), "cleared")),
        pc.equal(deliveries.column("delivery"), "one")), False))
    return dict(zip(rows.column("smuid").to_pylist(), rows.column("account").to_pylist()))


def _is_settlement(deliveries: pa.Table) -> pa.ChunkedArray:
    """Which rows update a stored delivery (not ``is_new``)."""
    return pc.invert(pc.fill_null(deliveries.column("is_new"), False))


def _settlements(deliveries: pa.Table) -> dict[tuple[str, int], str]:
    """(account, smuid) → status of the stored deliveries this batch ends (ACKed, expired, …)."""
    rows = deliveries.filter(pc.and_(_is_settlement(deliveries),
                                     pc.is_in(deliveries.column("status"), pa.array(_SETTLING))))
    return {(a, s): status for a, s, status in zip(rows.column("account").to_pylist(), rows.column("smuid").to_pylist(),
                                                   rows.column("status").to_pylist())}


def _settled_nobody(deliveries: pa.Table) -> set[int]:
    """The messages of account ``''`` rows this batch expires or trashes: none of them is dispatched."""
    rows = deliveries.filter(pc.and_(pc.equal(deliveries.column("account"), ""),
                                     pc.is_in(deliveries.column("status"), pa.array(["expired", "trashed"]))))
    return set(rows.column("smuid").to_pylist())


def _micros(value: datetime | int | None) -> int | None:
    """A timestamp as microseconds since the epoch (ints pass through)."""
    if value is None or isinstance(value, int):
        return value
    return int(value.timestamp() * 1_000_000) if value.tzinfo else int(
        value.replace(tzinfo=timezone.utc).timestamp() * 1_000_000)


def _record_smuids(records: pa.Table) -> pa.Array:
    """The smuid of each Deliver/Acked record (a top-level field; nested quotes are escaped)."""
    found = pc.struct_field(pc.extract_regex(records.column("value"), SMUID_FIELD), [0])
    return pc.cast(found, pa.int64())


def _picked_messages(deliver: pa.Table) -> dict[int, dict]:
    """smuid → the batch's DELIVERY ONE Deliver records (as JSON objects): when the message was
    accepted, its Depth and Hops."""
    ones = deliver.filter(pc.match_substring(deliver.column("value"), '"delivery":"one"'))
    return {event["smuid"]: event for event in map(json.loads, ones.column("value").to_pylist())}


def _delivery_row(message: dict, account: str, status: str, batch_id: int, routed_at: datetime,
                  is_new: bool) -> dict:
    """A ``deliveries`` output row (:data:`OUTPUTS`) of a stored DELIVERY ONE message."""
    return {"account": account, "smuid": message["smuid"], "topic": message["topic"],
            "priority": message["priority"], "status": status, "routed_at": routed_at,
            "routed_batch_id": batch_id, "acked_at": None, "acked_guid": None, "expires_at": message["expires_at"],
            "retries": None, "receipt": message["receipt"] or "none", "delivery": "one", "is_new": is_new}


def _deliver_record(message: dict, account: str) -> dict:
    """The ``smqp.deliveries`` record (:data:`streaming.routing.KAFKA_OUT`) of a stored message for ``account``."""
    event = Deliver(account=account, smuid=message["smuid"], topic=message["topic"], cmuid=message["cmuid"],
                    publisher=message["publisher"], publisher_guid=message["publisher_guid"],
                    accepted_at=_micros(message["accepted_at"]), priority=message["priority"] or 0,
                    headers=[tuple(h) for h in message["headers"] or []],
                    sections=[Section.from_json(s) for s in message["sections"] or []], delivery="one",
                    expires_at=_micros(message["expires_at"]), depth=message["depth"] or 0,
                    hops=list(message["hops"] or []), origin=message["origin"], origin_topic=message["origin_topic"])
    return {"key": account.encode(), "value": event.to_bytes().decode(), "seq": None}


def _rehold(deliveries: pa.Table, picked: pa.Table, holders: dict[int, str | None], dispatched: dict[int, dict],
            unplaced: dict[int, dict], batch_id: int, routed_at: datetime) -> tuple[pa.Table, set[int]]:
    """The batch's ``deliveries`` rows with each pick whose holder ``holders`` changed moved to it (or,
    with no holder, replaced by a ``waiting`` row of account ``''``), plus a pending row and a
    ``routed`` one for each ``dispatched`` message and a ``waiting`` one for each ``unplaced`` one
    (smuid → its message: waiting, or cleared away from its holder); and which picks changed."""
    picks = picked.to_pylist()
    changed = {row["smuid"] for row in picks if holders.get(row["smuid"], row["account"]) != row["account"]}
    waits = sorted(smuid for smuid in changed if holders[smuid] is None)
    rows = [dict(row, account=holders[row["smuid"]] or "", status="waiting" if holders[row["smuid"]] is None
                 else row["status"]) for row in picks if row["smuid"] in changed]
    for smuid, message in sorted(dispatched.items()):
        rows.append(_delivery_row(message, holders[smuid], "pending", batch_id, routed_at, True))
        rows.append(_delivery_row(message, "", "routed", batch_id, routed_at, False))
    rows += [_delivery_row(message, "", "waiting", batch_id, routed_at, True) for _, message in sorted(unplaced.items())]
    smuids, accounts = deliveries.column("smuid"), deliveries.column("account")
    moved_picks = pc.and_(pc.is_in(smuids, pa.array(sorted(changed), pa.int64())),
                          pc.and_(deliveries.column("is_new"), pc.not_equal(accounts, "")))
    redone_nobody = pc.and_(pc.equal(accounts, ""),
                            pc.is_in(smuids, pa.array(waits + sorted(dispatched), pa.int64())))
    kept = deliveries.filter(pc.invert(pc.fill_null(pc.or_(moved_picks, redone_nobody), False)))
    return pa.concat_tables([kept, pa.Table.from_pylist(rows, schema=deliveries.schema)]), changed


def _redeliver(deliver: pa.Table, holders: dict[int, str | None], changed: set[int], added: list[dict]) -> pa.Table:
    """The batch's Deliver records with each ``changed`` pick sent to its new holder (or dropped: it
    waits), plus the ``added`` ones."""
    if not changed and not added:
        return deliver
    smuids = _record_smuids(deliver)
    moving = pc.fill_null(pc.is_in(smuids, pa.array(sorted(changed), pa.int64())), False)
    moved = []
    for record in deliver.filter(moving).to_pylist():
        event = json.loads(record["value"])
        if (holder := holders[event["smuid"]]) is not None:
            event["account"] = holder
            moved.append({**record, "key": holder.encode(), "value": json.dumps(event, separators=(",", ":"))})
    return pa.concat_tables([deliver.filter(pc.invert(moving)),
                             pa.Table.from_pylist(moved + added, schema=deliver.schema)])


class InFlightLimit:
    """DELIVERY ONE's in-flight limit over a batch's outputs (:meth:`limit_in_flight`).

    A mixin of :class:`streaming.sink.command_sink.CommandSink`: it uses the sink's ``config``,
    ``topic_settings`` and ``_waiting`` (whether messages may be waiting for room), the tables of
    :class:`~streaming.sink.tables.DeltaTables` and the reads of :class:`~streaming.sink.reads.StoredReads`.
    """

    def limit_in_flight(self, out: dict[str, pa.Table], records: pa.Table, batch_id: int,
                        routed_at: datetime) -> None:
        """Hold each subscriber to its topics' ``max_in_flight`` unacknowledged DELIVERY ONE messages,
        rewriting ``out`` (:meth:`outputs`) in place.

        The routing query's ONE deliveries (``picked``) and the messages waiting from earlier
        batches (``unrouted`` rows with status ``waiting``) go to :func:`dispatch.assign`: a
        delivery moved to another subscriber changes account in ``deliveries`` and ``deliver``; one
        that must wait becomes a ``waiting`` row of account ``''`` and is not sent; a waiting
        message assigned now gets its delivery and Deliver, and its row becomes ``routed``.  A ONE
        message a SINCE clears away from its holder (stored, or withheld in this batch) is offered
        to the other subscribers the same way.  Nothing is read when the batch has no ONE delivery
        and nothing is known to wait.  A replayed batch
        whose deliveries were committed takes the holders from that commit, so it sends what the
        first attempt recorded.
        """
        deliveries = out["deliveries"]
        picked = _picked_one(deliveries)
        withheld = _withheld_one(deliveries)
        settled = _settlements(deliveries)
        cleared_keys = {key for key, status in settled.items() if status == "cleared"}
        if not picked.num_rows and not withheld and not cleared_keys and self._waiting is False:
            return
        table = self._table("deliveries")
        cleared = {**self._of_delivery_one(table, cleared_keys), **withheld}
        dying = _settled_nobody(deliveries)
        waiting = [smuid for smuid in self._waiting_smuids() if smuid not in dying and smuid not in cleared]
        picks = set(picked.column("smuid").to_pylist())
        if self._done("deliveries", batch_id):
            holders = self._recorded_holders(table, batch_id, picked, cleared)
            messages = self._messages(out, sorted(set(holders) - picks))
        else:
            messages = self._messages(out, waiting + sorted(cleared))  # what may be dispatched or wait
            holders = self._decide_holders(table, out, records, picked, messages, cleared, settled)
        chosen = {smuid for smuid, holder in holders.items() if holder is not None}
        self._waiting = len(holders) > len(chosen) or bool(set(waiting) - set(holders))
        dispatched = sorted(chosen - picks)
        unplaced = sorted(smuid for smuid in cleared if holders.get(smuid) is None)
        out["deliveries"], changed = _rehold(
            deliveries, picked, holders, {s: messages[s] for s in dispatched if s in messages},
            {s: messages[s] for s in unplaced if s in messages}, batch_id, routed_at)
        out["deliver"] = _redeliver(out["deliver"], holders, changed,
                                    [_deliver_record(messages[s], holders[s]) for s in dispatched if s in messages])

    def _messages(self, out: dict[str, pa.Table], smuids: list[int]) -> dict[int, dict]:
        """smuid → message row (``MESSAGES_TABLE`` columns) of ``smuids``: stored, or this batch's."""
        new = out["messages"]
        found = {row["smuid"]: row for row in new.filter(
            pc.is_in(new.column("smuid"), pa.array(sorted(set(smuids)), pa.int64()))).to_pylist()}
        stored = self.stored_messages(sorted(set(smuids) - set(found)))
        return {**{row["smuid"]: row for row in stored.to_pylist()}, **found}

    def _of_delivery_one(self, table: DeltaTable, keys: set[tuple[str, int]]) -> dict[int, str]:
        """smuid → account of those ``keys`` (deliveries a SINCE clears in this batch) that are
        DELIVERY ONE: such a message goes to another subscriber, it was meant for one of them."""
        if not keys:
            return {}
        listed = ", ".join(str(int(smuid)) for smuid in sorted({s for _, s in keys}))
        reader = QueryBuilder().register("deliveries", table).execute(
            f"SELECT account, smuid FROM deliveries WHERE delivery = 'one' AND smuid IN ({listed})")
        stored = pa.table(reader)
        ones = {(a, s) for a, s in zip(stored.column("account").to_pylist(), stored.column("smuid").to_pylist())}
        return {smuid: account for account, smuid in keys if (account, smuid) in ones}

    def _waiting_smuids(self) -> list[int]:
        """The messages waiting for a subscriber with room (``unrouted`` rows with status ``waiting``)."""
        if self._waiting is False:
            return []
        reader = QueryBuilder().register("unrouted", self._table("unrouted")).execute(
            "SELECT smuid FROM unrouted WHERE status = 'waiting'")
        return sorted(set(pa.table(reader).column("smuid").to_pylist()))

    def _recorded_holders(self, table: DeltaTable, batch_id: int, picked: pa.Table,
                          cleared: dict[int, str]) -> dict[int, str | None]:
        """A replay's holders: what this batch's committed deliveries say (a pick, or a message
        ``cleared`` away from its holder, without a row waited)."""
        reader = QueryBuilder().register("deliveries", table).execute(
            "SELECT account, smuid FROM deliveries WHERE delivery = 'one' AND status = 'pending' AND account <> '' "
            f"AND routed_batch_id = {int(batch_id)}")
        recorded = pa.table(reader)
        holders: dict[int, str | None] = {smuid: None for smuid in picked.column("smuid").to_pylist() + list(cleared)}
        holders.update(zip(recorded.column("smuid").to_pylist(), recorded.column("account").to_pylist()))
        return holders

    def _decide_holders(self, table: DeltaTable, out: dict[str, pa.Table], records: pa.Table, picked: pa.Table,
                        unpicked: dict[int, dict], cleared: dict[int, str],
                        settled: dict[tuple[str, int], str]) -> dict[int, str | None]:
        """:func:`dispatch.assign` over this batch's picks and the ``unpicked`` messages (smuid → its
        row): those waiting and those a SINCE ``cleared`` away from their holder (smuid → that
        account, which never gets it back); ``settled``: :func:`_settlements` of the batch."""
        offers = {smuid: dispatch.Offer(smuid, row["topic"], row["priority"] or 0, _micros(row["accepted_at"]),
                                        depth=row["depth"] or 0, hops=tuple(row["hops"] or ()))
                  for smuid, row in unpicked.items()}
        sent = _picked_messages(out["deliver"])
        for row in picked.to_pylist():
            message = sent.get(row["smuid"], {})
            offers[row["smuid"]] = dispatch.Offer(row["smuid"], row["topic"], row["priority"] or 0,
                                                  message.get("accepted_at", 0), picked=row["account"],
                                                  depth=message.get("depth", 0), hops=tuple(message.get("hops", ())))
        if not offers:
            return {}
        pending = pa.table(QueryBuilder().register("deliveries", table).execute(
            "SELECT account, smuid, topic FROM deliveries WHERE status = 'pending' AND delivery = 'one'"))
        in_flight = Counter((a, t) for a, s, t in zip(*(pending.column(c).to_pylist() for c in ("account", "smuid",
                                                                                                 "topic")))
                            if (a, s) not in settled)
        listed = ", ".join(str(int(smuid)) for smuid in sorted(offers))
        released = pa.table(QueryBuilder().register("deliveries", table).execute(
            f"SELECT account, smuid FROM deliveries WHERE status = 'released' AND smuid IN ({listed})"))
        handed_on = set(zip(released.column("account").to_pylist(), released.column("smuid").to_pylist()))
        handed_on |= {key for key, status in settled.items() if status == "released"}
        handed_on |= {(account, smuid) for smuid, account in cleared.items()}
        gone = frozenset(str(e.get("account")) for e in events_of(records, "nack") if e.get("reason") == "disconnect")
        holdings = dispatch.Holdings(in_flight, frozenset(handed_on), gone)
        limit = self.topic_settings.resolve
        return dispatch.assign(offers.values(), self._subscribers(out["subscriptions"]), holdings,
                               lambda topic: limit(topic).max_in_flight, self.config.federation.peers)

    def _subscribers(self, changed: pa.Table) -> list[dispatch.Subscriber]:
        """The active subscriptions at the end of the batch: the stored ones, as this batch left them."""
        rows = {(r["account"], r["pattern"]): r for r in self.active_subscriptions().to_pylist()}
        rows.update({(r["account"], r["pattern"]): r for r in changed.to_pylist()})
        return [dispatch.Subscriber(r["account"], r["pattern"], _micros(r["since"]), _micros(r["until"]))
                for r in rows.values() if r["active"]]
