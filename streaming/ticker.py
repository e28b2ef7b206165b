"""The job's clock in the stream: a thread appending ``Tick`` events to commands partition 0.

Micro-batches only run when commands arrive, and the routing decides from
what a batch holds (never from the wall clock, so a replayed batch decides the
same way, DESIGN Property 4).  Time-based rules such as expiry therefore need
time to arrive as commands: every ``streaming.tick_interval_s`` the ticker
appends ``{"type":"tick","at":<microseconds>}``, and a batch's "now" is the
largest tick ``at`` (or ``accepted_at``) it holds (:func:`streaming.sink.batch_now`).
Gateways skip ticks.
"""

from __future__ import annotations

import logging
import threading
import time

from kafka_edge import ThreadedLog
from schemas.config import SMQPConfig
from schemas.events import Tick

log = logging.getLogger(__name__)


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
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smqp-ticker", daemon=True)
        self.sent = 0

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        appender = None
        try:
            while not self._stop.is_set():
                try:
                    if not self._alive():
                        return
                except Exception:  # noqa: BLE001 — e.g. the session is gone: so is the query
                    return
                try:
                    if appender is None:
                        appender = ThreadedLog(self.config.job_kafka, self.config.kafka.commands_topic,
                                           client_id=f"{self.config.streaming.query_name}-ticker")
                    tick = Tick(time.time_ns() // 1000)
                    errors = appender.send([(None, tick.to_bytes(), 0)]).result(timeout=max(self.interval, 5.0))
                    if errors:
                        raise errors[0]
                    self.sent += 1
                except Exception as exc:  # noqa: BLE001 — the next tick retries; never kill the job
                    log.warning("tick not sent: %r", exc)
                self._stop.wait(self.interval)
        finally:
            if appender is not None:
                appender.close()  # what Kafka has not taken by then is dropped: a missed tick only delays expiry
