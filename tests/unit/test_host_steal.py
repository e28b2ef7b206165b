"""The benchmarks' reading of how much CPU the hypervisor took from this VM during a run."""

from __future__ import annotations

from deploy.compare import headline
from deploy.stack import host_cpu_ticks, steal_percent


def test_steal_is_the_stolen_share_of_the_ticks_between_two_readings():
    assert steal_percent((10_000, 500), (11_000, 810)) == 31.0
    assert steal_percent((10_000, 500), (10_000, 500)) == 0.0  # no time passed: nothing to divide


def test_this_machines_ticks_move_forward_and_give_a_share():
    before = host_cpu_ticks()
    sum(range(3_000_000))  # let a few ticks pass
    after = host_cpu_ticks()
    assert after[0] > before[0] and after[1] >= before[1]
    assert 0.0 <= steal_percent(before, after) <= 100.0


def test_a_runs_progress_line_says_how_much_the_host_stole():
    line = headline("ingest", {"msgs_per_s": 9_000, "steal_pct": 31.0})
    assert line.endswith("host steal 31.0 %")
