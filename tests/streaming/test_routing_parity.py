"""One routing rule, proven one: the gateway's early routing and the job's routing agree.

A gateway NOTIFYs a DELIVERY ALL message as soon as its fold of the commands log reaches the
publish (``gateway.registry.Registry.recipients``, on :func:`schemas.topics.recipients`); the job
routes the same publish in SQL (``streaming.routing.subscription_intervals`` and
``streaming.routing.route``, the ``intervals`` and ``routed_all`` steps of
``streaming.sink.query.batch_sql``).  Here both read one generated commands log, as the records a
gateway appends (``schemas.events``), and must name the same accounts for every publish.

Spark takes seconds per query, so each hypothesis example holds :data:`CASES` independent cases,
each in a namespace of its own (topics under ``/c<n>``, accounts ``c<n><name>``), routed by the
job in one pass; the log's first part is a batch the job has committed before (its subscriptions
come back as the stored ``current`` ones), the rest the batch under test.  The records carry the
clocks of several gateways, a few milliseconds apart, so a record's timestamp may be earlier than
the one before it: the job must still follow the log's order, as the fold does.  Each case's ``cy`` is
another farm's link (``[federation] peers``, domain b.example), and publishes carry a Depth and Hops
(issue 33): both must let a message on to it under the one rule, :func:`schemas.topics.forwards`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pyarrow as pa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gateway.registry import Registry
from schemas import events as ev
from schemas.spark import KAFKA_RECORD, SUBSCRIPTIONS_TABLE, arrow_schema
from streaming import routing
from streaming.sink.decoding import decode_records, in_log_order

T0 = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
US0 = int(T0.timestamp() * 1_000_000)

CASES = 30  # per hypothesis example, each routed by one Spark pass
EXAMPLES = 18  # 540 cases in all
ACCOUNTS = ("ann", "bob", "cy")
LEVELS = ("x", "y", "xy")  # "xy" next to "x": /c/x/* must not reach /c/xy
INSTANTS = st.integers(0, 6)  # µs after US0: SINCE, UNTIL and acceptance meet, and miss by one
SKEW_MS = 3  # how far each record's gateway clock may be off, while records are a millisecond apart
PEER, PEER_DOMAIN = "cy", "b.example"  # each case's ``cy`` is b.example's link
DEPTHS = st.sampled_from([0, 0, 1, -1, 2])
HOPS = st.sampled_from([[], [], ["a.example"], ["B.Example"], ["a.example", "b.example"]])


@dataclass(frozen=True)
class Case:
    """One scenario, names still abstract: ``prior`` (un)subscribes the job committed in an
    earlier batch, then ``batch``, the log the routing is compared on."""

    prior: tuple
    batch: tuple


def _paths(draw) -> st.SearchStrategy:
    """A topic tree below the case's root (``""`` is the root itself), and account topics and a child of each."""
    tree = draw(st.lists(st.lists(st.sampled_from(LEVELS), max_size=2).map("/".join), min_size=1, max_size=3))
    own = st.sampled_from([("tree", path) for path in tree])
    accounts = st.sampled_from([("account", f"{name}{rest}") for name in ACCOUNTS for rest in ("", "/x")])
    return st.one_of(own, own, accounts)


@st.composite
def cases(draw) -> Case:
    """One :class:`Case`: (un)subscribes with wildcards and SINCE/UNTIL, publishes to its tree, account
    topics and their children (reached by their owner, by nobody, or through several patterns)."""
    paths = _paths(draw)
    accounts = st.sampled_from(ACCOUNTS)
    pattern = st.tuples(paths, st.booleans())  # (path, wildcard)
    bound = st.one_of(st.none(), st.none(), INSTANTS)
    subscribe = st.tuples(st.just("sub"), accounts, pattern, bound, bound)
    unsubscribe = st.tuples(st.just("unsub"), accounts, st.one_of(pattern, pattern, pattern, st.just("everything")))
    publish = st.tuples(st.just("pub"), paths, INSTANTS, DEPTHS, HOPS)
    prior = draw(st.lists(st.one_of(subscribe, subscribe, unsubscribe), max_size=4))
    batch = draw(st.lists(st.one_of(subscribe, subscribe, subscribe, unsubscribe, publish, publish, publish),
                           min_size=3, max_size=12))
    return Case(tuple(prior), tuple(batch))


