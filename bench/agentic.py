"""Benchmark: env-level asynchrony and redundancy on multi-turn episodes whose env steps dominate the cost.

The shipped ``tiny-copy`` model plays the built-in ``copy_chain`` env through the real engine, proxy, buffer,
controller and trainer (``runtime.type=inline``: one process, so every arm uses the same cores the same way),
with the latency/fault wrapper (``env.faults``) adding a lognormal delay to every reset and step. Seconds-scale
agentic env steps are scaled down by ``time_scale`` so a run takes seconds; the delays stay much larger than
a generation or a train step, so the comparison is about env-level asynchrony, not compute.

Arms (the same batch: ``rollout_batch_size`` groups × ``num_return_sequences`` episodes per step):

- ``sync``: ``controller.mode=sync`` at the project's default env stepping (``env_manager.stepping=async``: each
  env steps as soon as its own response is ready), rollout waiting for training: sync as a user gets it.
- ``sync_lockstep``: ``sync`` with ``stepping=batch``: every episode of a round waits for the slowest env after
  each turn (the sync this benchmark used to compare against).
- ``env_async``: ``controller.mode=async`` (α=1) with ``stepping=async``: rollout also overlaps training.
- ``async_redundant``: ``env_async`` plus redundant env groups and episodes (the slowest are cut, recorded).

Sections, each its own :func:`harness.run_arms` call (arms interleaved within it): ``headline`` (σ = 0.75, the
middle of the swept range: every arm), ``sigma{σ}`` (the ends of the range at the same mean delay, both syncs
and env_async), ``redundancy`` (more env groups vs larger groups, with fail-slow hangs and fail-stop crashes
injected; the step timeout catches hangs). Every async arm's ratio divides by its section's best sync (by
the paired ratio of episodes/s there), per paired repeat; ``--rederive RESULT`` derives them again from a
result's stored runs. Arms are named ``section/arm``.
Throughput is trained episodes per second over the steps after ``warmup``. Every run asserts its episode ledger: each episode started was trained,
dropped by the producer with a reason, or dropped by the buffer with a reason.

    python bench/agentic.py [--quick] [--repeats 3] [--sections headline sigma_sweep redundancy]
                            [--out bench/results/agentic.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/agentic.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import collections
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


from asyncrl.app.runtimes import assemble_controller as make_controller  # noqa: E402
from asyncrl.app.runtimes import make_proxy, make_source  # noqa: E402
from asyncrl.app.train import runtime_parts  # noqa: E402
from asyncrl.config.run import RunConfig, load_run_config  # noqa: E402
from asyncrl.controller.controller import StepRecord  # noqa: E402
from asyncrl.types import Trajectory  # noqa: E402
from bench import harness  # noqa: E402

SECTIONS = ("headline", "sigma_sweep", "redundancy")


@dataclass(frozen=True)
class Workload:
    """What every arm shares; delays are in unscaled seconds (multiplied by ``time_scale``)."""

    groups_per_step: int
    episodes_per_group: int
    num_turns: int
    steps: int
    warmup: int
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
    mean_delay_s=2.0,
    time_scale=0.1,
    headline_sigma=0.75,
    sigmas=(0.0, 1.5),
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
    time_scale=0.005,
    sigmas=(0.0, 1.5),
    redundancy=((0, 0), (1, 1)),
    fail_slow_prob=0.05,  # high enough that a few dozen env calls surely see both faults
    fail_stop_prob=0.1,
)


@dataclass(frozen=True)
class Arm:
    """One setting: sync (at the default env stepping, or lock-step) or env-async, plus redundant env groups and
    episodes per group."""

    name: str
    sync: bool = False
    lockstep: bool = False
    extra_groups: int = 0
    extra_episodes: int = 0

    def mode_overrides(self) -> list[str]:
        if self.sync:
            lockstep = ["env_manager.stepping=batch"] if self.lockstep else []
            return ["controller.mode=sync", "buffer.async_ratio=0", *lockstep]
        return ["controller.mode=async", "buffer.async_ratio=1", "env_manager.stepping=async"]


@dataclass(frozen=True)
class Section:
    """Arms compared under one latency setting; its sync arms are the baselines (the best of them divides)."""

    name: str
    arms: tuple[Arm, ...]
    sigma: float
    faults: bool


SYNC = Arm("sync", sync=True)
SYNC_LOCKSTEP = Arm("sync_lockstep", sync=True, lockstep=True)
SYNCS = (SYNC, SYNC_LOCKSTEP)
ENV_ASYNC = Arm("env_async")


def sections(work: Workload, wanted: list[str]) -> list[Section]:
    """The sections asked for, in the order they run."""
    redundant = Arm(
        "async_redundant",
        extra_groups=max(1, work.groups_per_step // 2),
        extra_episodes=max(1, work.episodes_per_group // 2),
    )
    swept = tuple(
        Arm(f"async_groups+{g}_episodes+{e}", extra_groups=g, extra_episodes=e) for g, e in work.redundancy
    )
    chosen = []
    if "headline" in wanted:
        chosen.append(Section("headline", (*SYNCS, ENV_ASYNC, redundant), work.headline_sigma, faults=False))
    if "sigma_sweep" in wanted:
        chosen += [Section(f"sigma{s}", (*SYNCS, ENV_ASYNC), s, faults=False) for s in work.sigmas]
    if "redundancy" in wanted:
        chosen.append(Section("redundancy", (*SYNCS, *swept), work.headline_sigma, faults=True))
    return chosen


def run_config(arm: Arm, section: Section, work: Workload, out: Path) -> RunConfig:
    """The arm's settings on the shared workload."""
    scale = work.time_scale
    n, b = work.episodes_per_group, work.groups_per_step
    max_context = 64 * work.num_turns
    overrides = [
        f"output_dir={out}",
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
        f"env.faults.sigma={section.sigma}",
        f"rollout.rollout_batch_size={b}",
        f"rollout.num_return_sequences={n}",
        "rollout.max_new_tokens=12",
        f"env_manager.num_env_groups={b + arm.extra_groups}",
        f"env_manager.group_size={n + arm.extra_episodes}",
        f"env_manager.max_context_tokens={max_context}",
        f"engine.max_model_len={max_context}",
        f"env_manager.step_timeout_s={30 * work.mean_delay_s * scale}",  # catches hangs, not the tail
        "trainer.lr=1e-6",
        *arm.mode_overrides(),
    ]
    if section.faults:
        overrides += [
            f"env.faults.fail_slow_prob={work.fail_slow_prob}",
            f"env.faults.fail_stop_prob={work.fail_stop_prob}",
            f"env.faults.hang_s={1000 * work.mean_delay_s * scale}",
        ]
    return load_run_config(None, overrides)


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
        "drop_reasons": reasons,
    }


