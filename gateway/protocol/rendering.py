"""Bytes the server writes besides plain replies: message bodies, NOTIFY frames, stored
messages of GET MESSAGE and the ranges of LIST MESSAGE.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.protocol.framing import CRLF
from gateway.protocol.headers import from_micros
from schemas.events import Deliver, Headers, Section
from schemas.timefmt import format_date_time, format_micros
from schemas.topics import trash_topic


SERVER_BYE = b"NOTIFY SERVER BYE\r\n\r\n"


def render_lines(lines: list[str]) -> bytes:
    return "".join([f"{line}\r\n" for line in lines]).encode("utf-8")


def _section_header_lines(section: Section) -> list[str]:
    """The section's header lines with Content-Length set from its data, so the
    frame can never be miscounted."""
    length, counted, lines = str(len(section.data)), False, []
    for name, value in section.headers:
        if name.lower() == "content-length":
            counted, value = True, length
        lines.append(f"{name}: {value}")
    if not counted:
        lines.append(f"Content-Length: {length}")
    return lines


def render_body(headers: Headers, sections: list[Section]) -> bytes:
    """Header lines, empty line, sections (empty line between), then ``.``.

    The inverse of :class:`MessageFramer`; both PUBLISH and NOTIFY use it.
    """
    return _render_body("".join([f"{n}: {v}\r\n" for n, v in headers]), sections)


def _render_body(head: str, sections: list[Section], tail: str = "") -> bytes:
    """:func:`render_body` after ``head`` (lines already ending in CRLF), then ``tail``:
    the text between the data sections is encoded in one piece each."""
    text = head + "\r\n"
    parts = []
    for index, section in enumerate(sections):
        lines = "".join([f"{line}\r\n" for line in _section_header_lines(section)])
        parts += [(text + "\r\n" + lines + "\r\n" if index else text + lines + "\r\n").encode("utf-8"),
                  section.data]
        text = "\r\n"
    parts.append((text + ".\r\n" + tail).encode("utf-8"))
    return b"".join(parts)


_SERVER_AFFIXED = frozenset({"created", "smuid", "cmuid", "hops"})


def smuid_text(deliver: Deliver, server_host: str) -> str:
    """The ``Smuid:`` value of a delivery: ``<server_host>/<smuid>``, or for a message another farm
    forwarded, its SMUID there (``b.example/123``), so every farm shows a message by one name."""
    return deliver.origin or f"{server_host}/{deliver.smuid}"


def render_notify(deliver: Deliver, server_host: str) -> bytes:
    """NOTIFY MESSAGE in spec 4.1.11.1's order: Created, Smuid, Cmuid, then the
    publisher's other attributes as sent, the sections, ``.``, an empty line.

    A message another farm forwarded shows its topic there (``NOTIFY MESSAGE b.example/stocks/ibm``,
    spec 2.3) and its SMUID there.  ``Depth`` shows the message's depth (:attr:`Deliver.depth`, the
    one truth: a forwarded message's is one less than at its origin) when it is not 0, where the
    publisher put the attribute, else after ``Cmuid``; ``Hops`` (the farms it passed, the 2002 HOPS)
    follows ``Cmuid`` when there are any.  So a farm's link reading this NOTIFY knows how much
    further the message may go and where it has been."""
    created, others, depth_shown = None, [], False
    for name, value in deliver.headers:
        key = name.lower()
        if key == "depth":  # where the publisher put it (4.1.11.1's example), with the value it has now
            if deliver.depth and not depth_shown:
                others.append(f"{name}: {deliver.depth}\r\n")
            depth_shown = True
        elif key not in _SERVER_AFFIXED:
            others.append(f"{name}: {value}\r\n")
        elif key == "created" and created is None:
            created = value
    if created is None:
        created = format_micros(deliver.accepted_at)
    head = (f"NOTIFY MESSAGE {deliver.origin_topic or deliver.topic}\r\nCreated: {created}\r\n"
            f"Smuid: {smuid_text(deliver, server_host)}\r\n"
            f"Cmuid: {deliver.publisher}/{deliver.publisher_guid}/{deliver.cmuid}\r\n"
            f"{_route(deliver, depth_shown)}")
    return _render_body(head + "".join(others), deliver.sections, "\r\n")


def _route(deliver: Deliver, depth_shown: bool) -> str:
    """The ``Depth`` line (unless the publisher's own shows it) and ``Hops`` line of a NOTIFY: none
    for a local message published without Depth."""
    lines = f"Depth: {deliver.depth}\r\n" if deliver.depth and not depth_shown else ""
    return lines + (f"Hops: {','.join(deliver.hops)}\r\n" if deliver.hops else "")


def render_topic_notify(topic: str, action: str) -> bytes:
    """NOTIFY TOPIC (4.1.11.2): ``Action: ADDED | RENAME <new> | DELETED | KEYWORDS <keywords>``."""
    return render_lines([f"NOTIFY TOPIC {topic}", f"Action: {action}"]) + CRLF


def render_subscribers_notify(topic: str, count: int) -> bytes:
    """NOTIFY SUBSCRIBERS (4.1.11.3), in the spec example's short form."""
    return render_lines([f"NOTIFY SUB {topic}", f"COUNT: {count}"]) + CRLF


def render_server_timeout_notify(timeout: str) -> bytes:
    """NOTIFY SERVER TIMEOUT (4.1.11.4.1): the server's default message timeout."""
    return render_lines([f"NOTIFY SERVER TIMEOUT {timeout}"]) + CRLF


#: What a message read from a Trash carries beside its own attributes: why it died and when
#: (a date-time).  Not SMQP's own attributes, so ``X-`` ones (spec 4.1.8.1).
TRASH_REASON, TRASHED = "X-Trash-Reason", "X-Trashed"


def _trash_attributes(message) -> tuple[str, Headers]:
    """(``Topic:`` value, header attributes) of a stored message; from a Trash, the Trash
    path and the why and when first (any the publisher sent under those names dropped)."""
    if message.trash_reason is None:
        return message.origin_topic or message.topic, list(message.headers)
    dead = [(TRASH_REASON, message.trash_reason)]
    if message.trashed_at is not None:
        dead.append((TRASHED, format_date_time(from_micros(message.trashed_at))))
    own = [(n, v) for n, v in message.headers if n.lower() not in (TRASH_REASON.lower(), TRASHED.lower())]
    return trash_topic(message.topic), dead + own


def render_stored(message, server_host: str) -> bytes:
    """One message of a GET MESSAGE reply: ``Topic:``, the NOTIFY attributes, body, ``.``;
    from a Trash, ``X-Trash-Reason`` and ``X-Trashed`` follow ``Cmuid``."""
    topic, headers = _trash_attributes(message)
    notify = render_notify(replace(message.to_deliver(message.publisher), headers=headers), server_host)
    return render_lines([f"Topic: {topic}"]) + notify.split(CRLF, 1)[1][:-len(CRLF)]


def format_ranges(smuids: list[int]) -> str:
    """``[1809, 1810, 1811, 1845]`` → ``1809-1811,1845`` (LIST MESSAGE, 4.1.3.2)."""
    parts: list[str] = []
    ordered = sorted(set(smuids))
    start = 0
    for index in range(1, len(ordered) + 1):
        if index == len(ordered) or ordered[index] != ordered[index - 1] + 1:
            first, last = ordered[start], ordered[index - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = index
    return ",".join(parts)
