"""Read-only access to the ``messages`` Delta table, for COUNT / LIST / GET MESSAGE.

The gateway keeps no message store of its own: a publish lives in
``smqp.commands`` until the streaming job commits it, and from then on the
job's ``messages`` Delta table (one row per SMUID, appended per batch, see
:mod:`streaming.sink`) is the store of record, shared by every gateway of a
farm.  So COUNT MESSAGE, LIST MESSAGE and GET MESSAGE (spec 4.1.2.2, 4.1.3.2,
4.1.12.1) read that table.  A message the job has not committed yet is not
seen; the spec allows this, since COUNT "MAY lag" and LIST is "only a snap
shot" of messages that "MAY change in the next fraction of a second".

The table is read with delta-rs (no Spark in the gateway).  The
:class:`~deltalake.DeltaTable` is opened once and brought up to date
incrementally on each later read, so a read costs the new log entries plus
the topic's rows.  Calls block on file I/O: run them in a thread
(``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from schemas.events import Deliver, Headers, Section

#: The ``messages`` columns a :class:`StoredMessage` needs (``topic`` is the filter).
COLUMNS = ["smuid", "cmuid", "publisher", "publisher_guid", "priority", "headers", "sections", "accepted_at"]


@dataclass(frozen=True)
class StoredMessage:
    """One committed message, as the ``messages`` table holds it (section data decoded)."""

    smuid: int
    topic: str  # canonical topic
    cmuid: str
    publisher: str  # the publishing account
    publisher_guid: str
    accepted_at: int  # microseconds since the epoch, UTC (the accepting gateway's clock)
    priority: int
    headers: Headers  # message header attributes, in the publisher's order
    sections: list[Section]

    def to_deliver(self, account: str) -> Deliver:
        """This message as a :class:`Deliver` to ``account`` (to render it like a NOTIFY)."""
        return Deliver(account, self.smuid, self.topic, self.cmuid, self.publisher, self.publisher_guid,
                       self.accepted_at, self.priority, list(self.headers), list(self.sections))


def _headers(value: list | None) -> Headers:
    return [tuple(pair) for pair in value or ()]


def _section(value: dict) -> Section:
    return Section(_headers(value.get("headers")), base64.b64decode(value.get("data") or ""))


def _micros(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A timestamp column as int64 microseconds since the epoch."""
    unit = column.type.unit if pa.types.is_timestamp(column.type) else "us"
    if unit != "us":
        column = pc.cast(column, pa.timestamp("us", tz=column.type.tz))
    return pc.cast(column, pa.int64())


class MessageStore:
    """The committed messages of each topic, read from the job's Delta tables.

    ``messages_path`` / ``deliveries_path``: the tables' locations
    (``SMQPConfig.table_path("messages")`` / ``("deliveries")``).  Only
    ``messages`` is read for now; ``deliveries`` is kept for queries about
    who has acknowledged what.  Safe to call from several threads at once.
    """

    def __init__(self, messages_path: str, deliveries_path: str):
        self.messages_path = messages_path
        self.deliveries_path = deliveries_path
        self._lock = threading.Lock()
        self._messages: DeltaTable | None = None

    def _current(self) -> DeltaTable | None:
        """The messages table at its latest version; None while the job has not created it."""
        if self._messages is None:
            try:
                self._messages = DeltaTable(self.messages_path)
            except TableNotFoundError:
                return None
        else:
            self._messages.update_incremental()
        return self._messages

    def messages(self, topic: str) -> list[StoredMessage]:
        """Every committed message of canonical ``topic`` (exact match), by ascending SMUID."""
        with self._lock:
            table = self._current()
            if table is None:
                return []
            rows = table.to_pyarrow_table(columns=COLUMNS, filters=[("topic", "=", topic)])
        rows = rows.set_column(rows.schema.get_field_index("accepted_at"), "accepted_at",
                               _micros(rows.column("accepted_at")))
        rows = rows.sort_by("smuid")
        out: list[StoredMessage] = []
        for row in rows.to_pylist():
            if out and out[-1].smuid == row["smuid"]:
                continue  # the sink writes each SMUID once; never show a duplicate twice
            out.append(StoredMessage(
                smuid=row["smuid"],
                topic=topic,
                cmuid=row["cmuid"] or "",
                publisher=row["publisher"] or "",
                publisher_guid=row["publisher_guid"] or "",
                accepted_at=row["accepted_at"] or 0,
                priority=row["priority"] or 0,
                headers=_headers(row["headers"]),
                sections=[_section(s) for s in row["sections"] or ()],
            ))
        return out
