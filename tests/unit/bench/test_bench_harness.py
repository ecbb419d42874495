"""The harness interleaves arms, keeps every repeat, pairs ratios by repeat, and refuses results without spread."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import harness

ROOT = Path(__file__).resolve().parents[3]


def test_arms_run_interleaved_with_rotating_order_and_every_repeat_kept() -> None:
    calls: list[str] = []
    counter = {"a": 0, "b": 0}

    def arm(name: str):
        def run() -> dict[str, float]:
            calls.append(name)
            counter[name] += 1
            return {"x": float(counter[name])}

        return run

    raw = harness.run_arms({"a": arm("a"), "b": arm("b")}, repeats=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert [run["x"] for run in raw["a"]] == [1.0, 2.0, 3.0]
    stats = harness.summarize(raw)["a"]["x"]
    assert stats == {"min": 1.0, "median": 2.0, "max": 3.0, "runs": [1.0, 2.0, 3.0]}


def test_ratio_is_per_paired_repeat_not_ratio_of_medians() -> None:
    raw = {"a": [{"t": 2.0}, {"t": 9.0}, {"t": 4.0}], "b": [{"t": 1.0}, {"t": 9.0}, {"t": 1.0}]}
    ratio = harness.paired_ratio(raw, "a", "b", "t")
    assert ratio["runs"] == [2.0, 1.0, 4.0]
    assert ratio["median"] == 2.0  # the ratio of medians would be 4 / 1 = 4
    with pytest.raises(ValueError, match="not paired"):
        harness.paired_ratio({"a": raw["a"], "b": raw["b"][:2]}, "a", "b", "t")


def test_fewer_than_three_repeats_is_refused_unless_quick() -> None:
    assert harness.repeats_for(argparse.Namespace(quick=True, repeats=1)) == 1
    with pytest.raises(SystemExit, match="repeats"):
        harness.repeats_for(argparse.Namespace(quick=False, repeats=2))


def test_written_result_follows_the_schema(tmp_path) -> None:
    args = argparse.Namespace(quick=True, out=str(tmp_path / "x.json"))
    raw = {"a": [{"t": 2.0}], "b": [{"t": 1.0}]}
    harness.write_result(
        args,
        "x",
        raw,
        ratios={"t": harness.paired_ratio(raw, "a", "b", "t")},
        resources={"a": {"threads": 1}},
    )
    result = json.loads((tmp_path / "x.json").read_text())
    harness.check_schema(result)
    assert result["machine"]["cores"] >= 1 and result["machine"]["cpu_model"]
    del result["arms"]["a"]["t"]["runs"]
    with pytest.raises(ValueError, match=r"a\.t lacks \['runs'\]"):
        harness.check_schema(result)


def test_a_named_commit_overrides_what_git_says(monkeypatch) -> None:
    monkeypatch.delenv("ASYNCRL_BENCH_COMMIT", raising=False)
    from_git = harness.git_commit()
    assert from_git != "0123abc"
    monkeypatch.setenv("ASYNCRL_BENCH_COMMIT", "0123abc")
    assert harness.git_commit() == "0123abc"


def test_a_commit_made_while_a_benchmark_runs_does_not_relabel_its_result(monkeypatch) -> None:
    monkeypatch.setenv("ASYNCRL_BENCH_COMMIT", "started-at")
    monkeypatch.setattr(harness, "_start_commit", [])
    harness.parser("x", "x")
    monkeypatch.setenv("ASYNCRL_BENCH_COMMIT", "committed-meanwhile")
    assert harness.run_commit() == "started-at"


def test_a_child_started_by_a_large_parent_reports_its_own_peak_not_the_parents() -> None:
    """``ru_maxrss`` survives ``execve`` on Linux, so a trainer child of a 2.8 GB benchmark once read 2.8 GB
    whatever it did; ``resident_memory_mb`` reads the child's own address space."""
    ballast = bytearray(400 * 2**20)
    ballast[::4096] = b"\x01" * len(ballast[::4096])  # touch every page: resident, not just reserved
    child = (
        "import json, resource; from bench import harness; "
        "print(json.dumps([harness.resident_memory_mb()['peak_rss_mb'], "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True, env=env)
    own_peak, inherited_maxrss = json.loads(done.stdout)
    assert inherited_maxrss > 400  # the trap this guards against is real here
    assert own_peak < 300  # an interpreter and the harness's imports, not the parent's 400 MB
    del ballast


