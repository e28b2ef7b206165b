"""Issue 32 item 8 (spec 2.4): COUNT, LIST and GET MESSAGE on a topic show its live messages only.

An expired message, or one the job put in the Trash, is gone from the topic for every reader, the
moment it died by the gateway's clock; ``<topic>/Trash`` shows the trashed ones.  The job is
stopped: the Delta tables are written here as its sink writes them, and a real gateway answers
over a real socket.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.client import SMQPClient, SMQPError
from tests.e2e.stack import GatewayThread, create_smqp_topics, hashed, stack_config
from tests.unit.test_message_store import append, trash, trash_row
from tests.unit.test_message_store_live import expiring

pytestmark = pytest.mark.e2e

SECOND = 1_000_000


def test_count_list_and_get_message_on_a_topic_skip_its_expired_and_trashed_messages(broker, tmp_path):
    config = stack_config(broker, tmp_path, hashed(alice="a"))
    now = time.time_ns() // 1000
    append(config.table_path("messages"),
           expiring(11, "/q/quotes", now - SECOND),  # expired a second ago (no job to trash it)
           expiring(12, "/q/quotes", None),  # a state message
           expiring(13, "/q/quotes", now + 3600 * SECOND),  # alive, but trashed (max_retries)
           expiring(14, "/q/quotes", now + 3600 * SECOND),
           expiring(15, "/q/quotes", now + 2 * SECOND))  # expires during the test
    trash(config.table_path("trash"), trash_row(13, "/q/quotes", reason="max_retries"))
    with GatewayThread(config) as gateway:

        async def scenario() -> None:
            await create_smqp_topics(gateway.address, "/q/quotes")
            async with await SMQPClient.open(*gateway.address, "alice", "a") as alice:
                assert await alice.list_messages("/q/quotes") == [12, 14, 15]
                assert await alice.count_messages("/q/quotes") == 3
                assert await alice.count_messages("/q/*") == 3
                assert [m.smuid for m in await alice.get_messages("/q/quotes", "*")] == [12, 14, 15]
                for dead in (11, 13):
                    with pytest.raises(SMQPError) as missing:
                        await alice.get_messages("/q/quotes", dead)
                    assert missing.value.code == 404
                assert await alice.list_messages("/q/quotes/Trash") == [13]
                await asyncio.sleep(2.5)  # 15 expires: gone at once, with no job to say so
                assert await alice.list_messages("/q/quotes") == [12, 14]
                assert await alice.count_messages("/q/quotes") == 2

        asyncio.run(scenario())
