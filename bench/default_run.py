"""Benchmark: the embedded default run (``asyncrl train``, no arguments) as a user gets it, one run per seed.

Each repeat is the whole default run (``asyncrl/examples/default.yaml``: async α = 2, 150 steps, held-out
reward on 512 prompts before and after) at the default threads, with the repeat's index as ``seed``, so the
spread is across seeds as well as time. Metrics: held-out reward before and after, the gain, the run's wall
time and its training loop's, and trained samples per second. Target (README): a gain of at least +0.15
within 10 minutes.

    python bench/default_run.py [--quick] [--repeats 3] [--out bench/results/default_run.json]
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Callable

import torch

from asyncrl.app.train import train
from asyncrl.cli.train import DEFAULT_EXAMPLE
from asyncrl.config.run import load_run_config
from bench import harness

QUICK_OVERRIDES = ["controller.num_steps=2", "controller.eval_prompts=16", "task.num_eval=16"]


def default_run_arm(overrides: list[str]) -> Callable[[], dict[str, float]]:
    seeds = itertools.count()

    def run() -> dict[str, float]:
        with tempfile.TemporaryDirectory() as out:
            config = load_run_config(
                DEFAULT_EXAMPLE, [f"seed={next(seeds)}", f"output_dir={out}", *overrides]
            )
            summary = asyncio.run(train(config, console=None))
        before = summary.eval_before["eval/reward_mean"]
        after = summary.eval_after["eval/reward_mean"]
        return {
            "reward_before": before,
            "reward_after": after,
            "reward_gain": after - before,
            "wall_s": summary.wall_s,
            "train_wall_s": summary.train_wall_s,
            "samples_per_s": summary.trained_samples / max(summary.train_wall_s, 1e-9),
        }

    return run


def main() -> None:
    args = harness.parser(__doc__.splitlines()[0], "default_run").parse_args()
    overrides = QUICK_OVERRIDES if args.quick else []
    raw = harness.run_arms(
        {"default": default_run_arm(overrides)}, harness.repeats_for(args), harness.print_run
    )
    resources = {
        "default": f"asyncrl train as a user runs it: one process, {torch.get_num_threads()} torch threads"
    }
    setup = {
        "config": "asyncrl/examples/default.yaml",
        "seeds": "repeat i runs seed=i",
        "target": "gain >= 0.15 within 600 s",
    }
    harness.write_result(args, "default_run", raw, resources=resources, setup=setup)


if __name__ == "__main__":
    main()