def _reason_kind(reason: str) -> str:
    """A reason without its parenthesised details, so counts group by cause."""
    return reason.split(" (")[0]


def throughput(steps: list[dict[str, float]], warmup: int) -> float:
    """Trained episodes per second over the steps after ``warmup`` (their first step's start is the end of
    the last warm-up step)."""
    kept = steps[warmup:]
    wall = kept[-1]["end_s"] - steps[warmup - 1]["end_s"]
    return sum(s["episodes"] for s in kept) / wall


def arm_runner(
    arm: Arm, section: Section, work: Workload, scratch: Path, reasons: collections.Counter[str]
) -> Callable[[], dict[str, float]]:
    """The harness arm: one training run, its numeric metrics returned, its drop reasons added to ``reasons``
    (summed over repeats: reasons are counts, not a repeated measurement)."""
    repeat = itertools.count()

    def run() -> dict[str, float]:
        out = scratch / section.name / f"{arm.name}-r{next(repeat)}"
        result = asyncio.run(train_run(run_config(arm, section, work, out)))
        ledger = result["ledger"]
        reasons.update(ledger.pop("drop_reasons"))
        return {
            "episodes_per_s": throughput(result["steps"], work.warmup),
            **ledger,
            "train_s_mean": statistics.fmean(s["train_s"] for s in result["steps"]),
        }

    return run


def run_section(
    section: Section, work: Workload, repeats: int, scratch: Path
) -> tuple[dict[str, list[dict[str, float]]], dict[str, Any], dict[str, dict[str, int]], str]:
    """The section's arms interleaved: raw runs, ratios of each async arm over the section's best sync, drop
    reasons, and which sync was the best."""
    reasons = {arm.name: collections.Counter[str]() for arm in section.arms}
    arms = {
        f"{section.name}/{arm.name}": arm_runner(arm, section, work, scratch, reasons[arm.name])
        for arm in section.arms
    }
    raw = harness.run_arms(arms, repeats, harness.print_run)
    ratios, best = section_ratios(section.name, raw)
    drop_reasons = {f"{section.name}/{a}": dict(sorted(c.items())) for a, c in reasons.items()}
    return raw, ratios, drop_reasons, best


