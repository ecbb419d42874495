"""Benchmark: does multi-turn RL improve the tiny model on real environments? Sokoban and FrozenLake, per seed.

One arm per env. Each repeat is one seed end to end: the warm start on scripted shortest-path episodes
(``asyncrl.envs.warm_start``, seeded), then the RL run of the env's example config (seeded) from it:
``asyncrl/examples/agentic_sokoban.yaml``, ``asyncrl/examples/agentic_frozen_lake.yaml``. Repeat i runs seed i,
so the spread is across seeds (as in ``bench/default_run.py``). Metrics: the held-out env return before and
after RL (the run's own evaluation: the same held-out maps and sampling seeds before and after), the gain, and
the warm-start and RL wall times.

    python bench/agentic_learning.py [--quick] [--repeats 3] [--envs sokoban,frozen_lake] [--warm-steps 150]
                                     [--out bench/results/agentic_learning.json] [key=value ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/agentic_learning.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import itertools
import os
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

from asyncrl.app.train import train  # noqa: E402
from asyncrl.config.env_kinds import SokobanConfig  # noqa: E402
from asyncrl.config.run import load_run_config  # noqa: E402
from asyncrl.config.sft import SFTConfig  # noqa: E402
from asyncrl.envs.warm_start import Episode, frozen_lake_episode, scripted_episode, warm_start  # noqa: E402
from bench import harness  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "asyncrl" / "examples"
ENVS: dict[str, tuple[Path, Callable[[int], Episode]]] = {
    "sokoban": (
        EXAMPLES / "agentic_sokoban.yaml",
        lambda seed: scripted_episode(SokobanConfig(num_pulls=2), seed),
    ),
    "frozen_lake": (EXAMPLES / "agentic_frozen_lake.yaml", lambda seed: frozen_lake_episode(4, seed)),
}
"""Per env: its RL example config and its scripted episodes (the settings the example's comments give)."""
NUM_ROOMS = 64
QUICK_NUM_ROOMS = 4
QUICK_WARM_STEPS = 2
QUICK_OVERRIDES = [
    "controller.num_steps=2",
    "controller.eval_prompts=8",
    "rollout.rollout_batch_size=1",
    "rollout.num_return_sequences=2",
    "env_manager.num_env_groups=1",
    "env_manager.group_size=2",
]


def warm_sft(seed: int, steps: int) -> SFTConfig:
    """The warm start's SFT settings (those of ``python -m asyncrl.envs.warm_start``), seeded."""
    return SFTConfig(
        max_steps=steps, lr=2e-3, batch_size=16, warmup_steps=10, seed=seed, log_every=25, label_smoothing=0.1
    )


def timed_warm_start(
    model_dir: Path, episode: Callable[[int], Episode], num_rooms: int, seed: int, steps: int
) -> float:
    """Warm-start ``tiny-copy`` into ``model_dir`` on ``num_rooms`` scripted episodes (seeded); its wall seconds."""
    started = time.perf_counter()
    warm_start(
        model_path="tiny-copy",
        out_dir=str(model_dir),
        episode=episode,
        num_rooms=num_rooms,
        sft=warm_sft(seed, steps),
    )
    return time.perf_counter() - started


def learning_arm(
    env: str, warm_steps: int, num_rooms: int, overrides: list[str]
) -> Callable[[], dict[str, float]]:
    """One seed per call (0, 1, …): warm start, then RL from it; the held-out return before and after RL."""
    config_path, episode = ENVS[env]
    seeds = itertools.count()

    def run() -> dict[str, float]:
        seed = next(seeds)
        with tempfile.TemporaryDirectory(prefix="agentic-learning-") as scratch:
            model_dir, out_dir = Path(scratch) / "model", Path(scratch) / "run"
            warm_s = timed_warm_start(model_dir, episode, num_rooms, seed, warm_steps)
            config = load_run_config(
                str(config_path),
                [f"model.path={model_dir}", f"output_dir={out_dir}", f"seed={seed}", *overrides],
            )
            summary = asyncio.run(train(config, console=None))
        before = summary.eval_before["eval/reward_mean"]
        after = summary.eval_after["eval/reward_mean"]
        return {
            "return_before": before,
            "return_after": after,
            "return_gain": after - before,
            "warm_start_s": warm_s,
            "rl_wall_s": summary.wall_s,
        }

    return run


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "agentic_learning")
    parser.add_argument("--envs", default=",".join(ENVS), help=f"comma-separated, of {', '.join(ENVS)}")
    parser.add_argument("--warm-steps", type=int, default=150, help="warm-start SFT steps (full runs)")
    parser.add_argument("overrides", nargs="*", help="config overrides for the RL runs (key=value)")
    args = parser.parse_args()
    envs = args.envs.split(",")
    if unknown := set(envs) - set(ENVS):
        raise SystemExit(f"--envs: unknown {sorted(unknown)}; known: {', '.join(ENVS)}")
    warm_steps = QUICK_WARM_STEPS if args.quick else args.warm_steps
    num_rooms = QUICK_NUM_ROOMS if args.quick else NUM_ROOMS
    overrides = [*args.overrides, *(QUICK_OVERRIDES if args.quick else [])]
    arms = {env: learning_arm(env, warm_steps, num_rooms, overrides) for env in envs}
    raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
    how = f"warm start then asyncrl train, in one process, one after the other; {torch.get_num_threads()} torch threads"
    setup = {
        "configs": {env: f"asyncrl/examples/{ENVS[env][0].name}" for env in envs},
        "seeds": "repeat i runs seed=i (warm start and RL)",
        "warm_start": {"steps": warm_steps, "num_rooms": num_rooms, "model": "tiny-copy"},
        "rl_overrides": overrides,
    }
    harness.write_result(args, "agentic_learning", raw, resources=dict.fromkeys(envs, how), setup=setup)


if __name__ == "__main__":
    main()
