"""Benchmark: does asynchronous training learn as well as synchronous training, per off-policy loss?

Every run trains the embedded default (the shipped warm start on the default task, ``asyncrl/examples/
default.yaml``) for the same number of steps of the same batch, so every run trains on the same number of
samples; only the loss, the mode and the seed change. The default's group filter is turned off here
(``WORKLOAD``): this study isolates what staleness does to each loss, and which groups a filter keeps would
vary with the mode too.

- settings: ``sync`` (α = 0, colocated, the baseline), ``async`` with α = 2 and with α = 8;
- recipes: the losses ``ppo``, ``decoupled_ppo``, ``tis``, ``cispo``, ``topr`` with their default parameters,
  and the off-policy presets (``loss.preset``: ``icepop``, ``seq_mis``, ``geo_rs``, ``k3_rs``, ``opsm``,
  ``m2po``; ``decoupled_ppo`` is the loss above), each over the default ``ppo`` loss unless it names its own;
  the presets run in ``sync`` and at α = 8 only (the α = 8 rule is their question);
- seeds: 0, 1, 2 (seed of data order, sampling and evaluation).

Each run reports held-out mean reward before and after (the run's own evaluation, temperature 1, the
default's eval prompts), the trained samples' staleness, and wall-clock. The question is the one asynchrony
has to answer: with samples up to α versions old, does each loss still reach the reward sync reaches? A
setting "holds" when, seed by seed, its held-out reward minus the paired sync run's is within the sync
seed-to-seed spread (or above) in a majority of pairs (the earlier rule, mean ≥ the lowest sync seed, passed
α = 8 although it ended below its paired sync run in 13 of 15 pairs).

Runs are written to the JSON as they finish; ``--resume`` skips the ones already there, so a long run can be
stopped and continued.

    python bench/offpolicy.py [--quick] [--steps 60] [--losses ppo tis geo_rs] [--settings sync async_a2]
                              [--seeds 0 1 2] [--resume] [--out bench/results/offpolicy.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/offpolicy.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import asyncio
import json
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from asyncrl.app.train import train  # noqa: E402
from asyncrl.config.algorithm import PRESETS  # noqa: E402
from asyncrl.config.run import load_run_config  # noqa: E402
from asyncrl.metrics.progress import library_bars_follow_terminal  # noqa: E402
from asyncrl.metrics.tracker import read_metrics  # noqa: E402
from bench import harness  # noqa: E402

DEFAULT_EXAMPLE = Path(__file__).resolve().parents[1] / "asyncrl" / "examples" / "default.yaml"
WORKLOAD = ("rollout.filter=none", "rollout.max_additional_running_prompts=0")
"""Every group trained, as when the study's results were measured (before the default filtered groups)."""
LOSSES = ("ppo", "decoupled_ppo", "tis", "cispo", "topr")
RECIPES: dict[str, tuple[str, ...]] = {
    **{loss: (f"loss.name={loss}",) for loss in LOSSES},
    **{name: (f"loss.preset={name}",) for name in PRESETS if name not in LOSSES},
}
"""Each row's ``loss``: a loss by name, or an off-policy preset (the rows keep the key ``loss`` either way)."""
SETTINGS: dict[str, tuple[str, ...]] = {
    "sync": ("controller.mode=sync", "buffer.async_ratio=0"),
    "async_a2": ("controller.mode=async", "buffer.async_ratio=2"),
    "async_a8": ("controller.mode=async", "buffer.async_ratio=8"),
}
METRICS = ("reward_after", "reward_gain", "wall_s", "staleness_mean")