def section_ratios(
    section: str, raw: dict[str, list[dict[str, float]]]
) -> tuple[dict[str, dict[str, Any]], str]:
    """Each async arm of ``section`` over the section's best sync, chosen by the paired ratio of episodes/s
    (``harness.best_by_paired_ratio``; the highest median once chose a sync the paired ratio put behind), and
    that sync's name."""
    names = [name for name in raw if name.startswith(f"{section}/")]
    syncs = [name for name in names if name.removeprefix(f"{section}/") in {arm.name for arm in SYNCS}]
    best = harness.best_by_paired_ratio(raw, syncs, "episodes_per_s")["name"]
    ratios = {
        f"{name}_vs_best_sync": harness.paired_ratio(raw, name, best, "episodes_per_s")
        for name in names
        if name not in syncs
    }
    return ratios, best.removeprefix(f"{section}/")


def rederive(path: Path) -> None:
    """Derive ``path``'s ratios, best syncs and targets again from its stored runs, re-running nothing: the
    measurements and their commit stay, ``rederived`` names the commit whose code derived them."""
    result = json.loads(path.read_text())
    raw = {
        arm: [
            {metric: stats["runs"][i] for metric, stats in metrics.items()} for i in range(result["repeats"])
        ]
        for arm, metrics in result["arms"].items()
    }
    ratios: dict[str, dict[str, Any]] = {}
    for section in dict.fromkeys(name.partition("/")[0] for name in raw):
        section_ratio, result["best_sync"][section] = section_ratios(section, raw)
        ratios |= section_ratio
    result["ratios"] = ratios
    result["targets"] = targets(ratios, QUICK if result["quick"] else FULL)
    result["rederived"] = {
        "commit": harness.run_commit(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "what": "ratios, best syncs and targets derived again from the stored runs; nothing re-measured",
    }
    path.write_text(json.dumps(result, indent=1) + "\n")


def targets(ratios: dict[str, dict[str, Any]], work: Workload) -> dict[str, bool]:
    """The issue's targets, for the sections that ran (medians of paired ratios)."""
    met = {}
    headline = [r["median"] for key, r in ratios.items() if key.startswith("headline/")]
    if headline:
        met["headline: best async arm >= 2x best sync episodes/s"] = max(headline) >= 2.0
    low, high = work.sigmas[0], work.sigmas[-1]
    swept = [
        ratios.get(f"sigma{low}/env_async_vs_best_sync"),
        ratios.get("headline/env_async_vs_best_sync"),
        ratios.get(f"sigma{high}/env_async_vs_best_sync"),
    ]
    if all(swept):
        medians = [r["median"] for r in swept]
        met["sigma sweep: env_async/best sync grows with sigma"] = all(
            b >= a for a, b in itertools.pairwise(medians)
        )
    return met


def resources(work: Workload, out: Path) -> dict[str, Any]:
    """How the sync and the async arms split the cores, from the runtime's planner (``harness.placement``):
    every arm runs in one process (``runtime.type=inline``), the env delays are sleeps that hold no core."""
    headline = Section("headline", (), work.headline_sigma, faults=False)
    return {
        arm.name: harness.placement(run_config(arm, headline, work, out)) for arm in (*SYNCS, ENV_ASYNC)
    } | {"env delays": "sleeps (no core held)", "async_redundant and async_groups+*": "as env_async"}


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "agentic")
    parser.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument(
        "--rederive",
        metavar="RESULT",
        help="derive RESULT's ratios again from its stored runs, re-running nothing",
    )
    args = parser.parse_args()
    if args.rederive:
        rederive(Path(args.rederive))
        return
    work = QUICK if args.quick else FULL
    repeats = harness.repeats_for(args)
    raw: dict[str, list[dict[str, float]]] = {}
    ratios: dict[str, dict[str, Any]] = {}
    drop_reasons: dict[str, dict[str, int]] = {}
    best_sync: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="agentic-bench-") as tmp:
        placement = resources(work, Path(tmp))
        for section in sections(work, args.sections):
            section_raw, section_ratios, section_reasons, best = run_section(
                section, work, repeats, Path(tmp)
            )
            raw |= section_raw
            ratios |= section_ratios
            drop_reasons |= section_reasons
            best_sync[section.name] = best
    met = targets(ratios, work)
    harness.write_result(
        args,
        "agentic",
        raw,
        ratios=ratios,
        resources=placement,
        setup={**asdict(work), "sections": args.sections},
        extra={"targets": met, "best_sync": best_sync, "drop_reasons": drop_reasons},
    )
    print(met, flush=True)


if __name__ == "__main__":
    main()
