"""The one-node Kafka's start-up choices (deploy/broker.py), without starting it."""

from __future__ import annotations

from deploy.broker import _cluster_id


def test_a_cluster_id_never_starts_with_a_dash_which_the_format_tool_takes_for_an_option():
    """URL-safe base64 starts with ``-`` once in 64: ``StorageTool format -t -…`` then failed
    ("expected one argument") and the local stack did not start."""
    ids = [_cluster_id() for _ in range(2000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == 2000 and {len(i) for i in ids} == {22}
