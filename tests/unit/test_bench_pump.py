"""The benchmark's publishing pump: every message once, never more than the window unacknowledged,
and a failed publish fails the run."""

from __future__ import annotations

import asyncio

import pytest

from deploy.compare_workloads import _pump


class _Publisher:
    def __init__(self, fail_at: int | None = None):
        self.sent = self.in_flight = self.most_in_flight = 0
        self.fail_at = fail_at

    async def publish(self, body: bytes) -> None:
        self.sent += 1
        number = self.sent
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.001 * (number % 3))  # acknowledged out of order
        self.in_flight -= 1
        if number == self.fail_at:
            raise ConnectionError("publish refused")


def test_the_pump_publishes_each_message_keeping_at_most_the_window_in_flight():
    publisher = _Publisher()
    asyncio.run(_pump(publisher, 500, 7))
    assert publisher.sent == 500 and publisher.in_flight == 0 and publisher.most_in_flight == 7


def test_a_failed_publish_fails_the_pump():
    publisher = _Publisher(fail_at=40)
    with pytest.raises(ConnectionError):
        asyncio.run(_pump(publisher, 500, 10))
    assert publisher.sent < 500
