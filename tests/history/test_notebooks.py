"""Both notebooks, executed headless end to end against the generated history (conftest)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.history.conftest import IBM, SPORT, WEATHER

pytestmark = pytest.mark.e2e

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def run_notebook(name: str, out_dir: Path) -> dict:
    """Execute ``notebooks/<name>`` in a fresh kernel; returns the JSON its last cell prints.

    The executed copy (with its plots) is saved under ``out_dir`` for a look.
    """
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    nbformat.write(notebook, out_dir / name)
    images = sum("image/png" in output.get("data", {}) for cell in notebook.cells
                 for output in cell.get("outputs", []))
    assert images >= 4, f"{name}: {images} plots"
    printed = "".join(o.get("text", "") for o in notebook.cells[-1].outputs if o.output_type == "stream")
    return json.loads(printed.strip().splitlines()[-1])


@pytest.fixture
def notebook_env(history, monkeypatch):
    monkeypatch.delenv("SMQP_CONFIG", raising=False)
    monkeypatch.setenv("SMQP_DATA_DIR", history.data_dir)
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core's platformdirs migration, no warning
    return history


def test_history_notebook(notebook_env, monkeypatch, tmp_path):
    history = notebook_env
    monkeypatch.setenv("SMQP_TOPIC", SPORT)
    monkeypatch.setenv("SMQP_AS_OF", history.t1.isoformat())
    summary = run_notebook("history.ipynb", tmp_path)
    assert summary["messages_per_topic"] == {SPORT: 5, WEATHER: 2, IBM: 1}
    assert summary["smuid"] == history.smuids[SPORT][0]
    assert summary["queue_then"] == 6  # bob's 3 and carol's 3, none acknowledged at t1
    assert summary["pending_then"] == {SPORT: 6, WEATHER: 2}
    assert summary["pending_now"] == {SPORT: 4, WEATHER: 0}
    assert sorted(summary["subscribers_by_latency"]) == ["bob", "carol"]
    trail = summary["trail"]
    assert trail[0] == ["accepted", "alice"]
    assert sorted(map(tuple, trail[1:])) == [("acked", "bob"), ("acked", "carol"), ("routed", "bob"),
                                             ("routed", "carol")]


def test_ops_notebook(notebook_env, tmp_path):
    summary = run_notebook("ops.ipynb", tmp_path)
    assert summary["batches"] >= 1
    assert summary["rows_in"] == summary["end_offsets"]  # every command and ACK consumed, each batch recorded once
    assert summary["pending_per_topic"] == {SPORT: 4}
    assert summary["pending_per_account"] == {"carol": 4}
