"""Receipts on the driver: the receipts a simple batch owes, and each as a message to its publisher.

The Python form of :func:`streaming.routing.receipts_due` and :func:`streaming.routing.receipt_messages`,
for :func:`streaming.simple_batch.route`.  Why: a receipt falling due sent its batch through the
routing query, 4-6 s on this host, where the driver routes a batch in well under a second; and a
broker whose publishers ask for receipts has one due in most batches.  The query stays the
definition: ``tests/streaming/test_simple_batch.py`` proves the two equal.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Container, Iterable, Mapping

import pyarrow as pa

from schemas.smuid import EPOCH_MS, JOB_NODE_ID, MAX_SEQUENCE, compose
from schemas.topics import account_topic

#: The receipt modes that ask for one (``messages.receipt``, lower case).
ASKING = ("one", "all")


@dataclass(frozen=True)
class Due:
    """A receipt this batch owes (:data:`streaming.routing.RECEIPTS_DUE`): ``acked`` of ``targeted``."""

    smuid: int
    mode: str
    acked: int
    targeted: int


def due(state: pa.Table, routed: Iterable[tuple[str, int, str]], acks: Container[tuple[str, int]],
        expiring: Mapping[int, list[str]], receipted: Container[int], messages: Mapping[int, dict]) -> list[Due]:
    """The receipts owed (:func:`streaming.routing.receipts_due`): ``state`` the stored deliveries of the
    messages concerned (:data:`streaming.routing.RECEIPT_STATE`), ``routed`` this batch's new deliveries
    as (account, smuid, receipt), late subscribers' left out as the query leaves them; ``acks`` the
    batch's ACKs by (account, smuid); ``expiring`` smuid → the accounts whose delivery of it expires
    (``''``: nobody's); ``receipted`` the smuids answered already; ``messages`` smuid → its earliest row.

    RECEIPT ONE is due at the first acknowledgement, ALL once every subscriber acknowledged, either
    when the message expires first; a message that reached nobody gets ``0/0`` at its expiry."""
    rows = list(zip(*(state.column(name).to_pylist() for name in ("account", "smuid", "status", "receipt"))))
    stated = {smuid for _, smuid, _, _ in rows}
    owed = []
    for smuid, accounts in expiring.items():
        mode = _mode(messages.get(smuid))
        if "" in accounts and mode in ASKING and smuid not in stated and smuid not in receipted:
            owed.append(Due(smuid, mode, 0, 0))
    targets: dict[int, list[tuple[str, str, str]]] = {}
    for account, smuid, status, receipt in rows + [(account, smuid, "pending", receipt)
                                                   for account, smuid, receipt in routed]:
        if account and receipt in ASKING and status not in (None, "released"):  # SQL: a null compares to nothing
            targets.setdefault(smuid, []).append((account, status, receipt))
    for smuid, held in targets.items():
        mode = max(receipt for _, _, receipt in held)
        acked = sum(1 for account, status, _ in held if status == "acked" or (account, smuid) in acks)
        if ((mode == "one" and acked >= 1) or (mode == "all" and acked == len(held)) or smuid in expiring) \
                and smuid not in receipted:
            owed.append(Due(smuid, mode, acked, len(held)))
    return owed


def _mode(message: dict | None) -> str | None:
    return None if message is None or message["receipt"] is None else message["receipt"].lower()


def answers(owed: list[Due], messages: Mapping[int, dict], now: int | None) -> list[tuple[Due, dict]]:
    """Each receipt owed as a publish to its publisher's account topic
    (:func:`streaming.routing.receipt_messages`): the original's Cmuid, the attributes ``Receipt``,
    ``Receipt-For`` and ``Delivered: X/Y``, ``X/Y`` its text body, and an SMUID of the job's own
    (node :data:`schemas.smuid.JOB_NODE_ID`, the batch's clock, a sequence by original SMUID), so a
    replayed batch makes the same receipt.  The publish has the fields of a decoded ``Publish``."""
    if now is None:
        return []
    made = []
    for sequence, receipt in enumerate(sorted(owed, key=lambda receipt: receipt.smuid)):
        original = messages.get(receipt.smuid)
        if original is None:
            continue
        body = f"{receipt.acked}/{receipt.targeted}"
        publisher = original["publisher"]
        made.append((receipt, {
            "smuid": _job_smuid(now, sequence), "topic": account_topic(publisher),
            "cmuid": original["cmuid"], "account": publisher, "guid": original["publisher_guid"],
            "accepted_at": now, "priority": 0,
            "headers": [["Receipt", receipt.mode.upper()], ["Receipt-For", str(receipt.smuid)], ["Delivered", body]],
            "sections": [{"headers": [["Content-Type", "text/plain"], ["Content-Length", str(len(body))]],
                          "data": base64.b64encode(body.encode()).decode()}],
            "seq": None, "expires_at": None, "receipt": "none", "delivery": "all", "depth": 0, "hops": [],
            "origin": None, "origin_topic": None, "kafka_partition": None, "kafka_offset": None}))
    return made


def _job_smuid(now: int, sequence: int) -> int:
    """The SMUID of the batch's ``sequence``-th receipt (:func:`streaming.routing.receipts.receipt_messages_sql`)."""
    return compose(now // 1000 - EPOCH_MS + sequence // (MAX_SEQUENCE + 1), JOB_NODE_ID, sequence % (MAX_SEQUENCE + 1))


def receipt_row(receipt: Due, message: dict, batch_id: int) -> dict:
    """The ``receipts`` row of ``receipt``, answered by ``message`` (:func:`receipt_rows_sql`)."""
    return {"smuid": receipt.smuid, "publisher": message["account"], "mode": receipt.mode, "acked": receipt.acked,
            "targeted": receipt.targeted, "receipt_smuid": message["smuid"], "receipted_at": message["accepted_at"],
            "batch_id": batch_id}
