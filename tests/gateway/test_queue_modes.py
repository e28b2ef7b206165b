"""What the gateway stamps on each Publish for the job's queue semantics (issue 4): the delivery
mode (SET TOPIC DELIVERY over the message's Delivery attribute), the RECEIPT mode and the topic's
default timeout.  Sans-I/O, against the real registry."""

from __future__ import annotations

import pytest

from gateway.protocol.actions import Durable
from schemas.events import Publish
from schemas.queue_params import TopicSettings

from tests.gateway.test_feeding import feed_three_ways, make_registry, make_session, run, wire
from tests.gateway.test_spec_examples import SPEC_MICROS

LOGIN = b"LOGIN jtegen CLEAR/1.0\r\nPASS jtegen rowe7kuy\r\n"


def pub(topic: str, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return (f"PUB MESSAGE {topic} C1\r\n{head}\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi\r\n.\r\n"
            .encode())


def published(actions) -> list[Publish]:
    return [a.event for a in actions if isinstance(a, Durable) and isinstance(a.event, Publish)]


def factory(topics=None):
    def make():
        session = make_session(registry=make_registry(["/jobs", "/news"]),
                               queue_params=TopicSettings(topics or {}).resolve)
        run(session, [LOGIN])
        return session
    return make


def test_set_topic_delivery_overrides_the_messages_delivery_attribute():
    actions = feed_three_ways(b"SET TOPIC DELIVERY /jobs ONE\r\n" + pub("/jobs", "Delivery: ALL")
                              + pub("/news", "Delivery: one") + pub("/news"), factory())
    assert wire(actions).startswith(b"200 OK\r\n\r\n")
    assert [p.delivery for p in published(actions)] == ["one", "one", "all"]


def test_a_configured_topic_delivery_also_overrides_the_message():
    actions = feed_three_ways(pub("/jobs/a", "Delivery: ALL"), factory({"/jobs": {"delivery": "one"}}))
    assert [p.delivery for p in published(actions)] == []  # /jobs/a does not exist: 404
    actions = feed_three_ways(pub("/jobs", "Delivery: ALL"), factory({"/jobs": {"delivery": "one"}}))
    assert [p.delivery for p in published(actions)] == ["one"]


@pytest.mark.parametrize("line, reply", [
    (b"SET TOPIC DELIVERY /jobs SOME\r\n", b"400"),
    (b"SET TOPIC DELIVERY /missing ONE\r\n", b"404"),
    (b"SET TOPIC DEL /jobs\r\n", b"400"),
])
def test_set_topic_delivery_errors(line, reply):
    assert wire(feed_three_ways(line, factory())).startswith(reply)


@pytest.mark.parametrize("header, mode", [("Receipt: ALL", "all"), ("Receipt: one", "one"), ("Receipt: YES", "one"),
                                          ("Receipt: NO", "none"), (None, "none")])
def test_receipt_modes_and_draft_04s_yes_no(header, mode):
    actions = feed_three_ways(pub("/news", *([header] if header else [])), factory())
    assert [p.receipt for p in published(actions)] == [mode]


def test_a_bad_receipt_or_delivery_value_gets_400_after_the_body():
    for header in ("Receipt: MAYBE", "Delivery: SOME"):
        actions = feed_three_ways(pub("/news", header), factory())
        assert published(actions) == [] and wire(actions).startswith(b"400")


def test_the_topics_default_timeout_applies_when_the_message_has_none():
    actions = feed_three_ways(pub("/jobs") + pub("/jobs", "Timeout: 00:00:00:05") + pub("/news"),
                              factory({"/jobs": {"timeout": "00:00:01:00"}}))
    expiries = [p.expires_at - SPEC_MICROS for p in published(actions)]
    assert expiries[:2] == [60_000_000, 5_000_000]
    assert expiries[2] > 60_000_000  # the server's default (a day)
