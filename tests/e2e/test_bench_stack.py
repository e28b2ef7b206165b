"""The stack the benchmark scripts start (``deploy.stack.running_stack``)."""

from __future__ import annotations

from deploy.local import routed_records
from deploy.stack import running_stack


def test_the_benchmarks_get_the_stack_only_once_its_job_has_routed_a_batch():
    """A benchmark's first workload must not run against the job's start-up (Spark's session and the
    routing query's warm-up on the same cores): the stack is handed over after the job's first
    micro-batch, which it announces on the deliveries topic."""
    with running_stack({"bench": "bench-pw"}) as stack:
        assert routed_records(stack.config) > 0
        assert stack.children["job"].poll() is None