def test_a_run_that_never_reaches_its_target_is_kept_as_censored_not_dropped() -> None:
    seeds = [
        harness.TimeToReward(reference_s=30.0, reached_s=15.0, run_s=40.0),
        harness.TimeToReward(reference_s=30.0, reached_s=None, run_s=60.0),  # never got there in 60 s
    ]
    ratio = harness.time_to_reward_ratio("sync", "async", "time to sync's reward", seeds, seeds[0])
    assert ratio["runs"] == [
        2.0,
        0.5,
    ]  # the censored seed: at most 30 / 60, its run's length a floor on its time
    assert (ratio["censored"], ratio["reached"], ratio["seeds"]) == ([False, True], 1, 2)
    assert (ratio["mean_over_seeds"], ratio["mean_over_seeds_censored"]) == (2.0, False)
    harness.check_time_to_reward("r", ratio, repeats=2)
    with pytest.raises(ValueError, match="at the start"):
        _ = harness.TimeToReward(reference_s=30.0, reached_s=0.0, run_s=60.0).ratio


def test_the_schema_refuses_a_time_to_reward_ratio_that_drops_a_seed() -> None:
    seeds = [harness.TimeToReward(10.0, 5.0, 20.0), harness.TimeToReward(10.0, None, 20.0)]
    ratio = harness.time_to_reward_ratio("sync", "async", "time to sync's final reward", seeds, seeds[0])
    stats = {"t": {"min": 1.0, "median": 1.0, "max": 1.0, "runs": [1.0, 1.0]}}
    result = {
        "schema": harness.SCHEMA_VERSION,
        **dict.fromkeys(("benchmark", "command", "commit"), "x"),
        "machine": {},
        "resources": {},
        "arms": {"a": stats},
        "repeats": 2,
        "ratios": {"ttr": ratio},
    }
    harness.check_schema(result)
    dropped = {**ratio, "runs": [2.0], "censored": [False], "seeds": 1}
    with pytest.raises(ValueError, match="1 runs .* for 2 seeds"):
        harness.check_schema({**result, "ratios": {"ttr": dropped}})
    # a ratio that times a reward but was built by hand (so could have dropped a seed) is refused
    by_hand = {"numerator": "s", "denominator": "a", "metric": "loop s to the final reward", **stats["t"]}
    with pytest.raises(ValueError, match="not built by harness.time_to_reward_ratio"):
        harness.check_schema({**result, "ratios": {"ttr": by_hand}})
    throughput = {"numerator": "s", "denominator": "a", "metric": "samples_per_s", **stats["t"]}
    harness.check_schema({**result, "ratios": {"time_to_reward_samples_per_s": throughput}})


def test_no_time_to_reward_ratio_in_the_stored_results_has_fewer_runs_than_seeds() -> None:
    found = 0
    for path in sorted((ROOT / "bench/results").glob("*.json")):
        result = json.loads(path.read_text())
        for key, stats in result.get("ratios", {}).items():
            if isinstance(stats, dict) and harness.times_a_reward(stats):
                harness.check_time_to_reward(f"{path.name}:{key}", stats, result["repeats"])
                found += 1
    assert found >= 3  # long_tail's two and sync_vs_trl's


def test_the_best_arm_is_chosen_by_the_paired_ratio_not_the_median() -> None:
    # b has the higher median (10.1 against 10.0) but a beats it in two repeats of three, by 5 %
    raw = {
        "a": [{"x": 10.0}, {"x": 8.4}, {"x": 12.6}],
        "b": [{"x": 10.1}, {"x": 8.0}, {"x": 12.0}],
        "c": [{"x": 5.0}, {"x": 4.0}, {"x": 6.0}],
    }
    choice = harness.best_by_paired_ratio(raw, ["a", "b", "c"], "x")
    assert (choice["name"], choice["runner_up"]) == ("a", "b")
    assert choice["over_runner_up"]["median"] == pytest.approx(1.05)
    assert harness.best_by_paired_ratio(raw, ["c"], "x") | {"chosen_by": ""} == {"name": "c", "chosen_by": ""}


def test_a_sweep_whose_best_sits_at_its_edge_says_so() -> None:
    axis = {"r0": 0.0, "r4": 0.25, "r2": 0.5}
    assert "0.5, is its largest value" in harness.sweep_edge(axis, "r2", "share")
    assert "0, is its smallest value" in harness.sweep_edge(axis, "r0", "share")
    assert harness.sweep_edge(axis, "r4", "share") is None
    assert harness.sweep_edge(axis, "other", "share") is None
