"""User Access Lists (spec section 6): who may do what on which topic.

Managed by the administrator in the configuration file, never by SMQP
commands::

    [ual."/"]
    publish = ["*"]            # everyone
    subscribe = ["*"]
    admin = ["jtegen"]         # create, rename, remove, set keywords / delivery at or below
    reply = ["*"]
    remote = ["jtegen"]        # reach remote servers (a virtual topic on another server)

    [ual."/stocks"]
    publish = ["feeds"]        # only the feeds account publishes below /stocks

A topic without an entry for an action inherits its parent's, up to the
root; with no entry anywhere an action is allowed (an empty configuration is
an open server, as before).  ``"*"`` names every account, ``"guest"`` the
guest account.  Account topics are their owner's alone and never consult it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

ACTIONS = ("publish", "subscribe", "admin", "reply", "remote")


@dataclass(frozen=True)
class AccessList:
    entries: Mapping[str, Mapping[str, list[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for topic, rights in self.entries.items():
            unknown = set(rights) - set(ACTIONS)
            if unknown or not topic.startswith("/"):
                raise ValueError(f"bad [ual.{topic!r}]: unknown actions {sorted(unknown)}" if unknown
                                 else f"bad [ual] topic {topic!r}: must start with '/'")

    def allows(self, account: str, action: str, topic: str) -> bool:
        """True when ``account`` may ``action`` on ``topic`` (nearest entry up to the root wins)."""
        if not self.entries:
            return True  # an open server: asked twice for every publish
        path = topic.lower()
        while True:
            names = self.entries.get(path, {}).get(action)
            if names is not None:
                return "*" in names or account.lower() in (n.lower() for n in names)
            if path == "/":
                return True
            path = path.rsplit("/", 1)[0] or "/"
