"""Benchmark: does PPO with a critic (GAE) learn, on the default task and on Sokoban, beside GRPO on the same runs?

Each repeat is one seed end to end (repeat i runs ``seed=i``), every arm interleaved by the harness:

- ``default_grpo``: the embedded default run as a user gets it (``asyncrl/examples/default.yaml``: async α = 2,
  150 steps, GRPO advantages), the reference;
- ``default_gae_separate`` / ``default_gae_shared``: the same run with ``advantage.name=gae`` and a separate
  critic / a value head on the policy's trunk (``critic.*`` at its defaults: lr = trainer.lr, value clip 0.2);
- ``sokoban_grpo``: the Sokoban example (``asyncrl/examples/agentic_sokoban.yaml``) from the seed's warm start
  (``asyncrl.envs.warm_start``, the settings ``bench/agentic_learning.py`` uses);
- ``sokoban_gae_separate``: the same with GAE and a separate critic;
- ``sokoban_gae_shaped``: the same with ``env.sokoban.distance_shaping=0.25``, a per-turn reward GAE credits to
  the turn that earned it (the held-out return then includes the shaping, potential-based: for a solved room
  it adds 0.25 × the room's starting box distance).

The warm start of a seed is made once and shared by that seed's Sokoban arms (the same seed gives the same
weights). Metrics: held-out reward (default) or return (Sokoban) before and after RL, the gain, RL wall time,
and, for the GAE arms, the critic's explained variance on the last step. Learning is shown when the gain is
positive across seeds; the GRPO arms say how it compares on the same seeds.

    python bench/critic_learning.py [--quick] [--repeats 3] [--arms default_gae_separate,...]
                                    [--out bench/results/critic_learning.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/critic_learning.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import itertools
import json
import os
import tempfile
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

from asyncrl.app.train import train  # noqa: E402
from asyncrl.cli.train import DEFAULT_EXAMPLE  # noqa: E402
from asyncrl.config.run import load_run_config  # noqa: E402
from bench import harness  # noqa: E402
from bench.agentic_learning import ENVS, NUM_ROOMS, QUICK_NUM_ROOMS, QUICK_WARM_STEPS, timed_warm_start  # noqa: E402

SOKOBAN_EXAMPLE, SOKOBAN_EPISODE = ENVS["sokoban"]
GAE = ["advantage.name=gae", "critic.type=separate"]
ARMS: dict[str, tuple[str, list[str]]] = {
    "default_grpo": ("default", []),
    "default_gae_separate": ("default", GAE),
    "default_gae_shared": ("default", ["advantage.name=gae", "critic.type=shared_trunk"]),
    "sokoban_grpo": ("sokoban", []),
    "sokoban_gae_separate": ("sokoban", GAE),
    "sokoban_gae_shaped": ("sokoban", [*GAE, "env.sokoban.distance_shaping=0.25"]),
}
"""Arm -> (task, overrides of its example)."""
QUICK_ARMS = ("default_gae_shared", "sokoban_gae_shaped")
QUICK_OVERRIDES = {
    "default": ["controller.num_steps=2", "controller.eval_prompts=16", "task.num_eval=16"],
    "sokoban": [
        "controller.num_steps=2",
        "controller.eval_prompts=8",
        "rollout.rollout_batch_size=1",
        "rollout.num_return_sequences=2",
        "env_manager.num_env_groups=1",
        "env_manager.group_size=2",
    ],
}


class WarmStarts:
    """One warm-started Sokoban model per seed, made on first use and kept for the run's other arms."""

    def __init__(self, root: Path, warm_steps: int, num_rooms: int) -> None:
        self.root, self.warm_steps, self.num_rooms = root, warm_steps, num_rooms
        self.seconds: dict[int, float] = {}

    def model_dir(self, seed: int) -> Path:
        path = self.root / f"sokoban-seed{seed}"
        if seed not in self.seconds:
            self.seconds[seed] = timed_warm_start(
                path, SOKOBAN_EPISODE, self.num_rooms, seed, self.warm_steps
            )
        return path


def learning_arm(
    task: str, overrides: list[str], warm_starts: WarmStarts, scratch: Path
) -> Callable[[], dict[str, float]]:
    """One seed per call (0, 1, …): the task's example run with ``overrides``; held-out reward before/after."""
    seeds = itertools.count()

    def run() -> dict[str, float]:
        seed = next(seeds)
        config_path, model = DEFAULT_EXAMPLE, []
        if task == "sokoban":
            config_path, model = SOKOBAN_EXAMPLE, [f"model.path={warm_starts.model_dir(seed)}"]
        with tempfile.TemporaryDirectory(dir=scratch) as out:
            config = load_run_config(config_path, [*model, f"output_dir={out}", f"seed={seed}", *overrides])
            summary = asyncio.run(train(config, console=None))
            last = json.loads(Path(summary.metrics_path).read_text().splitlines()[-1])
        before, after = summary.eval_before["eval/reward_mean"], summary.eval_after["eval/reward_mean"]
        metrics = {"reward_before": before, "reward_after": after, "reward_gain": after - before}
        metrics |= {"rl_wall_s": summary.wall_s}
        if "train/critic/explained_variance" in last:
            metrics["critic_explained_variance_last"] = last["train/critic/explained_variance"]
        return metrics

    return run


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "critic_learning")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument(
        "--warm-steps", type=int, default=150, help="Sokoban warm-start SFT steps (full runs)"
    )
    args = parser.parse_args()
    names = list(QUICK_ARMS) if args.quick else args.arms.split(",")
    if unknown := set(names) - set(ARMS):
        raise SystemExit(f"--arms: unknown {sorted(unknown)}; known: {', '.join(ARMS)}")
    warm_steps = QUICK_WARM_STEPS if args.quick else args.warm_steps
    num_rooms = QUICK_NUM_ROOMS if args.quick else NUM_ROOMS
    with tempfile.TemporaryDirectory(prefix="critic-learning-") as scratch:
        warm_starts = WarmStarts(Path(scratch), warm_steps, num_rooms)
        arms = {}
        for name in names:
            task, overrides = ARMS[name]
            quick = QUICK_OVERRIDES[task] if args.quick else []
            arms[name] = learning_arm(task, [*overrides, *quick], warm_starts, Path(scratch))
        raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
        warm_seconds = dict(warm_starts.seconds)
    how = f"one run at a time in one process, at the example's placement; {torch.get_num_threads()} torch threads"
    setup = {
        "configs": {
            "default": "asyncrl/examples/default.yaml",
            "sokoban": "asyncrl/examples/agentic_sokoban.yaml",
        },
        "arms": {name: {"task": ARMS[name][0], "overrides": ARMS[name][1]} for name in names},
        "seeds": "repeat i runs seed=i (warm start and RL)",
        "sokoban_warm_start": {
            "steps": warm_steps,
            "num_rooms": num_rooms,
            "model": "tiny-copy",
            "seconds": warm_seconds,
        },
        "quick_overrides": QUICK_OVERRIDES if args.quick else {},
    }
    harness.write_result(args, "critic_learning", raw, resources=dict.fromkeys(names, how), setup=setup)


if __name__ == "__main__":
    main()
