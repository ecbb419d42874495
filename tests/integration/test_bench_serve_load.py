"""``bench/serve_load.py --quick`` as a user runs it: the harness schema, and the endpoint's targets under load
(counts, never timings): no error and no refusal within the bound, the overflow refused with ``Retry-After``
above it, and no refusal once load drops."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import harness

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a benchmark's --quick run: CI runs it with the other slow tests
def test_quick_serve_load_meets_its_targets(tmp_path: Path, user_env: dict[str, str]) -> None:
    out = tmp_path / "serve_load.json"
    subprocess.run(
        [sys.executable, "bench/serve_load.py", "--quick", "--out", str(out)],
        cwd=ROOT,
        env=user_env,
        check=True,
        capture_output=True,
        timeout=240,
    )
    result = json.loads(out.read_text())
    harness.check_schema(result)
    assert result["benchmark"] == "serve_load" and result["quick"] is True
    bound, arms = result["setup"]["bound"], result["arms"]
    for name, metrics in arms.items():
        assert metrics["errors"]["max"] == 0, name
        assert metrics["refused_without_retry_after"]["max"] == 0, name
        if int(name.removeprefix("c")) <= bound:
            assert metrics["refused"]["max"] == 0, name
    top = arms[f"c{max(result['setup']['levels'])}"]
    assert top["refused"]["min"] > 0  # more sessions than the bound: the overflow is answered, not queued
    assert top["recovery_refused"]["max"] == top["recovery_errors"]["max"] == 0
