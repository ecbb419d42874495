"""Benchmark: a shipped example run as a user gets it (``asyncrl train``, no arguments, by default), one run per
seed, beside a real sync run of the same example.

Each repeat is the whole example run (``--example default``: ``asyncrl/examples/default.yaml``, async α = 2,
150 steps, held-out reward on 512 prompts before and after; ``--example agentic``:
``asyncrl/examples/agentic.yaml``, the multi-turn ``copy_chain`` example) at the default placement (async:
engine and trainer threads on disjoint halves of the cores), with the repeat's index as ``seed``, so the spread
is across seeds as well as time. The ``sync`` arm is the same run with ``controller.mode=sync`` (α = 0) on the
same seed, interleaved with it, at sync's default placement (every core for each phase): the measured answer
to "how long would sync take", and the parity check (both must learn). ``sync_1thread`` is that sync with one
torch thread per role, which at this model size is often the faster sync; the ``faster_sync`` ratios take
whichever sync was faster in each repeat, so no speedup rests on a slowed baseline. Metrics: held-out reward
before and after, the gain, the run's wall time and its training loop's, trained samples per second, and the
busy time of generation and of the trainer (training + weight sync), from which ``trainer_bound`` says per
repeat the most any scheduling could gain over the faster sync on this workload. Targets
(README, issue 14): a gain of at least +0.15 within 10 minutes, and the async run reaching sync's held-out
reward in at most half the faster sync's wall-clock (``faster_sync_over_<example>_train_wall_s`` ≥ 2 with the
async gain within the sync gains' spread).

    python bench/default_run.py [--example default|agentic] [--quick] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/default_run.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import itertools
import tempfile
from collections.abc import Callable

from asyncrl.app.train import train
from asyncrl.cli.train import DEFAULT_EXAMPLE
from asyncrl.config.run import load_run_config
from bench import harness

EXAMPLES = {"default": DEFAULT_EXAMPLE, "agentic": DEFAULT_EXAMPLE.parent / "agentic.yaml"}
QUICK_OVERRIDES = {
    "default": ["controller.num_steps=2", "controller.eval_prompts=16", "task.num_eval=16"],
    "agentic": ["controller.num_steps=2", "controller.eval_prompts=16"],
}
SYNC_OVERRIDES = ["controller.mode=sync", "buffer.async_ratio=0"]
ONE_THREAD = ["runtime.rollout_num_cpus=0.5", "runtime.train_num_cpus=0.5"]
"""Sync colocated on one core's worth: one torch thread per role. At this model size two threads per role are
not faster (often slower), so the comparison is made against the faster sync too, never a slowed one."""


def example_run_arm(config_path: Path, overrides: list[str]) -> Callable[[], dict[str, float]]:
    """A harness arm: one whole run of the example, on the next seed (0, 1, 2, … per arm)."""
    seeds = itertools.count()

    def run() -> dict[str, float]:
        with tempfile.TemporaryDirectory() as out:
            config = load_run_config(config_path, [f"seed={next(seeds)}", f"output_dir={out}", *overrides])
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
            "generation_busy_s": summary.phase_busy_s["generation"],
            "trainer_busy_s": summary.phase_busy_s["train"] + summary.phase_busy_s["weight_sync"],
        }

    return run


def faster_sync(raw: dict[str, list[dict[str, float]]], metric: str) -> list[float]:
    """Per repeat, the smaller ``metric`` of the two sync runs (``sync`` and ``sync_1thread``)."""
    return [min(a[metric], b[metric]) for a, b in zip(raw["sync"], raw["sync_1thread"], strict=True)]


def ratio_record(numerator: str, denominator: str, metric: str, values: list[float]) -> dict[str, object]:
    """A derived ratio in the harness's ratio shape (what ``harness.paired_ratio`` writes)."""
    return {"numerator": numerator, "denominator": denominator, "metric": metric, **harness.summary(values)}


def faster_sync_ratio(raw: dict[str, list[dict[str, float]]], example: str, metric: str) -> dict[str, object]:
    """Per paired repeat, the faster of the two sync runs' ``metric`` over the example's."""
    values = [sync / run[metric] for sync, run in zip(faster_sync(raw, metric), raw[example], strict=True)]
    return ratio_record("min(sync, sync_1thread)", example, metric, values)


def trainer_bound(raw: dict[str, list[dict[str, float]]], example: str) -> dict[str, dict[str, object]]:
    """The most any scheduling could gain over the faster sync, per paired repeat, from the syncs alone: the
    trainer trains and syncs weights one step after another whatever the mode, so even a trainer as fast as
    sync's, on every core, with all generation hidden, leaves the loop at least the least trainer time either
    sync measured. A target above it is out of reach on the workload, whatever the scheduling. (It is made of
    the sync runs only; a bound from the async run's own trainer time would be met by that run by
    construction, and was removed.)"""
    walls = faster_sync(raw, "train_wall_s")
    at_all = [wall / busy for wall, busy in zip(walls, faster_sync(raw, "trainer_busy_s"), strict=True)]
    return {
        f"trainer_bound_{example}_at_all_cores": ratio_record(
            "min(sync, sync_1thread) train_wall_s",
            "min(sync, sync_1thread) trainer_busy_s",
            "train_wall_s over trainer_busy_s",
            at_all,
        ),
    }


def placement_of(config_path: Path, overrides: list[str], how: str) -> dict[str, object]:
    """How the arm's run splits the cores: its runtime's placement plan (threads per role)."""
    return {"how": how, **harness.placement(load_run_config(config_path, overrides))}


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "default_run")
    parser.add_argument("--example", choices=list(EXAMPLES), default="default")
    args = parser.parse_args()
    if args.example != "default" and args.out == "bench/results/default_run.json":
        args.out = f"bench/results/{args.example}_run.json"  # each example its own result file
    config_path = EXAMPLES[args.example]
    quick = QUICK_OVERRIDES[args.example] if args.quick else []
    arms = {
        args.example: example_run_arm(config_path, quick),
        "sync": example_run_arm(config_path, [*quick, *SYNC_OVERRIDES]),
        "sync_1thread": example_run_arm(config_path, [*quick, *SYNC_OVERRIDES, *ONE_THREAD]),
    }
    raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
    ratios = {}
    for metric in ("train_wall_s", "wall_s"):
        for sync in ("sync", "sync_1thread"):
            ratios[f"{sync}_over_{args.example}_{metric}"] = harness.paired_ratio(
                raw, sync, args.example, metric
            )
        ratios[f"faster_sync_over_{args.example}_{metric}"] = faster_sync_ratio(raw, args.example, metric)
    ratios |= trainer_bound(raw, args.example)
    resources = {
        args.example: placement_of(config_path, quick, "asyncrl train as a user runs it, in one process"),
        "sync": placement_of(
            config_path, [*quick, *SYNC_OVERRIDES], "the same, controller.mode=sync (alpha 0)"
        ),
        "sync_1thread": placement_of(
            config_path, [*quick, *SYNC_OVERRIDES, *ONE_THREAD], "sync with one torch thread per role"
        ),
    }
    setup = {
        "config": str(config_path.relative_to(Path(__file__).resolve().parents[1])),
        "seeds": "repeat i of each arm runs seed=i",
        "targets": "gain >= 0.15 within 600 s; faster_sync_over_*_train_wall_s >= 2 at reward parity",
    }
    name = f"{args.example}_run" if args.example != "default" else "default_run"
    harness.write_result(args, name, raw, ratios=ratios, resources=resources, setup=setup)


if __name__ == "__main__":
    main()
