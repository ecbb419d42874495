"""bench/run_all.py and bench/registry.py: every benchmark is registered with a script that exists, every
headline points at a section of docs/benchmarks.md, and the regression check flags a metric exactly when the
two runs' spreads no longer overlap."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run_all
from bench.registry import BENCHMARKS, GPU_RESULTS

ROOT = Path(__file__).resolve().parents[3]


def stats(low: float, mid: float, high: float) -> dict[str, object]:
    return {"min": low, "median": mid, "max": high, "runs": [low, mid, high]}


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_result_file_is_written_by_a_registered_benchmark() -> None:
    registered = {b.result for b in BENCHMARKS}
    results = {path.stem for path in (ROOT / "bench/results").glob("*.json")} - {run_all.SUMMARY}
    assert results - set(GPU_RESULTS) <= registered, "a result no benchmark of bench/registry.py rewrites"
    assert all((ROOT / b.args[0]).is_file() for b in BENCHMARKS)
    assert len(registered) == len(BENCHMARKS), "two benchmarks write one result file"


def test_every_headline_links_to_a_section_of_the_benchmarks_page() -> None:
    text = (ROOT / "docs/benchmarks.md").read_text()
    anchors = {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    sections = {h.section for b in BENCHMARKS for h in b.headlines}
    assert sections and sections <= anchors, sections - anchors


def test_regression_check_flags_only_spreads_that_do_not_overlap() -> None:
    old = {"commit": "a", "arms": {"x": {"rate": stats(10, 11, 12), "steady": stats(5, 6, 7)}}, "ratios": {}}
    new = {
        "commit": "b",
        "arms": {"x": {"rate": stats(8, 8.5, 9.5), "steady": stats(6.5, 7, 8), "fresh": stats(1, 1, 1)}},
        "ratios": {"r": stats(1, 1, 1)},
    }
    got = run_all.compare(old, new)
    assert got["previous_commit"] == "a" and got["compared"] == 2 and got["new_metrics"] == 2
    [flag] = got["flagged"]
    assert flag["metric"] == "x / rate" and flag["change"] == 8.5 / 11


def test_a_dry_run_states_every_benchmark_and_the_total_cost(user_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "bench/run_all.py", "--dry-run"],
        cwd=ROOT,
        env=user_env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    total = sum(b.minutes for b in BENCHMARKS)
    assert f"expected ~{total:.0f} min" in done.stdout
    assert all(f"python {' '.join(b.args)}" in done.stdout for b in BENCHMARKS)


@pytest.mark.slow  # a benchmark's --quick run: CI runs it with the other slow tests
def test_quick_runs_each_chosen_benchmark_quick_mode(user_env: dict[str, str]) -> None:
    command = [sys.executable, "bench/run_all.py", "--quick", "--only", "simulator"]
    done = subprocess.run(command, cwd=ROOT, env=user_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bench/simulator.py --quick --out" in done.stdout and "failed: none" in done.stdout
