"""The hand-written event encoding (``_Event.to_bytes``) writes exactly what the JSON
module writes for the same object, byte for byte, and :func:`schemas.events.decode` reads it
back: the streaming job parses these bytes with ``from_json`` and other gateways with
``decode``, so a single byte of difference would be a wire change."""

from __future__ import annotations

import base64
import json
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import (EVENT_TYPES, Ack, Acked, AckedBatch, CreateTopic, Deliver, Nack, NodeReset,
                            PlannedShutdown, Presence, Progress, Publish, Section, SetServerTimeout, SetTopicKeywords, Subscribe, Sync, Tick,
                            Unsubscribe, decode, decode_all)


def reference_bytes(event) -> bytes:
    """The encoding as it was before it was written by hand: ``json.dumps`` of the body dict."""
    body = {"type": event.TYPE}
    for f in fields(event):
        value = getattr(event, f.name)
        if f.name == "sections":
            value = [{"headers": [list(h) for h in s.headers], "data": base64.b64encode(s.data).decode()}
                     for s in value]
        elif f.name == "headers":
            value = [list(h) for h in value]
        body[f.name] = value
    return json.dumps(body, separators=(",", ":")).encode()


AWKWARD = ['', 'plain', 'quote " and \\ backslash', 'tab\tnewline\ncr\r', '\x00\x1f\x7f', 'é ü ß',
           '日本語', '\U0001f600 emoji', '\u2028\u2029', '</script>', "'single'"]

SECTION = Section([("Content-Type", "text/plain"), ("Content-Length", "5")], b"hello")
BINARY = Section([("Content-Type", "application/octet-stream")], bytes(range(256)))

EXAMPLES = [
    Publish(2001083408341156, "/stocks/quotes/ibm", "C1", "jtegen", "jtegen0456", 998577912460000, 3,
            [("Priority", "3"), ("X-Trace", "abc")], [SECTION], 998664312460000, "one", "all"),
    Publish(1, "/t", "", "a", "g", 0),  # defaults: empty lists, None expiry
    Publish(1, "/t", "c", "a", "g", -5, 0, [("Name", text) for text in AWKWARD], [SECTION, BINARY, Section([], b"")]),
    Deliver("bob", 7, "/t", "C9", "ann", "ann1", 12, 1, [("Guarantee", "NO")], [BINARY], "one"),
    Subscribe("jtegen", "g", "/a/*", 5, None, 10, "r1"),
    Unsubscribe("jtegen", "g", "/*", 5, "r2", everything=True),
    Ack("jtegen", "g", 2001083408341156, 998577912460000),
    Nack("jtegen", "g", 9, 1, 5, "disconnect"),
    CreateTopic("r3", "admin", "/news", 0, ["IBM", "BIG BLUE", "é"], None),
    CreateTopic("r4", "admin", "/v", 0, [], "/news"),
    SetTopicKeywords("r5", "admin", "/news", [], 1),
    SetServerTimeout("r6", "INFINITE", 2),
    Sync("r7"),
    Presence(3, "bob", True),
    Presence(3, "bob", False),
    NodeReset(0),
    PlannedShutdown("r8", 3, "00:05:00"),
    Tick(2 ** 70),
    Acked("bob", 7, "expired"),
    AckedBatch([{"type": "acked", "account": "bob", "smuid": 7}, {"type": "acked", "account": "j\u00e9", "smuid": 8,
                                                                 "reason": "expired"}]),
    Progress({"0": 17, "1": 0}),
    Progress({}),
]


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__name__)
def test_to_bytes_equals_the_json_module_byte_for_byte(event):
    assert event.to_bytes() == reference_bytes(event)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__name__)
def test_decode_reads_back_what_to_bytes_wrote(event):
    decoded = decode(event.to_bytes())
    assert type(decoded) is type(event)
    assert decoded.to_bytes() == event.to_bytes()
    if hasattr(event, "headers"):
        assert decoded.headers == [tuple(h) for h in event.headers]
        assert [(s.headers, s.data) for s in decoded.sections] == [(s.headers, s.data) for s in event.sections]


def test_every_event_type_is_covered():
    assert {type(e) for e in EXAMPLES} >= set(EVENT_TYPES.values()) - {
        t for t in EVENT_TYPES.values() if t.__name__ in ("RemoveTopic", "RenameTopic", "SetTopicDelivery",
                                                           "SetLogin", "Watch", "Unwatch")}


def test_other_event_types_equal_the_json_module_too():
    for cls in EVENT_TYPES.values():
        values = {f.name: (f"v-{f.name} \u00e9" if "str" in str(f.type) else 1) for f in fields(cls)}
        if "keywords" in values:
            values["keywords"] = ["a", "b"]
        if "commands_offsets" in values:
            values["commands_offsets"] = {"0": 1}
        if "headers" in values:
            values["headers"], values["sections"] = [("A", "b")], [SECTION]
        event = cls(**values)
        assert event.to_bytes() == reference_bytes(event), cls.__name__