def _path(n: int, path: tuple[str, str]) -> str:
    kind, rest = path
    if kind == "account":
        return f"/accounts/c{n}{rest}"
    return f"/c{n}" + (f"/{rest}" if rest else "")


def _pattern(n: int, pattern) -> str:
    path, wildcard = pattern
    return _path(n, path) + ("/*" if wildcard else "")


def _events(n: int, ops: tuple) -> list:
    """Case ``n``'s ops as the events a gateway appends (canonical topics, lower-case accounts);
    the publish of op ``i`` has SMUID ``1000 n + i``."""
    made = []
    for i, op in enumerate(ops):
        if op[0] == "sub":
            _, account, pattern, since, until = op
            made.append(ev.Subscribe(f"c{n}{account}", "g", _pattern(n, pattern), US0,
                                     None if since is None else US0 + since, None if until is None else US0 + until))
        elif op[0] == "unsub":
            _, account, pattern = op
            everything = pattern == "everything"
            made.append(ev.Unsubscribe(f"c{n}{account}", "g", "/*" if everything else _pattern(n, pattern), US0,
                                       everything=everything))
        else:
            _, path, accepted, depth, hops = op
            made.append(ev.Publish(1000 * n + i, _path(n, path), "c", "pub", "g", US0 + accepted, depth=depth,
                                   hops=hops))
    return made


def _records(events: list, first_offset: int, skew_ms: Callable[[int], int]) -> pa.Table:
    """``events`` as the commands partition's records from ``first_offset``, a millisecond apart,
    each stamped by a gateway whose clock is ``skew_ms(offset)`` off."""
    rows = [{"key": None, "value": event.to_bytes(), "topic": "cmd", "partition": 0, "offset": first_offset + i,
             "timestamp": T0 + timedelta(milliseconds=first_offset + i + skew_ms(first_offset + i)),
             "timestampType": 0}
            for i, event in enumerate(events)]
    return pa.Table.from_pylist(rows, schema=arrow_schema(KAFKA_RECORD))


def peers_of(cases: int) -> dict[str, str]:
    """``[federation] peers`` of ``cases`` cases: each one's :data:`PEER` is b.example's link."""
    return {f"c{n}{PEER}": PEER_DOMAIN for n in range(cases)}


def gateway_routing(log: list, peers: Mapping[str, str] = routing.NO_PEERS) -> dict[int, list[str]]:
    """Each publish's recipients as a gateway's fold of ``log`` names them when it reaches it."""
    registry = Registry(is_account=lambda name: True, server_timeout="60")
    found = {}
    for offset, event in enumerate(log):
        if isinstance(event, ev.Publish):
            found[event.smuid] = registry.recipients(event.topic, event.accepted_at, depth=event.depth,
                                                     hops=event.hops, peers=peers)
        else:
            registry.apply(event, offset)
    return found


def job_routing(spark, prior: list, batch: list, skew_ms: Callable[[int], int] = lambda offset: 0,
                peers: Mapping[str, str] = routing.NO_PEERS) -> dict[int, list[str]]:
    """Each publish's recipients as the job routes ``batch`` after it committed ``prior``, the
    records' timestamps put in log order as the sink does (:func:`streaming.sink.decoding.in_log_order`)."""
    floors: dict[int, int] = {}

    def frame(events: list, first_offset: int):
        nonlocal floors
        records, floors = in_log_order(_records(events, first_offset, skew_ms), floors)
        return spark.createDataFrame(decode_records(records), schema=routing.EVENTS)

    nothing = spark.createDataFrame([], SUBSCRIPTIONS_TABLE)
    before = frame(prior, 0)
    current = routing.subscription_state(routing.subscription_intervals(nothing, before), 1).where("active")
    events = frame(batch, len(prior))
    routed = routing.route(events, routing.subscription_intervals(current, events), peers)
    found: dict[int, list[str]] = {e.smuid: [] for e in batch if isinstance(e, ev.Publish)}
    for row in routed.select("account", "smuid").collect():
        found[row.smuid].append(row.account)
    return {smuid: sorted(accounts) for smuid, accounts in found.items()}


