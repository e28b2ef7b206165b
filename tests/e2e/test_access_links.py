"""Access control where the data is reached (issue 32, items 1-3), over real sockets: a real Kafka
broker and a real gateway, which routes DELIVERY ALL messages from its fold (no job needed).

The User Access Lists give only jtegen the rights on ``/secret`` and the subscribe right on
``/top/secret``; every other topic is open, and guest logs in with a blank password.

* A virtual topic is no way round the UAL: creating one to a topic the creator may not reach,
  subscribing, reading or publishing through one, or listing one, is judged on its target; an
  account topic is never a link target.  A subscriber reached through a link made while the UAL
  allowed it is not NOTIFYed once the UAL (a restart with a new configuration) denies it.
* PUB REPLY must name a message that exists on the topic and that the replier may read.
* NOTIFY TOPIC and NOTIFY SUB tell a watcher of no topic that LIST would hide from it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import pytest

from gateway.client import SMQPClient, SMQPError
from tests.e2e.stack import GatewayThread, hashed, stack_config

pytestmark = pytest.mark.e2e

UAL = {
    "/secret": {"subscribe": ["jtegen"], "publish": ["jtegen"]},
    "/top/secret": {"subscribe": ["jtegen"]},
}


def config_with(config, ual):
    return replace(config, ual=ual)


@pytest.fixture
def base_config(broker, tmp_path):
    return stack_config(broker, tmp_path, hashed(jtegen="rowe7kuy"))


@contextlib.asynccontextmanager
async def login(address, account="guest", password=""):
    client = await SMQPClient.open(*address, account, password)
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            await client.quit()
        await client.close()


def jtegen(address):
    return login(address, "jtegen", "rowe7kuy")


async def refused(call) -> int:
    with pytest.raises(SMQPError) as error:
        await call
    return error.value.code


async def no_notification(client: SMQPClient, seconds: float = 1.5) -> None:
    with pytest.raises(asyncio.TimeoutError):
        note = await client.next_notification(seconds)
        pytest.fail(f"notified: {note.resource} {note.topic} {note.headers}")


def run(scenario, seconds: float = 60) -> None:
    asyncio.run(asyncio.wait_for(scenario(), seconds))


# -- item 1: virtual topics


def test_a_link_to_a_topic_the_creator_may_not_read_is_refused(base_config):
    with GatewayThread(config_with(base_config, UAL)) as gateway:
        async def scenario():
            async with jtegen(gateway.address) as admin, login(gateway.address) as guest:
                await admin.create_topic("/secret")
                await admin.create_topic("/pub")
                assert await refused(guest.create_topic("/pub/alias", target="/secret")) == 401
                assert await admin.list_topics("/pub") == []
        run(scenario)


def test_a_link_reaches_its_target_only_with_the_rights_on_the_target(base_config):
    with GatewayThread(config_with(base_config, UAL)) as gateway:
        async def scenario():
            async with jtegen(gateway.address) as admin, login(gateway.address) as guest:
                await admin.create_topic("/secret")
                await admin.create_topic("/pub/alias", target="/secret")
                smuid = await admin.publish("/secret", b"for jtegen only")
                assert await refused(guest.subscribe("/pub/alias")) == 401
                assert await refused(guest.publish("/pub/alias", b"in through the side door")) == 401
                assert await refused(guest.list_messages("/pub/alias")) == 404
                assert await refused(guest.count_messages("/pub/alias")) == 404
                assert await refused(guest.get_messages("/pub/alias", smuid)) == 404
                assert await guest.list_topics("/pub") == []  # as LIST hides /secret itself
                assert await admin.list_topics("/pub") == [("/pub/alias", "/secret")]
                assert await admin.subscribe("/pub/alias") == ["/secret"]
                await no_notification(guest)
        run(scenario)


def test_an_account_topic_is_never_a_link_target(base_config):
    with GatewayThread(config_with(base_config, UAL)) as gateway:
        async def scenario():
            async with login(gateway.address) as guest, jtegen(gateway.address) as owner:
                await guest.create_topic("/a")
                assert await refused(guest.create_topic("/a/spy", target="/accounts/jtegen")) == 405
                assert await refused(owner.create_topic("/a/mine", target="/accounts/jtegen")) == 405
                assert await guest.list_topics("/a") == []
                assert await refused(guest.subscribe("/a/spy")) == 404
        run(scenario)


def test_a_subscriber_through_a_link_is_not_notified_once_the_ual_denies_it(base_config):
    """The link and the subscription were made on an open server; the gateway restarts with the
    UAL that denies guest ``/secret``: jtegen's next message there reaches jtegen, not guest, while
    guest still gets what it may read."""
    with GatewayThread(base_config) as gateway:
        async def before():
            async with jtegen(gateway.address) as admin, login(gateway.address) as guest:
                await admin.create_topic("/secret")
                await admin.create_topic("/open")
                await guest.create_topic("/pub/alias", target="/secret")
                assert await guest.subscribe("/pub/alias") == ["/secret"]
                assert await guest.subscribe("/open") == ["/open"]
        run(before)
    with GatewayThread(config_with(base_config, UAL)) as gateway:
        async def after():
            async with jtegen(gateway.address) as admin, login(gateway.address) as guest:
                assert await admin.subscribe("/secret") == ["/secret"]
                secret = await admin.publish("/secret", b"for jtegen only")
                public = await admin.publish("/open", b"for everyone")
                note = await guest.next_notification(30)
                assert (note.topic, note.smuid) == ("/open", public)
                await note.ack()
                await no_notification(guest)
                mine = await admin.next_notification(30)
                assert (mine.topic, mine.smuid) == ("/secret", secret)
        run(after)


# -- item 2: PUB REPLY


def test_a_reply_must_name_a_message_of_the_topic_that_the_replier_may_read(base_config):
    with GatewayThread(config_with(base_config, UAL)) as gateway:
        async def scenario():
            async with jtegen(gateway.address) as owner, login(gateway.address) as guest:
                await owner.create_topic("/secret")
                await owner.create_topic("/open")
                assert await owner.subscribe("/accounts/jtegen") == ["/accounts/jtegen"]
                await owner.publish("/secret", b"for jtegen only", cmuid="S1")
                secret_cmuid = f"jtegen/{owner.login_attributes['Guid']}/S1"
                # forged: no such topic, a message that does not exist, one guest may not read
                assert await refused(guest.publish_reply("/nowhere", "jtegen/x/A004", b"forged")) == 404
                assert await refused(guest.publish_reply("/open", "jtegen/x/A004", b"forged")) == 404
                assert await refused(guest.publish_reply("/secret", secret_cmuid, b"forged")) == 404
                await no_notification(owner)
                # a real reply to a message guest received: delivered
                assert await guest.subscribe("/open") == ["/open"]
                await owner.publish("/open", b"question", cmuid="Q1")
                question = await guest.next_notification(30)
                await question.ack()
                await question.reply(b"answer")
                answer = await owner.next_notification(30)
                assert (answer.topic, answer.data) == ("/accounts/jtegen", b"answer")
                assert answer.header("In-Reply-To") == f"jtegen/{owner.login_attributes['Guid']}/Q1"
        run(scenario)


# -- item 3: NOTIFY TOPIC and NOTIFY SUB


def test_topic_and_subscriber_notifications_hide_what_list_hides(base_config):
    with GatewayThread(config_with(base_config, UAL)) as gateway:
        async def scenario():
            async with jtegen(gateway.address) as admin, login(gateway.address) as guest:
                await admin.create_topic("/top")
                assert await guest.subscribe_topic("/top/*") == ["/top/*"]
                assert await guest.subscribe_subscribers("/top/*") == ["/top/*"]
                await admin.create_topic("/top/secret")
                await admin.create_topic("/top/open")
                note = await guest.next_notification(30)
                assert (note.resource, note.topic, note.action) == ("TOPIC", "/top/open", "ADDED")
                await admin.subscribe("/top/secret")
                await admin.subscribe("/top/open")
                note = await guest.next_notification(30)
                assert (note.resource, note.topic, note.count) == ("SUBSCRIBERS", "/top/open", 1)
                assert [t for t, _ in await guest.list_topics("/top")] == ["/top/open"]
                await no_notification(guest)
        run(scenario)