def test_headers_that_are_not_string_pairs_fall_back_to_the_json_module():
    event = Deliver("bob", 7, "/t", "C9", "ann", "ann1", 12, headers=[("A", 1), ("B", "c", "d"), ("E",)])
    assert event.to_bytes() == reference_bytes(event)


def test_non_ascii_is_escaped_as_the_json_module_does():
    raw = Ack("j\u00e9", "\U0001f600", 1, 2).to_bytes()
    assert raw.isascii()
    assert b'"j\\u00e9"' in raw and b'"\\ud83d\\ude00"' in raw


def test_decode_rejects_bad_base64_as_a_value_error():
    raw = Deliver("bob", 7, "/t", "C9", "ann", "ann1", 12, sections=[SECTION]).to_bytes()
    with pytest.raises(ValueError):
        decode(raw.replace(b'"aGVsbG8="', b'"aGVsbG8"'))
    with pytest.raises(ValueError):
        decode(raw.replace(b'"aGVsbG8="', b'"\\u00e9"'))


_text = st.text(max_size=20)
_headers = st.lists(st.tuples(_text, _text), max_size=4)
_sections = st.lists(st.builds(Section, _headers, st.binary(max_size=64)), max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.builds(Publish, st.integers(), _text, _text, _text, _text, st.integers(), st.integers(), _headers,
                 _sections, st.none() | st.integers(), _text, _text))
def test_any_publish_equals_the_json_module(event):
    assert event.to_bytes() == reference_bytes(event)
    assert decode(event.to_bytes()).to_bytes() == event.to_bytes()


def reference_decode(raw):
    """decode as it was: json.loads straight on the bytes."""
    obj = json.loads(raw)
    cls = EVENT_TYPES.get(obj.pop("type", None))
    if cls is None:
        raise ValueError(f"unknown event type in {raw[:80]!r}")
    if "sections" in obj:
        obj["sections"] = [Section([tuple(h) for h in s["headers"]], base64.b64decode(s["data"]))
                           for s in obj["sections"]]
    if "headers" in obj:
        obj["headers"] = [tuple(h) for h in obj["headers"]]
    return cls(**obj)


@pytest.mark.parametrize("raw", [
    b'{"type":"sync","request":"r"}', '{"type":"sync","request":"r"}', b'\xef\xbb\xbf{"type":"sync","request":"r"}',
    '{"type":"sync","request":"r"}'.encode("utf-16"),
    b'{"type":"sync","request":"\xff"}', b'{"type":"sync","request":"\\ud83d\\ude00 \\u00e9"}', b'{"type":"nope"}',
    b'{"', b"", b"[]", b'{"type":"sync"}',
    EXAMPLES[0].to_bytes(), EXAMPLES[3].to_bytes(),
])
def test_decode_reads_bytes_as_json_loads_does(raw):
    def outcome(parse):
        try:
            return parse(raw)
        except Exception as error:  # noqa: BLE001 - the kind of failure is what is compared
            return type(error)
    assert outcome(decode) == outcome(reference_decode)


@pytest.mark.parametrize("raw", [
    b'{"type":"sync","request":"\\ud800"}', b'{"type":"sync","request":"\xed\xa0\x80"}',
    Ack("bob", "g", 1, 2).to_bytes().replace(b'"bob"', b'"bob\\udfff"'),
    Publish(1, "/t/x", "c", "ann", "g", 1).to_bytes().replace(b'"/t/x"', b'"/t/\\udbff"'),
])
def test_decode_refuses_a_lone_surrogate_as_the_job_does(raw):
    """A string no UTF-8 can hold (a record another producer wrote): the job drops the record, so a
    gateway's fold skips it too, and never routes it early to a client it could not write it to."""
    assert json.loads(raw)  # the JSON module reads it, the surrogate in a string
    with pytest.raises(ValueError, match="lone surrogate"):
        decode(raw)


def test_an_acked_batch_joins_the_jobs_acked_records_and_is_taken_apart_in_order():
    """The job joins the ``Acked`` JSON Spark wrote; a reader gets the same events back, in order,
    as if each had been a record of its own."""
    acked = [Acked("bob", 7), Acked("j\u00e9", 8, "expired"), Acked("bob", 9, "cleared")]
    raw = AckedBatch.join([event.to_bytes().decode() for event in acked])
    assert decode_all(raw) == acked
    assert decode(raw).to_bytes() == raw
    assert decode_all(Acked("bob", 7).to_bytes()) == [Acked("bob", 7)]
    assert decode_all(AckedBatch.join([])) == []


def test_a_tick_is_told_from_its_bytes_and_nothing_else_is_taken_for_one():
    """The job's reader tells its own clock from traffic by the bytes alone (``Tick.encodes``)."""
    assert Tick.encodes(Tick(2 ** 70).to_bytes()) and Tick.encodes(Tick(0).to_bytes())
    others = [event.to_bytes() for event in EXAMPLES if not isinstance(event, Tick)]
    assert not any(Tick.encodes(value) for value in others + [None, b"", b"tick", b'{"type":"ticks","at":1}'])
