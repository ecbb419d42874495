"""bench/agentic.py --quick end to end: every section runs on the real tiny model, the result JSON has the
brief's schema (command, commit, machine, every repeat, paired ratios, median/min/max), and every run's
episode ledger balances (the script asserts it; the counts are checked again here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_agentic_bench_quick_writes_a_balanced_report(tmp_path: Path) -> None:
    out = tmp_path / "agentic.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "bench/agentic.py", "--quick", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    assert {"command", "commit", "machine", "workload", "targets"} <= report.keys()
    assert "--quick" in report["command"] and report["machine"]["cpus"] >= 1
    sections = [report["headline"], *report["sigma_sweep"], report["redundancy"]]
    assert [s["sigma"] for s in report["sigma_sweep"]] == [0.0, 1.5]
    assert list(report["headline"]["summary"]) == ["sync", "env_async", "async_redundant"]
    for section in sections:
        for arm, rows in section["repeats"].items():
            summary = section["summary"][arm]
            assert len(rows) == len(summary["ratio_vs_sync_per_repeat"]) == report["workload"]["repeats"]
            assert summary["ratio_vs_sync"]["min"] <= summary["ratio_vs_sync"]["median"]
            for row in rows:
                dropped = row["dropped_by_producer"] + row["dropped_by_buffer"]
                assert row["started"] == row["trained"] + dropped > 0
                assert sum(row["drop_reasons"].values()) == dropped
                assert row["episodes_per_s"] > 0
    faults = report["redundancy"]["repeats"]
    assert any(
        "fail-stop" in reason for rows in faults.values() for r in rows for reason in r["drop_reasons"]
    )
