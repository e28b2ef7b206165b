"""The dashboard on its own event loop in a background thread, and a plain HTTP GET."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from concurrent.futures import Future

from deploy.dashboard import Dashboard
from schemas.config import SMQPConfig


class DashboardThread:
    def __init__(self, config: SMQPConfig):
        self.loop = asyncio.new_event_loop()
        self.dashboard = Dashboard(config)
        self._thread = threading.Thread(target=self.loop.run_forever, name="dashboard", daemon=True)

    def __enter__(self) -> DashboardThread:
        self._thread.start()
        self.call(self.dashboard.start())
        return self

    def call(self, coroutine, timeout: float = 30):
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def refresh(self) -> dict:
        return self.call(self.dashboard.refresh())

    @property
    def url(self) -> str:
        return self.dashboard.url

    def __exit__(self, *exc) -> None:
        self.call(self.dashboard.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def http_get(url: str, timeout: float = 10) -> tuple[int, str, str]:
    """(status, content type, body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.headers["Content-Type"], response.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read().decode("utf-8")
