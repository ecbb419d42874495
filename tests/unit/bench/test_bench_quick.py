"""Every ported benchmark runs in its --quick mode and writes the harness schema, so none can rot silently.

Asserts only that it ran and what it wrote is well-formed: timings are never asserted in tests. Marked ``slow``
(8-40 s of CPU each, most of the default suite's time when they were in it): CI runs them after the default
suite, and test_documented_commands.py checks in the default suite that every benchmark starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import harness

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
QUICK = [
    "simulator",
    "control_plane",
    "engine",
    "trainer",
    "async_vs_sync",
    "offpolicy",
    "distributed",
    "default_run",
    "sim_vs_real",
    "sync_vs_trl",
    "agentic_learning",
    "critic_learning",
    "sim_studies",
    "paper_tables",
    "agents_external",
    "ray_calls",
    "weight_sync",
    "lora",
    "deterministic",
]
"""Every benchmark on the harness. ``agentic`` runs in tests/integration/test_bench_agentic.py, which also checks
its episode ledgers."""


@pytest.mark.parametrize("name", QUICK)
def test_quick_run_writes_the_schema(name: str, tmp_path: Path, user_env: dict[str, str]) -> None:
    out = tmp_path / f"{name}.json"
    done = subprocess.run(
        [sys.executable, f"bench/{name}.py", "--quick", "--out", str(out)],
        cwd=ROOT,
        env=user_env,
        check=True,
        capture_output=True,  # bytes: text mode would turn the carriage returns looked for into newlines
        timeout=120,
    )
    assert b"\r" not in done.stdout + done.stderr, "a library drew a carriage-return progress bar into a log"
    result = json.loads(out.read_text())
    harness.check_schema(result)
    assert result["benchmark"] == name and result["quick"] is True
    assert "--quick" in result["command"]


def test_quick_decode_attention_part_writes_its_own_result(tmp_path: Path, user_env: dict[str, str]) -> None:
    """engine.py --part decode_attention: both plans at every mix, a paired ratio per mix, and beside the times
    the positions each plan reads (more for the longest context wherever contexts differ, the same where not)
    and the SDPA kernels each step dispatched to."""
    out = tmp_path / "engine_attention.json"
    command = [sys.executable, "bench/engine.py", "--quick", "--part", "decode_attention", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, env=user_env, check=True, capture_output=True, timeout=120)
    result = json.loads(out.read_text())
    harness.check_schema(result)
    mixes, plans = ("tail", "spread", "equal"), ("bucketed", "longest")
    assert result["benchmark"] == "engine_attention"
    assert set(result["arms"]) == {f"{plan}_{mix}" for plan in plans for mix in mixes}
    assert set(result["ratios"]) == {f"{mix}_longest_over_bucketed" for mix in mixes}
    read = {arm: metrics["kv_positions_per_layer"]["median"] for arm, metrics in result["arms"].items()}
    assert read["longest_tail"] > read["bucketed_tail"] and read["longest_spread"] > read["bucketed_spread"]
    assert read["longest_equal"] == read["bucketed_equal"]
    assert all(
        ops and all(name.startswith("aten::_scaled_dot_product") for name in ops)
        for ops in result["setup"]["sdpa_ops"].values()
    )
    assert [row[0] for row in result["table"]["rows"]] == list(mixes)
    assert result["setup"]["decode_path"] == {"path": "dynamic", "captures": 0}  # the engine's CPU default


def test_quick_agentic_example_run_writes_its_own_result(tmp_path: Path, user_env: dict[str, str]) -> None:
    """default_run.py --example agentic: the agentic example and its sync twin, under its own name."""
    out = tmp_path / "agentic_run.json"
    command = [sys.executable, "bench/default_run.py", "--quick", "--example", "agentic", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, env=user_env, check=True, capture_output=True, timeout=120)
    result = json.loads(out.read_text())
    harness.check_schema(result)
    assert result["benchmark"] == "agentic_run" and set(result["arms"]) == {"agentic", "sync", "sync_1thread"}
    assert "faster_sync_over_agentic_train_wall_s" in result["ratios"]
