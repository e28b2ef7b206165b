"""The benchmark's SMQP subscriber adapter in a notify window: acknowledgements are sent without
waiting, kept until their 310 ACK, and a failed one fails the run when it flushes."""

from __future__ import annotations

import asyncio

import pytest

from deploy.smqp_adapter import _Subscriber


def test_answered_acks_are_let_go_as_new_ones_come_and_flush_waits_for_the_rest():
    async def body() -> None:
        loop = asyncio.get_running_loop()
        subscriber = _Subscriber(client=None)
        acks = [loop.create_future() for _ in range(5)]
        for ack in acks[:3]:
            subscriber.track(ack)
        acks[0].set_result(None)
        acks[1].set_result(None)
        subscriber.track(acks[3])
        assert list(subscriber.acks) == [acks[2], acks[3]]  # replies come in order: the front is let go
        flushing = asyncio.ensure_future(subscriber.flush())
        await asyncio.sleep(0)
        assert not flushing.done()  # the third and fourth are not answered yet
        acks[2].set_result(None)
        acks[3].set_result(None)
        await asyncio.wait_for(flushing, 1)
        assert not subscriber.acks

    asyncio.run(body())


def test_a_failed_ack_is_kept_for_flush_to_raise():
    async def body() -> None:
        loop = asyncio.get_running_loop()
        subscriber = _Subscriber(client=None)
        failed, later = loop.create_future(), loop.create_future()
        subscriber.track(failed)
        failed.set_exception(ConnectionError("connection closed by server"))
        later.set_result(None)
        subscriber.track(later)
        assert not subscriber.acks
        with pytest.raises(ConnectionError):
            await subscriber.flush()

    asyncio.run(body())
