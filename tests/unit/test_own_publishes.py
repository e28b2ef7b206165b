"""A gateway routes its own clients' DELIVERY ALL publishes early from the publish itself, not from
its record decoded back (``RegistryFold.remember_own``): the NOTIFY must be the one the record
would have given, for any publish a gateway can make."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol.rendering import render_notify
from gateway.server.fold import early_delivery
from schemas.events import Publish, Section, decode

# what a gateway makes: any text but lone surrogates (its framing is strict UTF-8), accepted before 2100
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
_headers = st.lists(st.tuples(_text, _text), max_size=4)
_sections = st.lists(st.builds(Section, _headers, st.binary(max_size=64)), max_size=3)
_publishes = st.builds(
    Publish, st.integers(0, 2**63 - 1), _text, _text, _text, _text, st.integers(0, 4_102_444_800_000_000), st.integers(0, 9),
    _headers, _sections, st.none() | st.integers(0, 2**62), st.sampled_from(["none", "one", "all"]),
    st.just("all"), st.integers(-1, 20), st.lists(_text, max_size=3),
    st.none() | _text, st.none() | _text)


@settings(max_examples=300, deadline=None)
@given(_publishes, _text)
def test_an_own_publish_routes_early_as_its_decoded_record_would(publish, account):
    own, decoded = early_delivery(account, publish), early_delivery(account, decode(publish.to_bytes()))
    assert own.to_bytes() == decoded.to_bytes()
    assert render_notify(own, "gw.example") == render_notify(decoded, "gw.example")
