"""bench/agentic_learning.py --quick: warm start then RL on Sokoban end to end, and the report's schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_agentic_learning_quick_reports_before_and_after(tmp_path: Path) -> None:
    out = tmp_path / "learning.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "bench/agentic_learning.py", "--quick", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    assert {"command", "commit", "machine", "config", "warm_start", "seeds", "gain"} <= report.keys()
    (row,) = report["seeds"]
    assert row["gain"] == pytest.approx(row["after"] - row["before"])
    assert -1.0 <= row["before"] <= 1.0 and report["gain"]["median"] == row["gain"]
