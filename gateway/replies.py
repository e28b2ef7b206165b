"""SMQP reply codes (spec Appendix A) and the one place replies become bytes.

Every other module names codes through these constants, never as bare
numbers.  A reply is a value, :class:`Reply`, rendered by
:meth:`Reply.to_bytes` only:

* every line but the last is ``<code>-<text>``, the last ``<code> <text>``
  (Appendix A's multi-line format);
* every server frame ends with one empty line.  The spec's examples show
  ``S:`` (an empty line) after each reply; only its abbreviated LOGIN
  transcript in 4.1.1 leaves it out (``S: 200 OK`` straight after
  ``LOGIN``).  We are uniform, so a client can always read "reply lines,
  then an empty line", and clients that skip empty lines between frames
  lose nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

OK = 200

ACK = 310
REDIRECT = 311

BAD_REQUEST = 400
UNAUTHORIZED = 401
TOPIC_TOO_LONG = 402
FORBIDDEN = 403
NOT_FOUND = 404
NOT_ALLOWED = 405
NOT_ACCEPTABLE = 406
PROXY_AUTHENTICATION_REQUIRED = 407
REQUEST_TIMEOUT = 408
CONFLICT = 409
LENGTH_REQUIRED = 410
ENTITY_TOO_LARGE = 413
RESOURCE_TOO_LARGE = 414
UNSUPPORTED_MEDIA_TYPE = 415

INTERNAL_ERROR = 500
NOT_IMPLEMENTED = 501
BAD_GATEWAY = 502
SERVICE_UNAVAILABLE = 503
VERSION_NOT_SUPPORTED = 505
# Not in Appendix A's list, but 4.1.9.1 answers ``SUB MESSAGE /*`` with it.
MAX_QUANTITIES_EXCEEDED = 510

#: The reply text Appendix A recommends for each code (4.1.9.1 for 510).
PHRASES = MappingProxyType({
    OK: "OK",
    ACK: "Acknowledgement receipt",
    REDIRECT: "Redirect request",
    BAD_REQUEST: "Bad request",
    UNAUTHORIZED: "Unauthorized",
    TOPIC_TOO_LONG: "Topic too long",
    FORBIDDEN: "Forbidden",
    NOT_FOUND: "Not found",
    NOT_ALLOWED: "Not allowed",
    NOT_ACCEPTABLE: "Not acceptable",
    PROXY_AUTHENTICATION_REQUIRED: "Proxy authentication required",
    REQUEST_TIMEOUT: "Request timeout",
    CONFLICT: "Conflict",
    LENGTH_REQUIRED: "Length required",
    ENTITY_TOO_LARGE: "Entity too large",
    RESOURCE_TOO_LARGE: "Resource too large",
    UNSUPPORTED_MEDIA_TYPE: "Unsupported media type (MIME)",
    INTERNAL_ERROR: "Internal server error",
    NOT_IMPLEMENTED: "Not implemented",
    BAD_GATEWAY: "Bad gateway",
    SERVICE_UNAVAILABLE: "Service unavailable",
    VERSION_NOT_SUPPORTED: "SMQP version not supported",
    MAX_QUANTITIES_EXCEEDED: "Maximum quantities exceeded",
})


@dataclass(frozen=True)
class Reply:
    """One server reply: a code and one or more text lines."""

    code: int
    lines: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.lines:
            raise ValueError("a reply needs at least one line")
        joined = "".join(self.lines)
        if "\r" in joined or "\n" in joined:
            raise ValueError("reply lines must not contain CR or LF")

    def to_bytes(self) -> bytes:
        """Render as Appendix A's multi-line format plus the frame's empty line."""
        code, lines = self.code, self.lines
        last = f"{code} {lines[-1]}\r\n\r\n"
        if len(lines) == 1:
            return last.encode("utf-8")
        return ("".join([f"{code}-{line}\r\n" for line in lines[:-1]]) + last).encode("utf-8")

    @classmethod
    def ok(cls, *lines: str) -> Reply:
        """``200 OK``, or ``200-OK`` followed by ``lines`` (the last one ``200 …``)."""
        return cls(OK, ("OK", *lines))

    @classmethod
    def ack(cls, smuid: str = "") -> Reply:
        """The server's ``310 ACK``, the second phase of a NOTIFY's acknowledgement;
        ``310 ACK <smuid>`` when the client named the NOTIFY (the SET NOTIFY WINDOW extension)."""
        return cls(ACK, (f"ACK {smuid}" if smuid else "ACK",))

    @classmethod
    def error(cls, code: int, detail: str = "") -> Reply:
        """``<code> <phrase>``, or ``<code> <phrase> (<detail>)`` as in the spec's code lists."""
        phrase = PHRASES[code]
        return cls(code, (f"{phrase} ({detail})" if detail else phrase,))