def run_one(loss: str, setting: str, seed: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Train one (loss, setting, seed) cell and return its row."""
    overrides = [
        *RECIPES[loss],
        *SETTINGS[setting],
        f"seed={seed}",
        f"controller.num_steps={args.steps}",
        f"controller.eval_prompts={args.eval_prompts}",
        f"output_dir={scratch / f'{loss}-{setting}-{seed}'}",
        *WORKLOAD,
        *args.overrides,
    ]
    config = load_run_config(str(DEFAULT_EXAMPLE), overrides)
    summary = asyncio.run(train(config, console=None))
    records = read_metrics(summary.metrics_path)
    ages = _staleness(records)
    return {
        "loss": loss,
        "setting": setting,
        "seed": seed,
        "reward_before": summary.eval_before.get("eval/reward_mean"),
        "reward_after": summary.eval_after.get("eval/reward_mean"),
        "reward_gain": summary.reward_gain,
        "trained_samples": summary.trained_samples,
        "wall_s": round(summary.wall_s, 1),
        "train_wall_s": round(summary.train_wall_s, 1),
        "staleness_mean": ages["mean"],
        "staleness_max": ages["max"],
        "dropped_fraction": _dropped_fraction(records),
        "load_after": round(os.getloadavg()[0], 2),
    }


CORRECTION_DROPS = (
    "mismatch/masked_fraction",
    "opsm/masked_fraction",
    "m2po/masked_fraction",
    "k3_rejection/rejected_fraction",
)
"""The per-step metrics naming the share of tokens (of sequences, for K3) an off-policy correction drops."""


def _dropped_fraction(records: list[dict[str, float]]) -> float | None:
    """Mean over steps of the share of tokens (sequences, for K3) the run's correction dropped; None without one.

    Why: a correction built for one policy's inference mismatch can drop most stale samples, and a run that
    learns less for that reason looks like one whose loss failed; this tells the two apart."""
    per_step = []
    for record in records:
        shares = [value for key, value in record.items() if key.endswith(CORRECTION_DROPS)]
        if shares:
            per_step.append(sum(shares))
    return round(sum(per_step) / len(per_step), 4) if per_step else None


def _staleness(records: list[dict[str, float]]) -> dict[str, float]:
    """Mean and max age (trainer version − start version) over every trained sample of the run."""
    total = count = 0.0
    oldest = 0.0
    for record in records:
        for key, n in record.items():
            if key.startswith("staleness/age_"):
                age = float(key.removeprefix("staleness/age_"))
                total += age * n
                count += n
                if n:
                    oldest = max(oldest, age)
    return {"mean": round(total / count, 3) if count else 0.0, "max": oldest}


def arm_runs(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, float]]]:
    """Per ``loss/setting``, its runs as harness metrics, in seed order (seeds are the paired repeats)."""
    arms: dict[str, list[dict[str, float]]] = {}
    for row in sorted(rows, key=lambda r: r["seed"]):
        arms.setdefault(f"{row['loss']}/{row['setting']}", []).append(
            {key: float(row[key]) for key in METRICS}
        )
    return arms


def paired_vs_sync(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per async ``loss/setting``: reward_after minus the same loss's sync run of the same seed, per seed, and
    whether it holds: the difference is within the sync seed-to-seed spread (max − min over seeds) or above,
    in a majority of pairs."""
    by_key = {(r["loss"], r["setting"], r["seed"]): r["reward_after"] for r in rows}
    cells: dict[str, dict[str, Any]] = {}
    for loss, setting in sorted({(r["loss"], r["setting"]) for r in rows if r["setting"] != "sync"}):
        sync = {seed: v for (lo, se, seed), v in by_key.items() if lo == loss and se == "sync"}
        seeds = [seed for (lo, se, seed) in by_key if lo == loss and se == setting and seed in sync]
        if not seeds:
            continue
        spread = max(sync.values()) - min(sync.values())
        diffs = [by_key[(loss, setting, seed)] - sync[seed] for seed in sorted(seeds)]
        within = sum(d >= -spread for d in diffs)
        cells[f"{loss}/{setting}"] = {
            "difference": harness.summary(diffs),
            "sync_spread": spread,
            "pairs_within_spread": within,
            "holds": within > len(diffs) / 2,
        }
    return cells


def settings_of(recipe: str) -> tuple[str, ...]:
    """The settings a recipe runs in: every one for the losses, sync and α = 8 for the presets (the question
    they answer is the α = 8 rule)."""
    return tuple(SETTINGS) if recipe in LOSSES else ("sync", "async_a8")


def targets(cells: dict[str, dict[str, Any]], losses: list[str]) -> dict[str, bool | None]:
    """The issue's targets: async α=2 holds for every loss; α=8 holds for at least one recipe."""
    a2 = [cells.get(f"{loss}/async_a2", {}).get("holds") for loss in losses if loss in LOSSES]
    a8 = [h for loss in losses if (h := cells.get(f"{loss}/async_a8", {}).get("holds")) is not None]
    return {  # None: the runs the target needs are not all there
        "async_a2_holds_for_every_loss": all(a2) if None not in a2 else None,
        "async_a8_holds_for_some_loss": any(a8) if a8 else None,
    }


def main() -> None:
    library_bars_follow_terminal()  # its own parser, not harness.parser: the log gets no carriage-return bars
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps of every run (same samples)")
    parser.add_argument("--eval-prompts", type=int, default=256, help="held-out prompts of each evaluation")
    parser.add_argument("--losses", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 steps, 16 eval prompts, seed 0, m2po sync and α = 8: a smoke test",
    )
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --out, run the rest")
    parser.add_argument("--out", default="bench/results/offpolicy.json")
    parser.add_argument("overrides", nargs="*", help="extra RunConfig overrides applied to every run")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.eval_prompts, args.seeds = 2, 16, [0]
        args.losses, args.settings = ["m2po"], ["sync", "async_a8"]
    out = Path(args.out)
    rows: list[dict[str, Any]] = json.loads(out.read_text())["runs"] if args.resume and out.exists() else []
    done = {(r["loss"], r["setting"], r["seed"]) for r in rows}
    with tempfile.TemporaryDirectory(prefix="offpolicy-") as scratch:
        for seed in args.seeds:
            for loss in args.losses:
                for setting in args.settings:
                    if (loss, setting, seed) in done or setting not in settings_of(loss):
                        continue
                    started = time.perf_counter()
                    rows.append(run_one(loss, setting, seed, args, Path(scratch)))
                    row = rows[-1]
                    print(
                        f"{loss:>13} {setting:>8} seed {seed}: reward {row['reward_before']:.3f} -> "
                        f"{row['reward_after']:.3f}  staleness mean {row['staleness_mean']:.2f} max "
                        f"{row['staleness_max']:.0f}  {time.perf_counter() - started:.0f}s",
                        flush=True,
                    )
                    _write(out, args, rows)
    cells = paired_vs_sync(rows)
    print(json.dumps({"cells": cells, "targets": targets(cells, args.losses)}, indent=1))


def _write(out: Path, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """The result so far in the harness schema (seeds are the repeats; every row is kept for --resume)."""
    cells = paired_vs_sync(rows)
    setup = {
        "steps": args.steps,
        "eval_prompts": args.eval_prompts,
        "overrides": args.overrides,
        "seeds": args.seeds,
    }
    extra = {"paired_vs_sync": cells, "targets": targets(cells, args.losses), "runs": rows}
    resources = {"sync": "colocated, every core per phase", "async": "runtime defaults (inline: one process)"}
    harness.write_result(args, "offpolicy", arm_runs(rows), resources=resources, setup=setup, extra=extra)


if __name__ == "__main__":
    main()