def _disagreements(drawn: list[Case], gateway: dict, job: dict) -> list[str]:
    report = []
    for n, case in enumerate(drawn):
        log = _events(n, case.prior) + _events(n, case.batch)
        wrong = [(e, gateway[e.smuid], job[e.smuid]) for e in log
                 if isinstance(e, ev.Publish) and gateway[e.smuid] != job[e.smuid]]
        if wrong:
            report.append(f"case {n}: log {log}\n  " + "\n  ".join(
                f"publish {e.smuid} {e.topic} at +{e.accepted_at - US0}: gateway {g}, job {j}" for e, g, j in wrong))
    return report


def test_the_gateway_and_the_job_route_every_delivery_all_publish_to_the_same_accounts(spark):
    routed_cases = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(drawn=st.lists(cases(), min_size=CASES, max_size=CASES), clocks=st.randoms(use_true_random=False))
    def check(drawn: list[Case], clocks) -> None:
        prior = [e for n, case in enumerate(drawn) for e in _events(n, case.prior)]
        batch = [e for n, case in enumerate(drawn) for e in _events(n, case.batch)]
        skews = [clocks.randint(-SKEW_MS, SKEW_MS) for _ in range(len(prior) + len(batch))]
        peers = peers_of(len(drawn))
        gateway = gateway_routing(prior + batch, peers)
        job = job_routing(spark, prior, batch, skews.__getitem__, peers)
        assert set(job) == set(gateway)
        wrong = _disagreements(drawn, gateway, job)
        assert not wrong, "\n".join(wrong[:3])
        routed_cases.append(len(drawn))

    check()
    assert sum(routed_cases) >= 500


def test_a_publish_appended_after_a_subscribe_reaches_it_whatever_the_gateways_clocks(spark):
    """Gateway A appends SUBSCRIBE, gateway B, its clock 4 ms behind, the PUBLISH just after: offsets 0
    and 1 of the one commands partition, in one batch or in two.  The fold, in offset order, routes
    the publish to the subscriber, as Property 2 asks (the SUBSCRIBE was acknowledged first); the
    job ordered by timestamp first and routed it to nobody, until :func:`in_log_order`."""
    subscribe, publish = ev.Subscribe("ann", "g", "/t", US0), ev.Publish(1, "/t", "c", "pub", "g", US0)
    behind = {0: 0, 1: -4}.__getitem__

    assert gateway_routing([subscribe, publish]) == {1: ["ann"]}
    assert job_routing(spark, [], [subscribe, publish], behind) == {1: ["ann"]}
    assert job_routing(spark, [subscribe], [publish], behind) == {1: ["ann"]}


def test_a_peer_is_routed_a_publish_only_as_its_depth_and_hops_allow_by_the_gateway_and_the_job(spark):
    """b.example's link (a peer) and a local subscriber on one topic: Depth 0 stays local, a Depth that
    is not spent goes to the link unless its Hops passed b.example (in any case)."""
    peers = {"link": PEER_DOMAIN}
    log = [ev.Subscribe("link", "g", "/t", US0), ev.Subscribe("ann", "g", "/t", US0)] + [
        ev.Publish(n, "/t", "c", "pub", "g", US0, depth=depth, hops=hops) for n, (depth, hops) in enumerate(
            [(0, []), (1, []), (-1, ["a.example"]), (-1, ["B.EXAMPLE"]), (3, ["a.example", "b.example"])], 1)]
    expected = {1: ["ann"], 2: ["ann", "link"], 3: ["ann", "link"], 4: ["ann"], 5: ["ann"]}

    assert gateway_routing(log, peers) == expected
    assert job_routing(spark, log[:2], log[2:], peers=peers) == expected
