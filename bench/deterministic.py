"""Benchmark: what ``deterministic: true`` costs a train step.

The switch replaces the engine's behaviour log-probs of current-version tokens with the trainer's own
step-start recompute: one more no-grad forward per step when the loss does not run one anyway. Two arms, one
``train_step`` each, interleaved, on one step of the default example's shape (the shipped warm start
``tiny-copy``, 16 prompts x 8 samples of the copy task's lengths) under its loss (PPO-clip): ``off`` as
shipped, ``on`` with the recompute. Metric: seconds per step (and trained tokens/s); the ratio on / off is
the step's slowdown. A whole run slows by less: the step is only the training phase of it (docs/modes.md).

    python bench/deterministic.py [--quick] [--repeats 3] [--out bench/results/deterministic.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/deterministic.py` puts bench/ first on sys.path: make the checkout the import root
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import time
from collections.abc import Callable

import torch

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.models.loading import load_model_and_tokenizer
from asyncrl.trainer.batching import build_train_batch, sequence_lengths
from asyncrl.trainer.trainer import Trainer
from bench import harness
from bench.trainer import make_groups
from bench.workloads import LengthDistribution, ModelShape, Workload

DEFAULT_STEP = Workload(
    name="default_example_step",
    bound="training",
    model=ModelShape(hidden=128, layers=4, heads=4, kv_heads=4, intermediate=512, vocab=384),
    prompt_tokens=30,
    lengths=LengthDistribution(median=10, sigma=0.6, min_tokens=2, max_tokens=128),
    prompts_per_step=16,
    samples_per_prompt=8,
    max_running_requests=64,
)
"""One step of the default example: its batch (16 x 8), its model (``tiny-copy``), copy-task prompts of about
30 tokens and answers of about 10 (log-normal, up to its max_new_tokens of 128)."""
QUICK_STEP = Workload(
    name="default_example_step_quick",
    bound="training",
    model=DEFAULT_STEP.model,
    prompt_tokens=16,
    lengths=LengthDistribution(median=6, sigma=0.5, min_tokens=2, max_tokens=32),
    prompts_per_step=2,
    samples_per_prompt=4,
    max_running_requests=8,
)


def step_arm(work: Workload, deterministic: bool) -> Callable[[], dict[str, float]]:
    groups = make_groups(work)
    real_tokens = sum(sequence_lengths(build_train_batch(groups, [0.0] * work.samples_per_step)))
    model, _ = load_model_and_tokenizer("", device="cpu")
    trainer = Trainer(
        model,
        TrainerConfig(lr=1e-4),
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
        recompute_behaviour=deterministic,
    )

    def run() -> dict[str, float]:
        start = time.perf_counter()
        trainer.train_step(groups, trainer.version)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "trained_tokens_per_s": real_tokens / seconds}

    return run


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "deterministic")
    args = parser.parse_args()
    if args.quick:  # a smoke run: one thread, so a busy machine's OpenMP barriers cannot stretch it
        torch.set_num_threads(1)
    work = QUICK_STEP if args.quick else DEFAULT_STEP
    arms = {"off": step_arm(work, False), "on": step_arm(work, True)}
    raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run, warmup=True)
    ratios = {"on_over_off_seconds": harness.paired_ratio(raw, "on", "off", "seconds")}
    setup = {"workload": work.name, "model": "tiny-copy", "samples": work.samples_per_step, "loss": "ppo"}
    resources = {"all_arms": f"this process, {torch.get_num_threads()} torch threads, arms one at a time"}
    harness.write_result(args, "deterministic", raw, ratios=ratios, resources=resources, setup=setup)


if __name__ == "__main__":
    main()
