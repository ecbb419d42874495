"""Benchmark: does the policy improve when an external harness, written only against the ``openai`` client, drives
training through the run's endpoint? FrozenLake 4×4, per seed.

Each repeat is one seed end to end (repeat i runs seed i): the FrozenLake warm start of
``bench/agentic_learning.py`` (seeded); then the external example run (``asyncrl/examples/agents/frozen_lake.yaml``,
``producer: external``, seeded) driven by the example harness ``asyncrl/examples/agents/frozen_lake_harness.py``,
run unchanged as its own process, as a user runs it. An external run does no evaluation of its own (the harness
owns the task), so the held-out return is the project's FrozenLake evaluation (``asyncrl eval`` of
``asyncrl/examples/agentic_frozen_lake.yaml``: held-out maps no harness group plays, fixed sampling seeds, the
harness's turn and token limits) of the warm start before and of the run's final checkpoint after; its contexts
are those the endpoint's ``plain`` format builds for the harness. Metrics: the return before and after, the gain,
the episodes the harness played, and the wall times.

    python bench/agents_external.py [--quick] [--repeats 3] [--warm-steps 150]
                                    [--out bench/results/agents_external.json] [key=value ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/agents_external.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import itertools
import os
import subprocess
import tempfile
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

from asyncrl.app.evaluate import evaluate_model  # noqa: E402
from asyncrl.app.train import train  # noqa: E402
from asyncrl.config.run import RunConfig, load_run_config  # noqa: E402
from bench import harness  # noqa: E402
from bench.agentic_learning import (  # noqa: E402
    ENVS,
    NUM_ROOMS,
    QUICK_NUM_ROOMS,
    QUICK_WARM_STEPS,
    timed_warm_start,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "asyncrl" / "examples" / "agents" / "frozen_lake.yaml"
HARNESS = ROOT / "asyncrl" / "examples" / "agents" / "frozen_lake_harness.py"
EVALUATION = ROOT / "asyncrl" / "examples" / "agentic_frozen_lake.yaml"
HARNESS_EXIT_S = 120.0
"""How long the harness may take to notice that the run stopped serving (its client retries) before it is
killed; a harness still alive then is a bug in it, reported by the benchmark failing."""
QUICK_OVERRIDES = [
    "controller.num_steps=2",
    "rollout.rollout_batch_size=1",
    "rollout.num_return_sequences=2",
]
QUICK_EVAL_EPISODES = 8


def play(config: RunConfig, log: Path) -> subprocess.Popen[bytes]:
    """Start the example harness on ``config``'s run, as a user would in a second shell."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable,
        str(HARNESS),
        config.output_dir,
        f"--group-size={config.rollout.num_return_sequences}",
        f"--concurrent-groups={2 * config.rollout.rollout_batch_size}",
    ]
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def episodes_played(log: Path) -> int:
    """The harness's own count, from the last progress line it printed (``episodes N  mean return ...``)."""
    counts = [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("episodes ")]
    return counts[-1] if counts else 0


def held_out(model_dir: Path, seed: int, num_episodes: int, checkpoint: str | None) -> float:
    """Mean held-out FrozenLake return of ``model_dir`` (with ``checkpoint``'s weights when given)."""
    overrides = [f"model.path={model_dir}", f"seed={seed}", f"controller.eval_prompts={num_episodes}"]
    config = load_run_config(str(EVALUATION), overrides)
    return asyncio.run(evaluate_model(config, checkpoint))["eval/reward_mean"]


def external_arm(
    warm_steps: int, num_rooms: int, num_eval: int, overrides: list[str]
) -> Callable[[], dict[str, float]]:
    """One seed per call (0, 1, …): warm start, held-out return, the harness-driven run, held-out return."""
    seeds = itertools.count()

    def run() -> dict[str, float]:
        seed = next(seeds)
        with tempfile.TemporaryDirectory(prefix="agents-external-") as scratch:
            model_dir, out_dir = Path(scratch) / "model", Path(scratch) / "run"
            warm_s = timed_warm_start(model_dir, ENVS["frozen_lake"][1], num_rooms, seed, warm_steps)
            before = held_out(model_dir, seed, num_eval, None)
            config = load_run_config(
                str(EXAMPLE), [f"model.path={model_dir}", f"output_dir={out_dir}", f"seed={seed}", *overrides]
            )
            log = Path(scratch) / "harness.log"
            player = play(config, log)
            try:
                summary = asyncio.run(train(config, console=None))
                player.wait(HARNESS_EXIT_S)
            finally:
                if player.poll() is None:
                    player.kill()
                    player.wait()
            after = held_out(model_dir, seed, num_eval, summary.checkpoint)
            played = episodes_played(log)
        return {
            "return_before": before,
            "return_after": after,
            "return_gain": after - before,
            "episodes_played": played,
            "trained_samples": summary.trained_samples,
            "warm_start_s": warm_s,
            "rl_wall_s": summary.wall_s,
        }

    return run


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "agents_external")
    parser.add_argument("--warm-steps", type=int, default=150, help="warm-start SFT steps (full runs)")
    parser.add_argument("--eval-episodes", type=int, default=128, help="held-out maps (full runs)")
    parser.add_argument("overrides", nargs="*", help="config overrides for the external runs (key=value)")
    args = parser.parse_args()
    warm_steps = QUICK_WARM_STEPS if args.quick else args.warm_steps
    num_rooms = QUICK_NUM_ROOMS if args.quick else NUM_ROOMS
    num_eval = QUICK_EVAL_EPISODES if args.quick else args.eval_episodes
    overrides = [*args.overrides, *(QUICK_OVERRIDES if args.quick else [])]
    arms = {"external_frozen_lake": external_arm(warm_steps, num_rooms, num_eval, overrides)}
    raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
    how = (
        f"warm start, then asyncrl train with the harness as a second process; "
        f"{torch.get_num_threads()} torch threads"
    )
    setup = {
        "config": "asyncrl/examples/agents/frozen_lake.yaml",
        "harness": "asyncrl/examples/agents/frozen_lake_harness.py (a subprocess)",
        "evaluation": f"asyncrl eval of asyncrl/examples/agentic_frozen_lake.yaml, {num_eval} held-out maps",
        "seeds": "repeat i runs seed=i (warm start, run, evaluation)",
        "warm_start": {"steps": warm_steps, "num_rooms": num_rooms, "model": "tiny-copy"},
        "overrides": overrides,
    }
    harness.write_result(args, "agents_external", raw, resources={"external_frozen_lake": how}, setup=setup)


if __name__ == "__main__":
    main()
