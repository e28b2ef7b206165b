"""The check behind ``CREATE TOPIC /x > b.example/stocks/ibm`` (spec 4.1.4): may this farm read that
topic on the farm it names?

"The linking to the remote topic will succeed if either the current account or "guest" account has
permission to log into the remote server and has permission to access the remote topic."  The
gateway logs in there over plain SMQP (the reference client, :class:`gateway.client.SMQPClient`),
as the creating account when the ``[[federation.links]]`` entry for that farm names it in
``accounts`` (with the password in the environment variable it names: never in the file, never
over SMQP from the client), else as guest; the link process later pulls the topic's messages as
the same login (:func:`pull_login`), so what is checked here is what it will be allowed.

The other farm answers with its own codes; the creating client is told:

* 200 — the login may read the topic there;
* 401 — the login was refused, or it may not read the topic there;
* 404 — no such topic there, or the farm could not be reached (the text says which).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from typing import Mapping

from gateway.accounts import GUEST
from gateway.client import SMQPClient, SMQPError
from gateway.client.wire import ServerProtocolError
from gateway.protocol.actions import Action, CheckRemote
from gateway.replies import NOT_FOUND, Reply, UNAUTHORIZED
from gateway.scram import METHOD as SCRAM_METHOD, ScramError
from schemas.config import FederationConfig, LinkConfig

log = logging.getLogger("smqp.gateway")

#: How long the whole check may take (connect, log in, two commands), in seconds.
CHECK_TIMEOUT_S = 10.0


def pull_account(link: LinkConfig, account: str | None) -> str:
    """Spec 4.1.3: a remote virtual topic created by ``account`` logs in to ``link``'s farm as that
    account when ``link.accounts`` names it, else as guest.  The link process pulls as the same login."""
    named = next((name for name in link.accounts if account and name.lower() == account.lower()), None)
    return account if named is not None else GUEST


def pull_login(link: LinkConfig, account: str | None, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(login, password) of :func:`pull_account`: the password from the environment variable
    ``link.accounts`` names (guest's on an SMQP server of this project is empty).
    ``KeyError`` when that variable is not set."""
    env = os.environ if env is None else env
    login = pull_account(link, account)
    if login == GUEST:
        return GUEST, ""
    variable = next(v for name, v in link.accounts.items() if name.lower() == login.lower())
    return login, env[variable]


def login_method(link: LinkConfig, account: str) -> str:
    """How to log in to ``link``'s farm as ``account``: a password crosses a plain connection only
    as SCRAM-SHA-256 (never readable); CLEAR over TLS, and for guest (who has no password)."""
    return "CLEAR" if link.tls or account.lower() == GUEST else SCRAM_METHOD


def link_ssl(link: LinkConfig) -> ssl.SSLContext | None:
    """The TLS context for ``link`` (SMQPS, the peer's certificate checked against ``tls_ca`` or the
    system's CAs), None for plain SMQP."""
    if not link.tls:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=link.tls_ca or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def may_read_there(link: LinkConfig, account: str, topic: str, env: Mapping[str, str] | None = None) -> Reply:
    """Whether ``account`` (or guest, :func:`pull_login`) may read ``topic`` on ``link``'s farm: 200,
    401 or 404 as the module says."""
    try:
        login, password = pull_login(link, account, env)
    except KeyError as missing:
        log.warning("[[federation.links]] %s: the password variable %s of %s is not set", link.domain, missing, account)
        return Reply.error(UNAUTHORIZED, f"no password for {account} at {link.domain} on this server")
    host, port = link.host_port
    try:
        client = await SMQPClient.open(host, port, login, password, timeout=CHECK_TIMEOUT_S, ssl=link_ssl(link),
                                       method=login_method(link, login))
    except (SMQPError, ScramError) as error:  # refused, or (SCRAM) it could not prove it knows the password
        return Reply.error(UNAUTHORIZED, f"{link.domain} refused the login of {login}: {_why(error)}")
    except (OSError, asyncio.TimeoutError, ServerProtocolError) as error:
        return Reply.error(NOT_FOUND, f"{link.domain} not reachable at {link.address}: {_why(error)}")
    try:
        return await asyncio.wait_for(_readable(client, link.domain, login, topic), CHECK_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError, ServerProtocolError) as error:
        return Reply.error(NOT_FOUND, f"{link.domain} did not answer at {link.address}: {_why(error)}")
    finally:
        await client.close()


async def _readable(client: SMQPClient, domain: str, login: str, topic: str) -> Reply:
    """COUNT MESSAGE the topic.  A server that hides a topic its login may not read answers 404 to
    that (this one does: what LIST hides is never told), so a 404 is asked again with SUB MESSAGE,
    which says 401 for a missing right before it looks for the topic; a SUB that succeeds (the
    topic appeared meanwhile) is undone at once."""
    try:
        await client.count_messages(topic)
        return Reply.ok()
    except SMQPError as error:
        if error.code == UNAUTHORIZED:
            return _no_right(domain, login, topic)
        if error.code != NOT_FOUND:
            return Reply.error(NOT_FOUND, f"{domain} answered {_why(error)} for {topic}")
    try:
        await client.subscribe(topic)
    except SMQPError as error:
        if error.code == UNAUTHORIZED:
            return _no_right(domain, login, topic)
        return Reply.error(NOT_FOUND, f"no topic {topic} at {domain}")
    await client.unsubscribe(topic)
    return Reply.ok()


def _why(error: BaseException) -> str:
    """An error's text for a reply line (a timeout has none: its name then)."""
    return " ".join(str(error).split()) or type(error).__name__


def _no_right(domain: str, login: str, topic: str) -> Reply:
    return Reply.error(UNAUTHORIZED, f"{login} may not read {topic} at {domain}")


async def perform(federation: FederationConfig, action: CheckRemote) -> list[Action]:
    """Carry out a session's :class:`CheckRemote`: the check, then what the session makes of it."""
    link = federation.link(action.domain)
    if link is None:  # the session checked; a configuration is never reloaded, but say so plainly
        return action.then(Reply.error(NOT_FOUND, f"{action.domain}: no link to that farm is configured here"))
    return action.then(await may_read_there(link, action.account, action.topic))
