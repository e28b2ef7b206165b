"""The job's clock in the stream: a thread appending ``Tick`` events to commands partition 0.

Micro-batches only run when commands arrive, and the routing decides from
what a batch holds (never from the wall clock, so a replayed batch decides the
same way, DESIGN Property 4).  Time-based rules such as expiry therefore need
time to arrive as commands: every ``streaming.tick_interval_s`` the ticker
appends ``{"type":"tick","at":<microseconds>}``, and a batch's "now" is the
largest tick ``at`` (or ``accepted_at``) it holds (:func:`streaming.sink.records.batch_now`).
Gateways skip ticks.

Between regular ticks the sink sets *alarms* (:meth:`Ticker.wake_at`): the times at which
deliveries it just routed expire.  The ticker ticks at each, so a message with a two-second
Timeout reaches the Trash a batch after it expires, not up to ``tick_interval_s`` later.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from typing import Iterable

from kafka_edge import ThreadedLog
from schemas.config import SMQPConfig
from schemas.events import Tick
from schemas.timefmt import now_micros

log = logging.getLogger(__name__)


#: Alarms are rounded up to this step (µs): at most fifty alarm ticks a second, however many expiries
#: (a step of 100 ms put up to 100 ms on a message's way to the Trash).
ALARM_STEP_US = 20_000

#: Expiries further ahead than this (µs) set no alarm: a regular tick's second of lateness is small
#: beside such a timeout, and the alarms a busy job keeps stay few.
ALARM_HORIZON_US = 60_000_000


class Ticker:
    """Appends a :class:`Tick` every ``interval`` seconds until :meth:`stop`, or until ``alive()`` is false.

    ``alive`` (e.g. ``lambda: query.isActive``) lets the ticker end with the
    query it serves without anyone stopping it.  Send failures are logged and
    retried at the next tick: a missed tick only delays expiry.  Appends go
    through :class:`kafka_edge.ThreadedLog`, as the sink's do.
    """

    def __init__(self, config: SMQPConfig, interval: float | None = None, alive=lambda: True):
        self.config = config
        self.interval = config.streaming.tick_interval_s if interval is None else interval
        self._alive = alive
        self._stopped = False
        self._wake = threading.Event()  # set by stop() and by a new alarm
        self._lock = threading.Lock()
        self._alarms: list[int] = []  # a heap of alarm times (µs, rounded up to ALARM_STEP_US)
        self._thread = threading.Thread(target=self._run, name="smqp-ticker", daemon=True)
        self.sent = 0

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def wake_at(self, times_us: Iterable[int]) -> None:
        """Tick also at each of ``times_us`` (µs since the epoch, e.g. when deliveries expire), rounded
        up to :data:`ALARM_STEP_US`; one beyond :data:`ALARM_HORIZON_US` from now is left to the
        regular ticks."""
        horizon = now_micros() + ALARM_HORIZON_US
        steps = {-(-at // ALARM_STEP_US) * ALARM_STEP_US for at in times_us if at <= horizon}
        if not steps:
            return
        with self._lock:
            for at in steps.difference(self._alarms):
                heapq.heappush(self._alarms, at)
        self._wake.set()

    def _due(self, now_us: int) -> bool:
        """Whether an alarm is due at ``now_us`` (and forget the ones that are)."""
        due = False
        with self._lock:
            while self._alarms and self._alarms[0] <= now_us:
                heapq.heappop(self._alarms)
                due = True
        return due

    def _next_wait(self, next_regular: float) -> float:
        """Seconds until the next regular tick or alarm, whichever comes first."""
        wait = next_regular - time.monotonic()
        with self._lock:
            if self._alarms:
                wait = min(wait, (self._alarms[0] - now_micros()) / 1e6)
        return max(wait, 0.0)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        appender = None
        next_regular = time.monotonic()
        try:
            while not self._stopped:
                try:
                    if not self._alive():
                        return
                except Exception:  # noqa: BLE001 — e.g. the session is gone: so is the query
                    return
                now = now_micros()
                regular, alarm = time.monotonic() >= next_regular, self._due(now)
                if regular:
                    next_regular = time.monotonic() + self.interval
                try:
                    if regular or alarm:
                        if appender is None:
                            appender = ThreadedLog(self.config.job_kafka, self.config.kafka.commands_topic,
                                                   client_id=f"{self.config.streaming.query_name}-ticker")
                        errors = appender.send([(None, Tick(now).to_bytes(), 0)]).result(
                            timeout=max(self.interval, 5.0))
                        if errors:
                            raise errors[0]
                        self.sent += 1
                except Exception as exc:  # noqa: BLE001 — the next tick retries; never kill the job
                    log.warning("tick not sent: %r", exc)
                self._wake.wait(self._next_wait(next_regular))
                self._wake.clear()
        finally:
            if appender is not None:
                appender.close()  # what Kafka has not taken by then is dropped: a missed tick only delays expiry
