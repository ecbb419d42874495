"""``asyncrl plan``: the choice rule on exact numbers, the workload read from a run, and a whole search."""

from __future__ import annotations

import json
import math

import pytest

from asyncrl.app.planner import (
    COLOCATED_SYNC,
    Candidate,
    Outcome,
    Planner,
    choose,
    why_lost,
    workload_from_run,
)
from asyncrl.cli.main import main


def outcome(
    mode: str, alpha: float, samples_per_s: float, staleness: float, train: int | None = 4
) -> Outcome:
    return Outcome(
        candidate=Candidate(mode=mode, alpha=alpha, train_gpus=train),
        step_s=100 / samples_per_s,
        samples_per_s=samples_per_s,
        mean_staleness=staleness,
        engine_busy=0.9,
        trainer_busy=0.5,
        converged=True,
    )


def test_the_least_stale_within_the_tolerance_wins():
    sync = outcome("sync", 0, 1.0, 0.0, train=None)
    a1, a2, a4 = (
        outcome("partial_rollout", a, rate, age)
        for a, rate, age in ((1, 1.50, 0.6), (2, 1.60, 1.1), (4, 1.61, 1.9))
    )
    best, runner_up = choose([sync, a1, a2, a4], tolerance=0.02)
    assert best is a2 and runner_up is a4  # α = 4 is 0.6 % faster: not worth 0.8 more versions of age
    assert "within the tolerance" in why_lost(best, runner_up, 8)
    best, runner_up = choose([sync, a1, a2, a4], tolerance=0.0)
    assert best is a4 and runner_up is a2 and why_lost(best, runner_up, 8).startswith("0.6% lower throughput")


def test_the_workload_of_a_real_run(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"rollout": {"rollout_batch_size": 32, "num_return_sequences": 8, "max_new_tokens": 4096}})
    )
    rows = [
        {"step": 1, "response_length/mean": 900, "response_length/p50": 500, "response_length/p99": 5000},
        {"step": 2, "response_length/mean": 1100, "response_length/p50": 700, "response_length/p99": 7000},
        {"step": 2, "eval/reward_mean": 0.3},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = workload_from_run(tmp_path)
    assert "lengths.mean=1000" in overrides and "rollout.max_new_tokens=4096" in overrides
    sigma = float(next(o for o in overrides if o.startswith("lengths.sigma=")).split("=")[1])
    assert sigma == pytest.approx(math.log(6000 / 600) / 2.326, rel=1e-3)
    with pytest.raises(ValueError, match="no config.json"):
        workload_from_run(tmp_path / "missing")


SMALL = [
    "model=qwen3-0.6b",
    "hardware=h100",
    "prompt_tokens=128",
    "lengths.mean=400",
    "rollout.max_new_tokens=2048",
    "rollout.rollout_batch_size=8",
    "rollout.num_return_sequences=4",
    "steady_state.window_steps=3",
    "steady_state.warmup_steps=2",
    "controller.num_steps=12",
]


def test_a_search_covers_the_baseline_splits_and_schedules():
    planner = Planner(None, SMALL, gpus=8)
    result = planner.search(alphas=(1, 2), tolerance=0.02)
    labels = {o.candidate.label(8) for o in result.outcomes}
    assert "sync colocated on 8" in labels  # the baseline every plan is compared with
    assert any(label.startswith("one_step_off a=1 ") for label in labels)
    modes = {o.candidate.mode for o in result.outcomes}
    assert modes == {"sync", "one_step_off", "async", "partial_rollout", "multi_version"}
    splits = {o.candidate.train_gpus for o in result.outcomes if o.candidate.mode == "partial_rollout"}
    assert len(splits) >= 4 and all(1 <= t <= 7 for t in splits)
    best = max(o.samples_per_s for o in result.outcomes)
    assert result.recommended.samples_per_s >= best * 0.98
    assert result.runner_up is not result.recommended


def test_plan_cli_prints_a_recommendation_and_writes_it(tmp_path, capsys):
    assert main(["plan", *SMALL, f"output_dir={tmp_path}", "--gpus", "8", "--alphas", "2"]) == 0
    out = capsys.readouterr().out
    assert "recommended:" in out and "runner-up:" in out and "Proposition 2" in out
    record = json.loads((tmp_path / "plan.json").read_text())
    assert record["gpus"] == 8 and record["recommended"]["speedup"] > 0
    assert main(["plan", "lengths.mean=100", "--gpus", "8"]) == 2  # no model: a named error, not a traceback


def test_a_critic_slows_the_trainer_side_and_lora_speeds_it():
    """The same candidates under the same workload: a separate critic adds its own passes and optimizer to every
    train step, LoRA drops the frozen weights' gradient GEMMs and optimizer (``asyncrl.sim.trained``)."""
    keys = {"plain": [], "critic": ["memory.critic=separate"], "lora": ["memory.lora_rank=16"]}
    planners = {name: Planner(None, [*SMALL, "memory.check=false", *k], gpus=8) for name, k in keys.items()}
    per_token = {name: p.base.trainer.gpu_s_per_token for name, p in planners.items()}
    assert per_token["lora"] < per_token["plain"] < per_token["critic"]
    beta = {name: p.proposition(2).beta for name, p in planners.items()}  # Proposition 2's train share
    assert beta["lora"] < beta["plain"] < beta["critic"]
    sync = {name: p.evaluate(COLOCATED_SYNC) for name, p in planners.items()}  # generate, then train
    assert sync["lora"].step_s < sync["plain"].step_s < sync["critic"].step_s
    split = Candidate(mode="one_step_off", alpha=1, train_gpus=4)
    busy = {name: p.evaluate(split).trainer_busy for name, p in planners.items()}
    assert busy["lora"] < busy["plain"] < busy["critic"]
