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
the files it reads: every file for a whole topic (each batch's file holds
every topic published in it), and for a GET MESSAGE of given SMUIDs only the
files whose SMUID range, as the Delta log records it, may hold them.  Calls
block on file I/O: run them in a thread (``asyncio.to_thread``), never on
the event loop.

Each topic's Trash (spec 2.2.1, ``<topic>/Trash``) is the job's ``trash``
table: the messages that died unacknowledged, with why (``reason``) and
when (``trashed_at``).  :meth:`MessageStore.messages` reads it for a Trash
path; the job copies into it what LIST and GET show of the message (rows
written before it did are completed from the message's ``messages`` row).

Read at a moment ``now`` (spec 2.4: subscribers must not even know an expired
message existed), a topic holds its *live* messages only: those whose
``expires_at`` is unset (a state message) or after ``now``, and that are not
in the topic's Trash.  The job's clock decides when a message reaches the
Trash; the reader's decides when it leaves the topic, so an expired message
disappears from COUNT / LIST / GET MESSAGE the moment it expires, even while
the job is behind or stopped.
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from delta_edge import dataset, rows_within
from gateway.server.kept_reads import KeptReads
from schemas.config import GatewayConfig
from schemas.smuid import EPOCH_MS, NODE_BITS, SEQUENCE_BITS
from schemas.events import Deliver, Headers, Section
from schemas.topics import trash_of

#: The ``messages`` columns a :class:`StoredMessage` needs (``topic`` is the filter).
COLUMNS = ["smuid", "cmuid", "publisher", "publisher_guid", "priority", "headers", "sections", "accepted_at"]
#: The ``trash`` columns a trashed :class:`StoredMessage` needs (``topic`` is the filter) …
TRASH_COLUMNS = ["smuid", "cmuid", "publisher", "headers", "sections", "reason", "trashed_at"]
#: … and what its ``messages`` row knows, which the job copies to the ``trash`` row (read from
#: ``messages`` for a row written before it did).
ORIGIN_COLUMNS = ["smuid", "publisher_guid", "priority", "accepted_at"]
#: A forwarded message's route (issue 33), read when the table has these columns (older ones do not).
FEDERATION_COLUMNS = ["depth", "hops", "origin", "origin_topic"]
#: The columns of a ``trash`` row copied from its ``messages`` row (``schemas.spark.TRASH_FROM_MESSAGE``,
#: named here because the gateway does not import pyspark; ``tests/unit/test_message_store.py`` checks they agree).
COPIED_TO_TRASH = [*ORIGIN_COLUMNS[1:], *FEDERATION_COLUMNS]


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
    trash_reason: str | None = None  # read from the topic's Trash: why it died ("expired", …)
    trashed_at: int | None = None  # and when: microseconds, the job's clock of that batch
    # the federation fields of :class:`schemas.events.Publish` (a table without them: a local message)
    depth: int = 0
    hops: tuple[str, ...] = ()
    origin: str | None = None
    origin_topic: str | None = None

    def to_deliver(self, account: str) -> Deliver:
        """This message as a :class:`Deliver` to ``account`` (to render it like a NOTIFY)."""
        return Deliver(account, self.smuid, self.topic, self.cmuid, self.publisher, self.publisher_guid,
                       self.accepted_at, self.priority, list(self.headers), list(self.sections),
                       depth=self.depth, hops=list(self.hops), origin=self.origin, origin_topic=self.origin_topic)


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


def _with_micros(rows: pa.Table, *names: str) -> pa.Table:
    """``rows`` with its timestamp columns ``names`` as int64 microseconds."""
    for name in names:
        rows = rows.set_column(rows.schema.get_field_index(name), name, _micros(rows.column(name)))
    return rows


def _smuid_micros(smuid: int) -> int:
    """When the gateway made ``smuid`` (its millisecond part, :mod:`gateway.ids`), in microseconds."""
    return ((smuid >> (NODE_BITS + SEQUENCE_BITS)) + EPOCH_MS) * 1000


def _stored(row: dict, topic: str, origin: dict) -> StoredMessage:
    """A ``messages`` row (``origin`` is the row itself), or a ``trash`` row completed by its
    message's ``messages`` row ``origin`` (``{}`` when that is gone), decoded."""
    return StoredMessage(
        smuid=row["smuid"],
        topic=topic,
        cmuid=row["cmuid"] or "",
        publisher=row["publisher"] or "",
        publisher_guid=origin.get("publisher_guid") or "",
        accepted_at=origin.get("accepted_at") or _smuid_micros(row["smuid"]),
        priority=origin.get("priority") or 0,
        headers=_headers(row["headers"]),
        sections=[_section(s) for s in row["sections"] or ()],
        trash_reason=row.get("reason"),
        trashed_at=row.get("trashed_at"),
        depth=origin.get("depth") or 0,
        hops=tuple(origin.get("hops") or ()),
        origin=origin.get("origin"),
        origin_topic=origin.get("origin_topic"),
    )


def _live(rows: pa.Table, now: int, trashed: pa.Array) -> pa.ChunkedArray:
    """Per ``messages`` row: live at ``now`` (µs) — no expiry (a state message) or one after ``now``,
    and not among the ``trashed`` SMUIDs (spec 2.4; the job's rule is ``expires_at <= now``: dead)."""
    expires = _micros(rows.column("expires_at"))
    unexpired = pc.or_kleene(pc.is_null(expires), pc.greater(expires, pa.scalar(now, pa.int64())))
    return pc.and_(pc.fill_null(unexpired, False), pc.invert(pc.is_in(rows.column("smuid"), value_set=trashed)))


def _present(table: DeltaTable, names: list[str]) -> list[str]:
    """Those of ``names`` that are columns of ``table`` (a table the job wrote before a column was
    added has not got it)."""
    have = {field.name for field in table.schema().fields}
    return [name for name in names if name in have]


def _unique(rows: pa.Table) -> list[dict]:
    """The rows by ascending SMUID, one per SMUID (the sink writes each once; never show one twice)."""
    out: list[dict] = []
    for row in rows.sort_by("smuid").to_pylist():
        if not out or out[-1]["smuid"] != row["smuid"]:
            out.append(row)
    return out


class MessageStore:
    """The committed messages of each topic, and of each topic's Trash, read from the job's Delta tables.

    ``messages_path`` / ``deliveries_path`` / ``trash_path``: the tables'
    locations (``SMQPConfig.table_path("messages")`` …; the Trash defaults to
    the ``trash`` table beside ``messages``).  ``deliveries`` is not read yet;
    it is kept for queries about who has acknowledged what.  Reads of a table's
    latest version are kept, up to ``kept_bytes`` in all, for the polls that
    repeat them (:mod:`gateway.server.kept_reads`).  Safe to call from several
    threads at once.
    """

    def __init__(self, messages_path: str, deliveries_path: str, trash_path: str | None = None,
                 kept_bytes: int = GatewayConfig.kept_read_bytes):
        self.messages_path = messages_path
        self.deliveries_path = deliveries_path
        self.trash_path = trash_path or str(Path(messages_path).with_name("trash"))
        self._lock = threading.Lock()
        self._kept = KeptReads(kept_bytes)
        self._tables: dict[str, DeltaTable] = {}
        self._datasets: dict[str, tuple[int, ds.Dataset]] = {}  # table URI → (its version, its dataset)

    def _current(self, path: str) -> DeltaTable | None:
        """The table at ``path`` at its latest version; None while the job has not created it."""
        table = self._tables.get(path)
        if table is None:
            try:
                table = self._tables[path] = DeltaTable(path)
            except TableNotFoundError:
                return None
        else:
            table.update_incremental()
        return table

    def _rows(self, table: DeltaTable, columns: list[str], topic: str, span: tuple[int, int] | None) -> pa.Table:
        """``columns`` of ``table``'s rows of canonical ``topic``; with ``span`` (first, last), only those
        of SMUIDs between them, read from the files that may hold them (:func:`delta_edge.rows_within`).
        Call with the lock held."""
        return self._kept.read(table.table_uri, table.version(), (tuple(columns), topic, span),
                               lambda: self._read_files(table, columns, topic, span))

    def _read_files(self, table: DeltaTable, columns: list[str], topic: str,
                    span: tuple[int, int] | None) -> pa.Table:
        if span is not None:
            low, high = span
            return rows_within(table, columns, [("topic", "=", topic), ("smuid", ">=", low), ("smuid", "<=", high)])
        return self._dataset(table).to_table(columns=columns, filter=ds.field("topic") == topic)

    def _dataset(self, table: DeltaTable) -> ds.Dataset:
        """``table``'s dataset (:func:`delta_edge.dataset`), made once a version: making one makes a
        fragment for every file (~0.8 ms a file on this host), and a client polling a topic reads it
        several times between two commits of the job.  Call with the lock held."""
        version = table.version()
        cached = self._datasets.get(table.table_uri)
        if cached is None or cached[0] != version:
            cached = self._datasets[table.table_uri] = (version, dataset(table))
        return cached[1]

    def messages(self, topic: str, now: int | None = None,
                 span: tuple[int, int] | None = None) -> list[StoredMessage]:
        """Every committed message of canonical ``topic`` (exact match), by ascending SMUID, only
        those live at ``now`` (microseconds; None: the whole history, dead ones included); for a
        Trash path (``<topic>/Trash``, :func:`schemas.topics.trash_topic`) the messages in that
        topic's Trash instead.  ``span`` (first, last): only those of SMUIDs between them, which a
        GET MESSAGE of given SMUIDs reads from the few files that hold them."""
        owner = trash_of(topic)
        if owner is not None:
            return self.trashed(owner, span)
        rows = self._topic_rows(topic, COLUMNS, now, optional=FEDERATION_COLUMNS, span=span)
        if rows is None:
            return []
        return [_stored(row, topic, row) for row in _unique(_with_micros(rows, "accepted_at"))]

    def smuids(self, topic: str, now: int | None = None) -> list[int]:
        """The SMUIDs of what :meth:`messages` reads for ``topic`` at ``now``, ascending, once each:
        what ``COUNT MESSAGE`` counts, read from one column (and ``expires_at``).  (Decoding every
        message to count them took two thirds of a gateway's CPU while a client counted a topic of
        40,000 now and then.)"""
        owner = trash_of(topic)
        if owner is not None:
            with self._lock:
                smuids = self._trashed_smuids(owner)
        else:
            rows = self._topic_rows(topic, ["smuid"], now)
            if rows is None:
                return []
            smuids = rows.column("smuid")
        return pc.unique(smuids).sort().to_pylist()

    def _topic_rows(self, topic: str, columns: list[str], now: int | None,
                    optional: list[str] = (), span: tuple[int, int] | None = None) -> pa.Table | None:
        """``columns`` of canonical ``topic``'s ``messages`` rows (of SMUIDs within ``span``, if
        given), and those of ``optional`` the table has, only the rows live at ``now`` (None: all);
        None while the job has not created the table."""
        with self._lock:
            table = self._current(self.messages_path)
            if table is None:
                return None
            columns = [*columns, *_present(table, optional)]
            if now is None:
                return self._rows(table, columns, topic, span)
            rows = self._rows(table, [*columns, "expires_at"], topic, span)
            trashed = self._trashed_smuids(topic, span)
        return rows.filter(_live(rows, now, trashed)).drop_columns(["expires_at"])

    def _trashed_smuids(self, topic: str, span: tuple[int, int] | None = None) -> pa.Array:
        """The SMUIDs in canonical ``topic``'s Trash (within ``span``, if given; call with the lock held)."""
        trash = self._current(self.trash_path)
        if trash is None:
            return pa.array([], pa.int64())
        return self._rows(trash, ["smuid"], topic, span).column("smuid").combine_chunks()

    def trashed(self, topic: str, span: tuple[int, int] | None = None) -> list[StoredMessage]:
        """The messages in canonical ``topic``'s Trash (of SMUIDs within ``span``, if given), by
        ascending SMUID, with why and when.

        One narrow read of the topic's ``trash`` rows, which carry what LIST and GET show of their
        message (the job copies its publisher GUID, priority, acceptance time and route from its
        ``messages`` row).  Only rows written before it did are completed from ``messages``, by
        topic and SMUID range: reading ``messages`` for every row put a Trash's listing 0.2-0.5 s
        behind the job's commit of it.  A message whose ``messages`` row is gone still shows, with
        its SMUID's time.
        """
        with self._lock:
            trash = self._current(self.trash_path)
            if trash is None:
                return []
            copied = _present(trash, COPIED_TO_TRASH)
            rows = self._rows(trash, [*TRASH_COLUMNS, *copied], topic, span)
            if not rows.num_rows:
                return []
            older = rows if "accepted_at" not in copied else rows.filter(pc.is_null(rows.column("accepted_at")))
            origins = self._origins(topic, older) if older.num_rows else None
        found = {} if origins is None else {o["smuid"]: o for o in _with_micros(origins, "accepted_at").to_pylist()}
        rows = _with_micros(rows, "trashed_at", *(["accepted_at"] if "accepted_at" in copied else []))
        return [_stored(row, topic, found.get(row["smuid"]) or (row if row.get("accepted_at") is not None else {}))
                for row in _unique(rows)]

    def _origins(self, topic: str, rows: pa.Table) -> pa.Table | None:
        """The ``messages`` rows' :data:`ORIGIN_COLUMNS` (and route) of the SMUIDs of ``rows`` (call
        with the lock held); None while there is no ``messages`` table."""
        messages = self._current(self.messages_path)
        if messages is None:
            return None
        span = tuple(bound.as_py() for bound in pc.min_max(rows.column("smuid")).values())
        return self._rows(messages, [*ORIGIN_COLUMNS, *_present(messages, FEDERATION_COLUMNS)], topic, span)
