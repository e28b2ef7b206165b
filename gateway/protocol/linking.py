"""CONNECTTO (the 2002 revision): a client asks this farm to link to another SMQP server.

``CONNECTTO account/channel [address:]port``.  The 2002 text gives the syntax only; our reading:

* ``address:port`` is the other server (without ``address``: the host the client connects from,
  as SET NOTIFY PORT reads a missing address), ``account`` the account of that server this farm
  logs in as, ``channel`` that server's domain (what its messages' topics are prefixed with, and
  what ``Hops`` names it by);
* the right to ask is spec 6(6)'s ``remote`` (on ``/``): reaching other servers;
* a password never crosses the wire: the link must be configured (a ``[[federation.links]]`` with
  that domain, account and address, its password in an environment variable), else 404;
* configured links are kept up by the link process from its start, so the reply is 200 saying so
  (it does not wait for a login there: the link's state is on its ``/metrics``).
"""

from __future__ import annotations

from gateway.protocol.actions import Action
from gateway.protocol.arguments import same_address
from gateway.replies import NOT_FOUND, Reply, UNAUTHORIZED

CONNECTTO_USAGE = "CONNECTTO <account>/<channel> [<address>:]<port>"


class LinkVerbs:
    """The CONNECTTO handler of :class:`gateway.protocol.session.Session`.

    A mixin: it uses the session's state and shared helpers (``self._reply``, ``self._may``,
    ``self._federation``...), defined in :mod:`gateway.protocol.session`.
    """

    def smqp_CONNECTTO(self, verb: str, args: list[str]) -> list[Action]:
        """``CONNECTTO account/channel [address:]port``: 200 when that link is configured."""
        parsed = _parse(args)
        if parsed is None:
            return self._usage(CONNECTTO_USAGE)
        account, domain, host, port = parsed
        if not self._may("remote", "/"):
            return self._reply(Reply.error(UNAUTHORIZED, "no remote permission: linking to other servers"))
        link = self._federation.link(domain)
        where = f"{host or self._peer or '(this client)'}:{port}"
        if link is None or link.account.lower() != account.lower() or not _same_place(link.host_port, host, port):
            return self._reply(Reply.error(NOT_FOUND, f"no link to {domain} as {account} at {where} is configured "
                                                      f"here (a link's password is configured, never sent)"))
        return self._reply(Reply.ok(f"link to {domain} as {account} at {link.address} is configured; "
                                    f"the link process keeps it up"))


def _parse(args: list[str]) -> tuple[str, str, str, int] | None:
    """(account, channel lower case, address or "", port) of CONNECTTO's arguments, None if malformed."""
    if len(args) != 2:
        return None
    account, slash, channel = args[0].partition("/")
    host, _, port = args[1].rpartition(":")
    if not (slash and account and channel and "/" not in channel and port.isascii() and port.isdigit()):
        return None
    if not 0 < int(port) < 65536:
        return None
    return account, channel.lower(), host, int(port)


def _same_place(configured: tuple[str, int], host: str, port: int) -> bool:
    """The address CONNECTTO names is the configured link's (a missing address: the port decides)."""
    return configured[1] == port and (not host or same_address(host) == same_address(configured[0]))
