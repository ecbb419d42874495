"""Benchmark: env-level asynchrony and redundancy on multi-turn episodes whose env steps dominate the cost.

The shipped ``tiny-copy`` model plays the built-in ``copy_chain`` env through the real engine, proxy, buffer,
controller and trainer (``runtime.type=inline``: one process, so every arm uses the same cores the same way),
with the latency/fault wrapper (``env.faults``) adding a lognormal delay to every reset and step. Seconds-scale
agentic env steps are scaled down by ``--time-scale`` so a run takes seconds; the delays stay much larger than
a generation or a train step, so the comparison is about env-level asynchrony, not compute.

Arms (the same batch: ``rollout_batch_size`` groups × ``num_return_sequences`` episodes per step):

- ``sync``: ``controller.mode=sync`` with ``env_manager.stepping=batch``: every episode of a round waits for the
  slowest env after each turn, and rollout waits for training.
- ``env_async``: ``controller.mode=async`` (α=1) with ``stepping=async``: each env steps as soon as its own
  response is ready, and rollout overlaps training.
- ``async_redundant``: ``env_async`` plus redundant env groups and episodes (the slowest are cut, recorded).

Sections: ``headline`` (high-variance lognormal, all three arms), ``sigma_sweep`` (σ at fixed mean, sync vs
env_async), ``redundancy`` (more env groups vs larger groups, with fail-slow hangs and fail-stop crashes
injected; the step timeout catches hangs). Every arm of a section runs ``--repeats`` times, interleaved (repeat
r runs every arm before repeat r+1), and ratios are taken per paired repeat. Throughput is trained episodes
per second over the steps after ``--warmup``. Every run asserts its episode ledger: each episode started was
trained, dropped by the producer with a reason, or dropped by the buffer with a reason.

    python bench/agentic.py [--quick] [--out bench/results/agentic.json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

from asyncrl.app.runtimes import assemble_controller as make_controller  # noqa: E402
from asyncrl.app.runtimes import make_proxy, make_source  # noqa: E402
from asyncrl.app.train import runtime_parts  # noqa: E402
from asyncrl.config.run import RunConfig, load_run_config  # noqa: E402
from asyncrl.controller.controller import StepRecord  # noqa: E402
from asyncrl.types import Trajectory  # noqa: E402


@dataclass(frozen=True)
class Workload:
    """What every arm shares; delays are in unscaled seconds (multiplied by ``time_scale``)."""

    groups_per_step: int
    episodes_per_group: int
    num_turns: int
    steps: int
    warmup: int
    repeats: int
    mean_delay_s: float
    time_scale: float
    headline_sigma: float
    sigmas: tuple[float, ...]
    redundancy: tuple[tuple[int, int], ...]
    """(extra env groups, extra episodes per group) points of the redundancy sweep."""
    fail_slow_prob: float
    fail_stop_prob: float


FULL = Workload(
    groups_per_step=8,
    episodes_per_group=4,
    num_turns=2,
    steps=10,
    warmup=2,
    repeats=3,
    mean_delay_s=2.0,
    time_scale=0.1,
    headline_sigma=1.5,
    sigmas=(0.0, 0.5, 1.0, 1.5),
    redundancy=((0, 0), (2, 0), (4, 0), (0, 2), (0, 4), (2, 2)),
    fail_slow_prob=0.02,
    fail_stop_prob=0.02,
)
QUICK = replace(
    FULL,
    groups_per_step=2,
    episodes_per_group=2,
    steps=3,
    warmup=1,
    repeats=1,
    time_scale=0.005,
    sigmas=(0.0, 1.5),
    redundancy=((0, 0), (1, 1)),
    fail_slow_prob=0.05,  # high enough that a few dozen env calls surely see both faults
    fail_stop_prob=0.1,
)


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...]


def stepping_arm(name: str, extra_groups: int = 0, extra_episodes: int = 0, *, sync: bool = False) -> Arm:
    if sync:
        mode = ("controller.mode=sync", "buffer.async_ratio=0", "env_manager.stepping=batch")
    else:
        mode = ("controller.mode=async", "buffer.async_ratio=1", "env_manager.stepping=async")
    return Arm(name, (*mode, f"+groups={extra_groups}", f"+episodes={extra_episodes}"))


SYNC = stepping_arm("sync", sync=True)
ENV_ASYNC = stepping_arm("env_async")


def run_config(arm: Arm, work: Workload, out: Path, *, sigma: float, faults: bool) -> RunConfig:
    """The arm's overrides on the shared workload (``+groups``/``+episodes`` are this script's redundancy)."""
    extra = {o.split("=")[0]: int(o.split("=")[1]) for o in arm.overrides if o.startswith("+")}
    scale = work.time_scale
    n, b = work.episodes_per_group, work.groups_per_step
    max_context = 64 * work.num_turns
    shared = [
        f"output_dir={out / arm.name}",
        "producer=agentic",
        "model.path=tiny-copy",
        "model.device=cpu",
        "runtime.type=inline",
        f"controller.num_steps={work.steps}",
        "controller.eval_prompts=0",
        "env.type=copy_chain",
        f"env.num_turns={work.num_turns}",
        "env.median_items=2",
        "env.length_sigma=0.5",
        "env.max_items=4",
        "env.faults.delay=lognormal",
        f"env.faults.mean_s={work.mean_delay_s * scale}",
        f"env.faults.sigma={sigma}",
        f"rollout.rollout_batch_size={b}",
        f"rollout.num_return_sequences={n}",
        "rollout.max_new_tokens=12",
        f"env_manager.num_env_groups={b + extra['+groups']}",
        f"env_manager.group_size={n + extra['+episodes']}",
        f"env_manager.max_context_tokens={max_context}",
        f"engine.max_model_len={max_context}",
        f"env_manager.step_timeout_s={30 * work.mean_delay_s * scale}",  # catches hangs, not the tail
        "trainer.lr=1e-6",
    ]
    if faults:
        shared += [
            f"env.faults.fail_slow_prob={work.fail_slow_prob}",
            f"env.faults.fail_stop_prob={work.fail_stop_prob}",
            f"env.faults.hang_s={1000 * work.mean_delay_s * scale}",
        ]
    modes = [o for o in arm.overrides if not o.startswith("+")]
    return load_run_config(None, [*shared, *modes])


async def train_run(config: RunConfig) -> dict[str, Any]:
    """One run through the real parts: per-step end times and trained episodes, and the episode ledger."""
    steps: list[dict[str, float]] = []
    dropped: list[Trajectory] = []
    with runtime_parts(config) as parts:
        source = make_source(config, parts.task)
        proxy = make_proxy(parts)

        def on_step(record: StepRecord) -> None:
            episodes = sum(len(g) for g in record.groups)
            steps.append({"end_s": time.perf_counter(), "episodes": episodes, "train_s": record.train_s})

        controller = make_controller(parts, proxy, source, on_step)
        controller.producer.on_dropped = dropped.append
        await controller.run(config.controller.num_steps)
        ledger = episode_ledger(controller, steps, dropped)
        await proxy.aclose()
    return {"steps": steps, "ledger": ledger}


def episode_ledger(
    controller: Any, steps: list[dict[str, float]], dropped: list[Trajectory]
) -> dict[str, Any]:
    """Every episode started was trained, dropped by the producer, or put and then dropped by the buffer, each
    drop with a reason; raises ``AssertionError`` naming the gap otherwise."""
    counts = controller.producer.counts
    buffer_drops = controller.buffer.take_dropped()
    buffer_dropped = sum(len(d.group) for d in buffer_drops if d.group is not None)
    trained = sum(s["episodes"] for s in steps)
    started = counts["episodes"]
    assert all(t.reason for t in dropped), "a dropped episode has no reason"
    assert all(d.reason for d in buffer_drops), "a dropped group has no reason"
    assert started == trained + len(dropped) + buffer_dropped, (
        f"episodes lost: started {started} != trained {trained} + dropped {len(dropped)} + "
        f"dropped in buffer {buffer_dropped}"
    )
    reasons = collections.Counter(f"{t.status.value}: {_reason_kind(t.reason)}" for t in dropped)
    for drop in buffer_drops:
        if drop.group is not None:
            reasons[f"buffer {drop.kind.value}: {_reason_kind(drop.reason)}"] += len(drop.group)
    return {
        "started": started,
        "trained": trained,
        "dropped_by_producer": len(dropped),
        "dropped_by_buffer": buffer_dropped,
        "drop_reasons": dict(sorted(reasons.items())),
    }


def _reason_kind(reason: str) -> str:
    """A reason without its parenthesised details, so counts group by cause."""
    return reason.split(" (")[0]


def throughput(steps: list[dict[str, float]], warmup: int) -> float:
    """Trained episodes per second over the steps after ``warmup``."""
    kept = steps[warmup:]
    wall = kept[-1]["end_s"] - steps[warmup - 1]["end_s"]
    return sum(s["episodes"] for s in kept) / wall


def run_section(
    name: str, arms: list[Arm], work: Workload, out: Path, *, sigma: float, faults: bool
) -> dict[str, Any]:
    """Every arm ``work.repeats`` times, interleaved; paired ratios against the section's first arm."""
    repeats: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
    for r in range(work.repeats):
        for arm in arms:
            config = run_config(arm, work, out / f"{name}-r{r}", sigma=sigma, faults=faults)
            result = asyncio.run(train_run(config))
            row = {
                "repeat": r,
                "episodes_per_s": throughput(result["steps"], work.warmup),
                **result["ledger"],
            }
            row["train_s_mean"] = statistics.fmean(s["train_s"] for s in result["steps"])
            repeats[arm.name].append(row)
            print(name, f"sigma={sigma}", arm.name, json.dumps(row), flush=True)
    base = arms[0].name
    summary = {}
    for arm in arms:
        rates = [row["episodes_per_s"] for row in repeats[arm.name]]
        ratios = [a / b for a, b in zip(rates, (row["episodes_per_s"] for row in repeats[base]), strict=True)]
        summary[arm.name] = {
            "overrides": list(arm.overrides),
            "episodes_per_s": spread(rates),
            f"ratio_vs_{base}_per_repeat": ratios,
            f"ratio_vs_{base}": spread(ratios),
        }
    return {"sigma": sigma, "faults": faults, "repeats": repeats, "summary": summary}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def redundancy_arms(work: Workload) -> list[Arm]:
    return [stepping_arm(f"async_groups+{g}_episodes+{e}", g, e) for g, e in work.redundancy]


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": os.getloadavg(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def commit() -> str:
    probe = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=False)
    return probe.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_all(work: Workload, out: Path, sections: list[str]) -> dict[str, Any]:
    report: dict[str, Any] = {
        "command": " ".join([sys.executable, *sys.argv]),
        "commit": commit(),
        "machine": machine(),
        "workload": {k: v for k, v in vars(work).items()},
    }
    redundant = stepping_arm(
        "async_redundant", max(1, work.groups_per_step // 2), max(1, work.episodes_per_group // 2)
    )
    if "headline" in sections:
        arms = [SYNC, ENV_ASYNC, redundant]
        report["headline"] = run_section("headline", arms, work, out, sigma=work.headline_sigma, faults=False)
    if "sigma_sweep" in sections:
        report["sigma_sweep"] = [
            run_section(f"sigma{s}", [SYNC, ENV_ASYNC], work, out, sigma=s, faults=False) for s in work.sigmas
        ]
    if "redundancy" in sections:
        arms = [SYNC, *redundancy_arms(work)]
        report["redundancy"] = run_section(
            "redundancy", arms, work, out, sigma=work.headline_sigma, faults=True
        )
    report["targets"] = targets(report)
    report["load_average_at_end"] = os.getloadavg()
    return report


def targets(report: dict[str, Any]) -> dict[str, bool]:
    """The issue's targets, for the sections that ran (medians of paired ratios)."""
    met = {}
    if "headline" in report:
        best = max(v["ratio_vs_sync"]["median"] for v in report["headline"]["summary"].values())
        met["headline: best async arm >= 2x sync episodes/s"] = best >= 2.0
    if "sigma_sweep" in report:
        ratios = [s["summary"]["env_async"]["ratio_vs_sync"]["median"] for s in report["sigma_sweep"]]
        met["sigma sweep: env_async/sync grows with sigma"] = all(
            b >= a for a, b in itertools.pairwise(ratios)
        )
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run in seconds (one repeat, tiny delays)"
    )
    parser.add_argument("--out", default="bench/results/agentic.json")
    parser.add_argument("--sections", nargs="*", default=["headline", "sigma_sweep", "redundancy"])
    parser.add_argument("--repeats", type=int, help="repeats per arm (default 3; --quick 1)")
    args = parser.parse_args()
    work = QUICK if args.quick else FULL
    if args.repeats:
        work = replace(work, repeats=args.repeats)
    with tempfile.TemporaryDirectory(prefix="agentic-bench-") as tmp:
        report = run_all(work, Path(tmp), args.sections)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report["targets"], indent=1))


if __name__ == "__main__":
    main()
