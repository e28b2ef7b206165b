"""The dedup set: which forwarded messages this farm already holds, by origin SMUID and topic.

A message reaches a farm by several routes (a triangle of farms with ``Depth: -1``), and a link that
crashed between its append here and its ``310 ACK`` on the peer gets the same NOTIFY again from the
peer's durable queue.  The set is therefore rebuilt at start from the one place that is durable,
this farm's commands topic: every ``Publish`` there with an ``origin`` (:func:`rebuild`), so a
restarted link neither loses (the peer resends what was not ACKed) nor repeats (what was appended is
dropped and ACKed).  While it runs, :meth:`Seen.claim` keeps two links of this process from
appending one message twice at once.

A key is needed only while its message can come again, and a peer NOTIFYs live messages only (a
dead one is never sent, nor sent again), so each key is forgotten ``grace`` after its message's
expiry here (:meth:`Seen.forget_dead`; ``[federation] seen_grace_s`` covers clocks and default
timeouts that differ between farms).  The set holds what is alive, not every message ever taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from federation.inbound import dedup_key
from kafka_edge import Cluster, Tail
from schemas.config import FederationConfig, KafkaConfig
from schemas.events import Publish, decode

#: A commands record that may be a forwarded publish: its JSON starts so, and has an origin string
#: (a local publish has ``"origin":null``): the rest are skipped undecoded.
_PUBLISH = b'{"type":"publish"'
_ORIGIN = b'"origin":"'


class Seen:
    """Dedup keys (:func:`federation.inbound.dedup_key`) appended here, each with its message's expiry
    (microseconds; None: a state message, kept for ever), and the keys being appended."""

    def __init__(self, keys: Mapping[str, int | None] | None = None, grace_us: int = round(FederationConfig.seen_grace_s * 1_000_000)):
        self._keys: dict[str, int | None] = dict(keys or {})
        self._claims: dict[str, asyncio.Future] = {}
        self.grace_us = grace_us

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    async def claim(self, key: str) -> bool:
        """True: the caller appends ``key``'s message and then calls :meth:`settle`.  False: it is
        here already.  A key another link is appending is waited for: appended, it is seen; failed,
        the claim passes to this caller."""
        while key in self._claims:
            await asyncio.shield(self._claims[key])
        if key in self._keys:
            return False
        self._claims[key] = asyncio.get_running_loop().create_future()
        return True

    def settle(self, key: str, appended: bool, expires_at: int | None = None) -> None:
        """The claimed append of ``key`` (its message dying at ``expires_at``) is durable (``appended``)
        or failed."""
        if appended:
            self._keys[key] = expires_at
        claim = self._claims.pop(key, None)
        if claim is not None and not claim.done():
            claim.set_result(None)

    def forget_dead(self, now: int) -> int:
        """Forget the keys whose message died more than ``grace_us`` before ``now`` (µs): it cannot
        come again.  How many were forgotten."""
        dead = [key for key, expires_at in self._keys.items()
                if expires_at is not None and expires_at + self.grace_us < now]
        for key in dead:
            del self._keys[key]
        return len(dead)


def forwarded_key(offset: int, key: bytes | None, value: bytes) -> tuple[str, int | None] | None:
    """(dedup key, expiry) of a commands record that is a forwarded publish, else None (decoded only then)."""
    if not value.startswith(_PUBLISH) or _ORIGIN not in value:
        return None
    try:
        publish = decode(value)
    except (ValueError, TypeError, KeyError):
        return None  # the job skips it too: nothing of it is here
    if not isinstance(publish, Publish) or not publish.origin:
        return None
    return dedup_key(publish.origin, publish.topic), publish.expires_at


async def rebuild(config: KafkaConfig, cluster: Cluster, now: int, grace_us: int, timeout: float = 120.0) -> Seen:
    """Read every partition of the commands topic from its start to its end: the forwarded publishes,
    less those dead for longer than ``grace_us`` at ``now``."""
    keys: dict[str, int | None] = {}
    reader = Tail(config, cluster, config.commands_topic, keys.update, forwarded_key, name="link-dedup")
    reader.start()
    try:
        await asyncio.wait_for(reader.ready.wait(), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"could not read {config.commands_topic} to its end within {timeout:g} s") from None
    finally:
        await reader.stop()
    seen = Seen(keys, grace_us)
    seen.forget_dead(now)
    return seen
