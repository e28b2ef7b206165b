"""The routing query within the job's own heap, on the heaviest batch found so far."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.timeout(600)  # a Spark session of its own, and two routing-query batches, on a loaded 2-core host
def test_a_batch_with_late_subscribers_and_a_receipt_due_routes_within_the_jobs_heap():
    """Late subscribers beside a receipt falling due, in one batch, ran the job's 512 MiB heap out
    while Spark planned the routing query; the JVM exited, and the job, started again on its
    checkpoint, would have replayed the same batch and exited again.  Now both batches route: the
    first answers a receipt, the second delivers to its late subscribers and settles its ACKs (on a
    2 GiB heap, the single query of before routed the same counts of every output)."""
    run = subprocess.run([sys.executable, "-m", "tests.streaming.heavy_batch"], cwd=ROOT, capture_output=True,
                         text=True, timeout=540, env=dict(os.environ, PYTHONPATH=str(ROOT)))

    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    batches = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [batch["batch"] for batch in batches] == [6, 7]
    first, second = batches
    assert first["receipts"] > 0, first
    assert second["deliver"] > 0 and second["acked"] > 0, second
