"""Does multi-turn RL improve the tiny model on a real environment? Sokoban, across seeds, before vs after.

For each seed: the warm start on scripted optimal episodes (``asyncrl.envs.warm_start``, seeded), then the RL run
of ``asyncrl/examples/agentic_sokoban.yaml`` (seeded) from it; the held-out env return before and after RL comes from
the run's ``summary.json`` (the same held-out rooms and sampling seeds before and after). The result JSON keeps
every seed, the per-seed gain, and median/min/max of the gains.

    python bench/agentic_learning.py [--seeds 0 1 2] [--quick] [--out bench/results/agentic_learning.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "asyncrl" / "examples" / "agentic_sokoban.yaml"
QUICK_OVERRIDES = (
    "controller.num_steps=2",
    "controller.eval_prompts=8",
    "rollout.rollout_batch_size=1",
    "rollout.num_return_sequences=2",
    "env_manager.num_env_groups=1",
    "env_manager.group_size=2",
)


def run(command: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    subprocess.run(command, cwd=ROOT, env=env, check=True)


def one_seed(seed: int, work: Path, *, quick: bool, warm_steps: int, overrides: list[str]) -> dict[str, Any]:
    """Warm start then RL for one seed; the run's held-out before/after."""
    model_dir, out_dir = work / f"model-{seed}", work / f"run-{seed}"
    warm = [sys.executable, "-m", "asyncrl.envs.warm_start", "--out", str(model_dir), "--seed", str(seed)]
    run([*warm, "--steps", str(2 if quick else warm_steps), "--num-rooms", str(4 if quick else 64)])
    train = [sys.executable, "-m", "asyncrl.cli.main", "train", str(CONFIG)]
    extra = [f"model.path={model_dir}", f"output_dir={out_dir}", f"seed={seed}", *overrides]
    started = time.perf_counter()
    run([*train, *extra, *(QUICK_OVERRIDES if quick else ())])
    summary = json.loads((out_dir / "summary.json").read_text())
    before = summary["eval_before"]["eval/reward_mean"]
    after = summary["eval_after"]["eval/reward_mean"]
    return {
        "seed": seed,
        "before": before,
        "after": after,
        "gain": after - before,
        "rl_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 2 warm-start and 2 RL steps, one seed"
    )
    parser.add_argument("--warm-steps", type=int, default=150)
    parser.add_argument("--out", default="bench/results/agentic_learning.json")
    parser.add_argument("overrides", nargs="*", help="config overrides for the RL runs (key=value)")
    args = parser.parse_args()
    seeds = args.seeds[:1] if args.quick else args.seeds
    with tempfile.TemporaryDirectory(prefix="agentic-learning-") as tmp:
        rows = [
            one_seed(s, Path(tmp), quick=args.quick, warm_steps=args.warm_steps, overrides=args.overrides)
            for s in seeds
        ]
    gains = [row["gain"] for row in rows]
    report = {
        "command": " ".join([sys.executable, *sys.argv]),
        "commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_at_end": os.getloadavg(),
        },
        "config": str(CONFIG.relative_to(ROOT)),
        "warm_start": {"steps": 2 if args.quick else args.warm_steps, "num_rooms": 4 if args.quick else 64},
        "rl_overrides": [*args.overrides, *(QUICK_OVERRIDES if args.quick else ())],
        "seeds": rows,
        "gain": {"median": statistics.median(gains), "min": min(gains), "max": max(gains)},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report["gain"]))


if __name__ == "__main__":
    main()
