"""The gateway's counters and the Prometheus text format, without I/O: instruments render
what the strict reader accepts, every SMQP verb is counted under its canonical name, and
server frames are classified by reply code and NOTIFY kind."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest

from gateway import metrics
from gateway.metrics import Counter, Gauge, GatewayMetrics, Histogram, histogram_quantile, render
from gateway.protocol.actions import AuthResult
from gateway.protocol.session import Session
from schemas.config import GatewayConfig
from tests.dashboard import promtext
from tests.gateway.test_feeding import make_registry


def test_rendered_families_pass_the_strict_reader():
    counter = Counter("smqp_test_frames_total", "Frames.\nSecond line with a \\ backslash.", ("verb",))
    counter.inc("PUBLISH")
    counter.inc("PUBLISH")
    counter.inc('odd "verb"\n\\')
    histogram = Histogram("smqp_test_latency_seconds", "Latency.", (0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    gauge = Gauge("smqp_test_open", "Open.", lambda: {("a",): 2, ("b",): 0.5}, ("kind",))
    families = promtext.parse(render([counter, histogram, gauge]))

    assert families["smqp_test_frames_total"].type == "counter"
    assert families["smqp_test_frames_total"].help == "Frames.\\nSecond line with a \\\\ backslash."
    assert families["smqp_test_frames_total"].by("verb") == {"PUBLISH": 2, 'odd "verb"\n\\': 1}
    latency = families["smqp_test_latency_seconds"]
    assert latency.type == "histogram"
    assert {ls["le"]: v for n, ls, v in latency.samples if n.endswith("_bucket")} == {"0.1": 2, "1": 3, "+Inf": 4}
    assert latency.value("smqp_test_latency_seconds_count") == 4
    assert latency.value("smqp_test_latency_seconds_sum") == pytest.approx(3.65)
    assert families["smqp_test_open"].by("kind") == {"a": 2, "b": 0.5}


def test_counters_must_end_in_total_and_names_must_be_valid():
    with pytest.raises(ValueError):
        Counter("smqp_frames", "no suffix")
    with pytest.raises(ValueError):
        Gauge("smqp-open", "dash", lambda: 0)
    with pytest.raises(ValueError):
        Counter("smqp_x_total", "bad label", ("le-bad",))


def test_the_strict_reader_rejects_malformed_text():
    good = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n"
    assert promtext.parse(good)["a_total"].value() == 1
    for bad in (
        "# TYPE a_total counter\na_total 1\n",  # no HELP
        "# HELP a_total A.\n# TYPE a_total counter\na_total -1\n",  # negative counter
        "# HELP a A.\n# TYPE a counter\na 1\n",  # counter without _total
        "# HELP a A.\n# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n",  # same series twice
        "# HELP a A.\n# TYPE a gauge\na{x=1} 1\n",  # unquoted label value
        "# HELP a A.\n# TYPE a gauge\na 1",  # no final line feed
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",  # no +Inf
        "# HELP a A.\n# TYPE a gauge\n# HELP b B.\n# TYPE b gauge\nb 1\na 1\n",  # interleaved
    ):
        with pytest.raises(promtext.FormatError):
            promtext.parse(bad)


def test_values_render_as_the_format_wants():
    assert metrics.format_value(3) == "3"
    assert metrics.format_value(2.0) == "2"
    assert metrics.format_value(0.25) == "0.25"
    assert metrics.format_value(math.inf) == "+Inf"
    assert metrics.format_value(math.nan) == "NaN"


def test_histogram_quantile_interpolates_like_prometheus():
    buckets = [(0.1, 2), (1.0, 6), (math.inf, 8)]
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.9 * (4 - 2) / 4)
    assert histogram_quantile(0.99, buckets) == pytest.approx(1.0)  # in +Inf: the largest finite bound
    assert histogram_quantile(0.5, [(1.0, 0), (math.inf, 0)]) is None


def test_our_parser_reads_back_what_we_render():
    gateway = GatewayMetrics()
    gateway.frame_in(b"PUB MESSAGE /a A1")
    gateway.frame_out(b"404 Not found\r\n\r\n")
    gateway.ack_latency.observe(0.02)
    parsed = metrics.parse(gateway.render())
    assert parsed["smqp_gateway_frames_in_total"].kind == "counter"
    assert parsed["smqp_gateway_frames_in_total"].samples == [("smqp_gateway_frames_in_total", {"verb": "PUBLISH"}, 1)]
    assert parsed["smqp_gateway_errors_total"].samples == [("smqp_gateway_errors_total", {"code": "404"}, 1)]
    ack = parsed["smqp_gateway_ack_latency_seconds"]
    assert ack.kind == "histogram" and ("smqp_gateway_ack_latency_seconds_count", {}, 1) in ack.samples


def _session(counters: GatewayMetrics) -> Session:
    return Session(GatewayConfig(), lambda user, password: AuthResult.OK, on_command=counters.frame_in,
                   clock=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc), new_guid=lambda user: f"{user}1",
                   new_smuid=lambda: 1, registry=make_registry())


def test_every_verb_and_abbreviation_is_counted_under_its_canonical_name():
    counters = GatewayMetrics()
    session = _session(counters)
    lines = [b"LOGIN guest CLEAR/1.0", b"PASS guest", b"noop", b"NOOP", b"COUNT", b"LIST", b"CREATE", b"REM",
             b"REMOVE", b"SET", b"FIND", b"GET", b"SUB", b"SUBSCRIBE", b"UNSUB", b"UNSUBSCRIBE", b"310 ACK",
             b"FROB nothing", b"", b"QUIT"]
    session.receive_data(b"".join(line + b"\r\n" for line in lines))
    assert counters.frames_in.values == {
        ("LOGIN",): 1, ("PASS",): 1, ("NOOP",): 2, ("COUNT",): 1, ("LIST",): 1, ("CREATE",): 1, ("REMOVE",): 2,
        ("SET",): 1, ("FIND",): 1, ("GET",): 1, ("SUBSCRIBE",): 2, ("UNSUBSCRIBE",): 2, ("ACK",): 1,
        ("UNKNOWN",): 1, ("QUIT",): 1,
    }


def test_a_publish_body_is_one_frame_in():
    counters = GatewayMetrics()
    session = _session(counters)
    body = b"Content-Type: text/plain\r\nContent-Length: 9\r\n\r\nSUB x\r\nQU\r\n.\r\n"
    session.receive_data(b"LOGIN guest CLEAR/1.0\r\nPASS guest\r\nPUB MESSAGE /a A1\r\n\r\n" + body)
    assert counters.frames_in.values == {("LOGIN",): 1, ("PASS",): 1, ("PUBLISH",): 1}


@pytest.mark.parametrize("frame, verb", [
    (b"200 OK\r\n\r\n", "REPLY"),
    (b"200-OK\r\n200 A1 17\r\n\r\n", "REPLY"),
    (b"NOTIFY MESSAGE /a\r\nCreated: x\r\n\r\n", "NOTIFY MESSAGE"),
    (b"NOTIFY TOPIC /a\r\nAction: ADDED\r\n\r\n", "NOTIFY TOPIC"),
    (b"NOTIFY SUB /a\r\nCOUNT: 2\r\n\r\n", "NOTIFY SUBSCRIBERS"),
    (b"NOTIFY SERVER BYE\r\n\r\n", "NOTIFY SERVER"),
    (b"SMQP/1.0 Ready. SMQP-on-Spark/0.1\r\n", "GREETING"),
])
def test_frames_out_are_classified(frame, verb):
    counters = GatewayMetrics()
    counters.frame_out(frame)
    assert counters.frames_out.values == {(verb,): 1}


def test_error_replies_are_counted_per_code():
    counters = GatewayMetrics()
    for frame in (b"200 OK\r\n\r\n", b"310 ACK\r\n\r\n", b"404 Not found\r\n\r\n", b"404 Not found (x)\r\n\r\n",
                  b"503 Service unavailable\r\n\r\n"):
        counters.frame_out(frame)
    assert counters.replies.values == {("200",): 1, ("310",): 1, ("404",): 2, ("503",): 1}
    assert counters.errors.values == {("404",): 2, ("503",): 1}
