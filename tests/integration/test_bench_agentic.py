"""bench/agentic.py --quick end to end: every section runs on the real tiny model, the result follows the harness
schema, and every run's episode ledger balances (the script asserts it; the counts are checked again here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import harness

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_agentic_bench_quick_writes_a_balanced_report(tmp_path: Path, user_env: dict[str, str]) -> None:
    out = tmp_path / "agentic.json"
    command = [sys.executable, "bench/agentic.py", "--quick", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, env=user_env, check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    harness.check_schema(result)
    assert result["benchmark"] == "agentic" and result["quick"] is True and "--quick" in result["command"]
    headline = ["headline/sync", "headline/sync_lockstep", "headline/env_async", "headline/async_redundant"]
    assert list(result["arms"])[:4] == headline
    assert {"sigma0.0/sync", "sigma1.5/env_async", "redundancy/async_groups+1_episodes+1"} <= set(
        result["arms"]
    )
    syncs = {arm for arm in result["arms"] if arm.endswith(("/sync", "/sync_lockstep"))}
    assert set(result["ratios"]) == {f"{arm}_vs_best_sync" for arm in set(result["arms"]) - syncs}
    for key, ratio in result["ratios"].items():  # each divides by its own section's best sync
        section = key.split("/")[0]
        assert ratio["denominator"] == f"{section}/{result['best_sync'][section]}"
    assert set(result["targets"]) == {
        "headline: best async arm >= 2x best sync episodes/s",
        "sigma sweep: env_async/best sync grows with sigma",
    }
    for arm, metrics in result["arms"].items():
        runs = zip(
            *(metrics[m]["runs"] for m in ("started", "trained", "dropped_by_producer", "dropped_by_buffer")),
            strict=True,
        )
        dropped_total = 0.0
        for started, trained, by_producer, by_buffer in runs:
            assert started == trained + by_producer + by_buffer > 0, arm
            dropped_total += by_producer + by_buffer
        assert sum(result["drop_reasons"][arm].values()) == dropped_total, arm
        assert metrics["episodes_per_s"]["min"] > 0
    faults = [
        reason
        for arm, reasons in result["drop_reasons"].items()
        if arm.startswith("redundancy/")
        for reason in reasons
    ]
    assert any("fail-stop" in reason for reason in faults)
