"""Evaluation during training on the shipped tiny model, end to end: the lines carry each due evaluation once,
an evaluation still running at a checkpoint gets its line after a resume from it, and ``asyncrl report``
draws the curves (before, during, after)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.metrics.report import load_run, write_report
from asyncrl.metrics.tracker import read_metrics

RUN = (
    "controller.mode=async",
    "buffer.async_ratio=2",
    "controller.eval_prompts=8",
    "controller.eval_every=2",
    "controller.eval_sets=[{name: held, size: 6, samples_per_prompt: 2}]",
    "rollout.rollout_batch_size=2",
    "rollout.num_return_sequences=4",
    "rollout.max_new_tokens=12",
    "task.num_train=64",
    "task.num_eval=8",
    "trainer.checkpoint_every=2",
    "model.device=cpu",
    "metrics.trackers=[jsonl]",
)


def train(out: Path, steps: int, resume: str = "") -> None:
    overrides = [*RUN, f"controller.num_steps={steps}", f"output_dir={out}"]
    config = load_run_config(None, [*overrides, *([f"resume={resume}"] if resume else [])])
    asyncio.run(training.train(config, console=None))


def eval_lines(out: Path) -> list[tuple[int, int]]:
    """(line step, step evaluated) of every line carrying the set's evaluation."""
    return [
        (r["step"], int(r["eval/held/step"]))
        for r in read_metrics(out / "metrics.jsonl")
        if "eval/held/step" in r
    ]


def test_evaluations_land_once_survive_a_resume_and_are_drawn(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(out, 3)
    checkpoint = out / "checkpoints" / "step_00000002"
    # launched after step 2 and not awaited there (async): running when step 2's checkpoint was written
    assert json.loads((checkpoint / "extra.json").read_text())["pending_evals"] == [2]
    assert eval_lines(out) == [(3, 2)]  # the last step waits for it
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_before"]["eval/held/step"] == 0 and summary["eval_after"]["eval/held/step"] == 3
    assert summary["eval_after"]["eval/held/num_prompts"] == 6

    train(out, 4, resume=str(checkpoint))  # as if the run had died after step 2's checkpoint
    lines = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert eval_lines(out) == [(3, 2)]  # the lost evaluation's line, from the resumed weights (version 2)
    resumed = next(r for r in lines if "eval/held/step" in r)
    assert resumed["eval/held/policy_version_min"] == resumed["eval/held/policy_version_max"] == 2

    page = write_report([out], tmp_path / "report")
    assert (tmp_path / "report" / "eval.png").is_file() and "eval.png" in page.read_text()
    assert [step for step, _ in load_run(out).evals["held/mean@2"]] == [2, 4]  # resumed before, after
