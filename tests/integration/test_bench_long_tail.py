"""bench/long_tail.py --quick end to end: every stage (sync sweep, lone roles, async arms, time to reward, the
curve, partial rollout's time to reward) on the tiny twin of the long-tail workload, each run in its own process; the result follows the harness
schema, names its best sync, bounds its arms by the lone roles and records memory and timelines. Timings are
recorded, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import harness
from bench.long_tail import MEASURED_CODE
from bench.provenance import code_changes_since

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_long_tail_quick_runs_every_stage(tmp_path: Path, user_env: dict[str, str]) -> None:
    out = tmp_path / "long_tail.json"
    command = [sys.executable, "bench/long_tail.py", "--quick", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, env=user_env, check=True, capture_output=True, timeout=900)
    result = json.loads(out.read_text())
    harness.check_schema(result)
    assert result["benchmark"] == "long_tail" and result["quick"] is True and "--quick" in result["command"]
    stages = ["sweep", "bound", "throughput", "time_to_reward", "curve", "partial_time_to_reward"]
    assert set(result["studies"]) == set(stages) and result["setup"]["stages"] == stages
    assert result["best_sync"]["name"] in ("sync_batch", "sync_queue_rb2")
    assert "throughput_async_a2_over_best_sync" in result["ratios"]
    assert set(result["bound"]) >= {"throughput/best_sync", "throughput/async_a2", "time_to_reward/async_a2"}
    assert {"engine_alone_async", "trainer_alone_async", "process_baseline"} <= set(
        result["memory_per_role_mb"]
    )
    assert all("peak_rss_mb" in metrics for arm, metrics in result["arms"].items() if "/" in arm)
    evals = result["time_to_reward"]["evals"]
    assert [e["step"] for e in evals["async_a2"][0]] == [2, 4]  # every eval_every steps of the quick twin
    partial = result["partial_time_to_reward"]
    assert [e["step"] for e in partial["evals"]["partial_rollout_a2"][0]] == [2, 4]
    assert "eval/reward_mean" in partial["warm_start"]  # its own start, measured with its arms
    assert "partial_time_to_reward_samples_per_s_partial_rollout_a2_over_best_sync" in result["ratios"]
    digests = {study["warm_start_sha256"] for study in result["studies"].values()}
    assert len(digests) == 1 and len(digests.pop()) == 64  # every stage names the one build it ran on
    assert (
        len(result["timelines"]["throughput/async_a2"][0]) == 3
    )  # warm-up + measured steps, every step kept


@pytest.mark.slow
def test_a_stopped_run_is_continued_with_its_stages_kept(tmp_path: Path, user_env: dict[str, str]) -> None:
    head = harness.git_commit().removesuffix("+dirty")
    if code_changes_since(head, MEASURED_CODE) != []:
        pytest.skip("the measured code has uncommitted changes here: a continued run is refused on them")
    stopped, continued = tmp_path / "stopped.json", tmp_path / "continued.json"
    base = [sys.executable, "bench/long_tail.py", "--quick"]
    env = {**user_env, "ASYNCRL_BENCH_COMMIT": head}  # edits outside the measured code do not block this test
    run = dict(cwd=ROOT, env=env, check=True, capture_output=True, timeout=900)
    subprocess.run([*base, "--stages", "sweep", "--out", str(stopped)], **run)
    subprocess.run(
        [*base, "--extend", str(stopped), "--stages", "sweep", "bound", "--out", str(continued)], **run
    )
    first, second = (json.loads(p.read_text()) for p in (stopped, continued))
    harness.check_schema(second)
    assert first["setup"]["stages"] == ["sweep"] and second["setup"]["stages"] == ["sweep", "bound"]
    sweep_arms = {arm: stats for arm, stats in second["arms"].items() if arm.startswith("sweep/")}
    assert sweep_arms == first["arms"]  # kept, not re-run
    assert second["best_sync"] == first["best_sync"] and second["timelines"] == first["timelines"]
    assert second["studies"]["sweep"]["commit"] == first["commit"]
    assert "bound/trainer_alone_async" in second["arms"]
