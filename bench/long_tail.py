"""Benchmark: async against the best sync at equal resources, on a long-tail RL workload that learns (issue 29).

The workload is ``bench/workloads.py: LONG_TAIL`` (an ~18 M Qwen3-shaped model warm-started by the project's
SFT, the ``copy`` task with log-normal lengths up to ``max_new_tokens`` = 1,024, group size 8, a normal
learning rate, 110 steps); it was committed before any of its arms ran. Every arm is a real run at the
defaults a user gets (``runtime.type=inline``: one process, a thread per role, threads from the placement
planner), each run in a fresh process so its memory is its own. Stages, each its own set of interleaved arms:

- ``sweep``: sync tuned on the same 2 cores before anything is compared: batch vs queue generation, redundant
  prompts 0 / B/4 / B/2 (B = prompts per step), over-sampling in batch mode, one engine with every core
  (``runtime.driver_cpus=0``) and two engine replicas. The best arm by the paired ratio of samples/s
  (``harness.best_by_paired_ratio``: not the highest median, which a 0.7 % margin once decided against the
  paired ratio) is ``best_sync``, and every async-vs-sync ratio divides by it; where the redundancy axis's
  best sits at its largest share, the result says so (``best_sync.edge``).
- ``bound``: the physical bound, measured apart from every arm. For each placement an arm uses, the bare
  engines alone, saturated (more requests than slots), on exactly the role's threads and cores, and the
  trainer alone on its threads and cores, training batches of real kept groups. An arm's best possible step
  is the slower of (its generated tokens per step at the lone engine's rate, its trained tokens per step at
  the lone trainer's rate); the bound is ``best_sync``'s step over that, and each arm's fraction of it is
  that best step over its measured step. Peak RSS of the lone roles gives the memory per role.
- ``throughput``: async α = 1, 2, 4, one-step-off and partial rollout beside ``best_sync``, steady-state
  samples/s over ``measured_steps`` after ``warmup``.
- ``time_to_reward``: async α = 2 and ``best_sync``, one full run per seed (repeat i runs seed i), weights
  snapshotted every ``eval_every`` steps (in memory, untimed work of ~20 ms) and evaluated on held-out prompts
  after the run. ``time_to_reward_async_a2_over_best_sync``: the best sync's time to its final held-out reward
  over the time async takes to reach the same reward (linear between checkpoints), on the seed-mean curves
  (the headline) and per seed beside it; a seed whose async run never reaches it is censored (its time at
  least its run's length, so its ratio an upper bound), never dropped (``harness.time_to_reward_ratio``).
- ``curve``: async α = 2 over ``best_sync`` as the length tail grows (σ), as the group size grows (at 32
  samples per step) and with two engines, each point its own interleaved pair. The two-engine point is also
  divided by the better of its own sync and the workload point's (``..._over_best_curve_sync``): the same
  work, so the best sync there may use one engine.
- ``partial_time_to_reward``: ``time_to_reward`` for partial rollout α = 2 (the one async arm above
  ``best_sync`` at steady state) against ``best_sync`` again, with its own evaluation of the warm start. Added
  after the other stages had run, as a stage of its own so that adding it changed none of theirs.

Per-step timelines (elapsed time, phases, samples, tokens, reward, filter keep rate) of every run are saved
in the result. Stages run in the order ``--stages`` gives, and the result file is rewritten after each (and
after each curve point), so a run stopped early keeps what it measured (``setup.stages`` names the stages
done); ``--extend RESULT`` continues it with the stages it lacks (a stopped curve with its points), refused unless the measured code (``MEASURED_CODE``) and the workload
are unchanged since its commit (each stage records the commit it ran at). ``--quick`` runs every stage on a
tiny twin of the workload in about a minute.

    python bench/long_tail.py [--quick] [--repeats 3] [--stages sweep bound throughput time_to_reward curve
        partial_time_to_reward]
        [--best-sync NAME] [--extend RESULT] [--out bench/results/long_tail.json]
    python bench/long_tail.py --rederive bench/results/long_tail.json   # derive again, re-run nothing
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/long_tail.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import asyncio
import concurrent.futures
import dataclasses
import functools
import hashlib
import itertools
import json
import multiprocessing
import os
import pickle
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from bench import harness, registry  # noqa: E402
from bench.provenance import code_changes_since, measured_code  # noqa: E402
from bench.workloads import LONG_TAIL, QUICK_LONG_TAIL, RLWorkload  # noqa: E402

STAGES = ("sweep", "bound", "throughput", "time_to_reward", "curve", "partial_time_to_reward")
EVAL_SEED = 0
"""Sampling seed of every held-out evaluation: the same prompts and seeds at every checkpoint of every run, so
two checkpoints differ by their weights, not their draws."""
SATURATION_WAVES = 4
"""Requests the lone engines serve, in multiples of their slots; measured only while more are waiting."""


# ---- arms ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One configuration: its mode and scheduling overrides; redundant prompts as a share of the batch."""

    name: str
    overrides: tuple[str, ...]
    redundant_share: float = 0.5
    """``rollout.max_additional_running_prompts`` as a share of the prompts per step (rounded)."""

    def config_overrides(self, prompts_per_step: int) -> list[str]:
        redundant = round(self.redundant_share * prompts_per_step)
        return [*self.overrides, f"rollout.max_additional_running_prompts={redundant}"]


SYNC = ("controller.mode=sync", "buffer.async_ratio=0")
SWEEP = (
    Arm("sync_batch", (*SYNC, "rollout.generation=batch"), redundant_share=0.0),
    Arm("sync_batch_oversample_b2", (*SYNC, "rollout.generation=batch"), redundant_share=0.5),
    Arm("sync_queue_r0", (*SYNC, "rollout.generation=queue"), redundant_share=0.0),
    Arm("sync_queue_rb4", (*SYNC, "rollout.generation=queue"), redundant_share=0.25),
    Arm("sync_queue_rb2", (*SYNC, "rollout.generation=queue"), redundant_share=0.5),
    Arm("sync_queue_rb2_2engines", (*SYNC, "rollout.generation=queue", "rollout.num_engines=2")),
    Arm("sync_queue_rb2_engine_all_cores", (*SYNC, "rollout.generation=queue", "runtime.driver_cpus=0")),
)
"""The sync tuning sweep at equal resources (2 cores). Redundancy is swept with queue scheduling (where a
filtered group is replaced the moment it is dropped); the engine layouts at the project default's B/2."""
ASYNC_A2 = Arm("async_a2", ("controller.mode=async", "buffer.async_ratio=2"))
PARTIAL_ROLLOUT_A2 = Arm("partial_rollout_a2", ("controller.mode=partial_rollout", "buffer.async_ratio=2"))
ASYNC_ARMS = (
    Arm("async_a1", ("controller.mode=async", "buffer.async_ratio=1")),
    ASYNC_A2,
    Arm("async_a4", ("controller.mode=async", "buffer.async_ratio=4")),
    Arm("one_step_off", ("controller.mode=one_step_off", "buffer.async_ratio=1")),
    PARTIAL_ROLLOUT_A2,
)
"""Every async arm keeps the workload's redundant prompts (B/2, the project default's share)."""


@dataclass(frozen=True)
class CurvePoint:
    """One point of the curve: what it changes in both arms."""

    name: str
    overrides: tuple[str, ...]
    prompts_per_step: int


def curve_points(work: RLWorkload, quick: bool) -> list[CurvePoint]:
    """σ of the length tail from 0 to 1.5, the group size at a fixed number of samples per step, and two
    engines. The full curve measures the workload itself (σ 1.2, G 8, one engine) again as its own reference:
    the throughput stage has the same pair, but a curve continued in a later session may run on another
    machine (and a warm start rebuilt there), and its points compare only with a reference measured beside
    them."""
    n, b = work.samples_per_step, work.prompts_per_step
    sigmas = (0.0,) if quick else (0.0, 0.6, 1.5)
    points = [CurvePoint(f"sigma{s:g}", (f"task.length_sigma={s}",), b) for s in sigmas]
    if quick:
        return points
    points.insert(0, CurvePoint("workload", (), b))
    for group in (4, 16):
        points.append(
            CurvePoint(
                f"group{group}",
                (f"rollout.num_return_sequences={group}", f"rollout.rollout_batch_size={n // group}"),
                n // group,
            )
        )
    points.append(CurvePoint("engines2", ("rollout.num_engines=2",), b))
    return points


# ---- one run, in its own process ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """What a child process runs: a training run of ``steps`` steps, snapshots every ``snapshot_every`` (0:
    none) evaluated on ``eval_prompts`` held-out prompts afterwards."""

    overrides: tuple[str, ...]
    steps: int
    snapshot_every: int = 0
    eval_prompts: int = 0


def run_training(spec: RunSpec) -> dict[str, Any]:
    """The child's job: one training run through the real parts; per-step rows, held-out evaluations of the
    snapshots, and the process's memory (its baseline after imports, its peak while training)."""
    from asyncrl.app.context_length import with_max_model_len
    from asyncrl.config.run import load_run_config

    baseline = harness.resident_memory_mb()["rss_mb"]
    config, _ = with_max_model_len(
        load_run_config(None, [*spec.overrides, f"controller.num_steps={spec.steps}"])
    )
    rows, snapshots = asyncio.run(_train(config, spec.snapshot_every))
    memory = {"baseline_rss_mb": baseline, "peak_rss_mb": harness.resident_memory_mb()["peak_rss_mb"]}
    evals = evaluate_snapshots(config, snapshots, spec.eval_prompts) if snapshots else []
    return {"rows": rows, "evals": evals, "memory": memory}


async def _train(config: Any, snapshot_every: int) -> tuple[list[dict[str, float]], list[dict[str, Any]]]:
    from asyncrl.app.runtimes import assemble_controller, make_proxy, make_source, runtime_parts

    rows: list[dict[str, float]] = []
    snapshots: list[dict[str, Any]] = []
    with runtime_parts(config) as parts:
        proxy = make_proxy(parts)
        model = parts.trainer.trainer.model  # inline: the trainer's own weights, read between steps

        def on_step(record: Any) -> None:
            rows.append(step_row(record, proxy.stats(), controller.buffer.accounting(), started))
            if snapshot_every and record.step % snapshot_every == 0:
                state = {key: value.detach().clone() for key, value in model.state_dict().items()}
                snapshots.append({"step": record.step, "elapsed_s": rows[-1]["elapsed_s"], "state": state})

        controller = assemble_controller(parts, proxy, make_source(config, parts.task), on_step)
        started = time.perf_counter()
        await controller.run(config.controller.num_steps)
        await proxy.aclose()
    return rows, snapshots


def step_row(record: Any, proxy_stats: dict[str, Any], accounting: Any, started: float) -> dict[str, float]:
    """One step of a run's timeline: when it ended, its phases, what it trained, and the cumulative counters
    (tokens the engines generated, groups admitted and filtered) that windows are differenced from."""
    from asyncrl.types import TrajectoryStatus

    samples = [t for g in record.groups for t in g.trajectories]
    engines = proxy_stats.get("engines", [])
    return {
        "step": float(record.step),
        "elapsed_s": time.perf_counter() - started,
        "wait_s": record.wait_s,
        "train_s": record.train_s,
        "sync_s": record.sync_s,
        "groups": float(len(record.groups)),
        "samples": float(len(samples)),
        "response_tokens": float(sum(t.num_response_tokens for t in samples)),
        "trained_tokens": float(sum(len(t.token_ids) for t in samples)),
        "max_response_tokens": float(max(t.num_response_tokens for t in samples)),
        "truncated": float(sum(t.status is TrajectoryStatus.TRUNCATED for t in samples)),
        "reward_mean": statistics.fmean(t.reward for t in samples),
        "max_staleness": float(max(record.version - t.start_version for t in samples)),
        "generated_tokens": float(sum(int(e.get("total_tokens", 0)) for e in engines)),
        "engine_busy_s": float(max((e.get("busy_seconds", 0.0) for e in engines), default=0.0)),
        "admitted_groups": float(accounting.num_admitted),
        "filtered_groups": float(accounting.num_dropped.get("filtered", 0)),
    }


def evaluate_snapshots(
    config: Any, snapshots: list[dict[str, Any]], num_prompts: int
) -> list[dict[str, float]]:
    """Held-out mean reward of every snapshot: one seeded temperature-1 sample per prompt, on a lone engine
    with every core (after the run: none of it is timed)."""
    from asyncrl.config.run import RunConfig
    from asyncrl.controller.evaluation import score_answers, summary_metrics
    from asyncrl.data.registry import make_task
    from asyncrl.engine import make_engine
    from asyncrl.models.loading import load_model_and_tokenizer
    from asyncrl.rewards.service import RewardService

    assert isinstance(config, RunConfig)
    model, tokenizer = load_model_and_tokenizer(config.model.path, config.model.dtype, "cpu")
    samples = list(make_task(config.task).split("eval"))[:num_prompts]
    rewards = RewardService.from_config(config.reward)
    out = []
    try:
        for snapshot in snapshots:
            if snapshot["state"] is not None:
                model.load_state_dict(snapshot["state"])
            engine = make_engine(model, tokenizer, config.engine, num_threads=len(os.sched_getaffinity(0)))
            try:
                answers = asyncio.run(
                    score_answers(
                        engine,
                        tokenizer,
                        samples,
                        rewards,
                        rollout=config.rollout,
                        temperature=1.0,
                        max_new_tokens=config.rollout.max_new_tokens,
                        seed=EVAL_SEED,
                    )
                )
                metrics = summary_metrics(answers)
            finally:
                engine.shutdown()
            out.append({"step": snapshot["step"], "elapsed_s": snapshot["elapsed_s"], **metrics})
    finally:
        rewards.close()
    return out


def evaluate_warm_start(overrides: tuple[str, ...], num_prompts: int) -> dict[str, float]:
    """The child's job for step 0 of every curve: the warm start itself, evaluated like every snapshot."""
    from asyncrl.app.context_length import with_max_model_len
    from asyncrl.config.run import load_run_config

    config, _ = with_max_model_len(load_run_config(None, list(overrides)))
    return evaluate_snapshots(config, [{"step": 0, "elapsed_s": 0.0, "state": None}], num_prompts)[0]


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a fresh process (spawned: no state, threads or memory carried over from this one)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


# ---- steady state and time to reward ------------------------------------------------------------------------


def steady_state(rows: list[dict[str, float]], warmup: int, cores: int) -> dict[str, float]:
    """Throughput and where the time went over the steps after ``warmup`` (the window starts at the end of the
    last warm-up step), per step and per core; the filter's keep rate over the same window."""
    kept = rows[warmup:]
    before = rows[warmup - 1] if warmup else {key: 0.0 for key in rows[0]}
    wall = kept[-1]["elapsed_s"] - before["elapsed_s"]
    steps = len(kept)
    samples = sum(r["samples"] for r in kept)
    tokens = sum(r["response_tokens"] for r in kept)
    filtered = kept[-1]["filtered_groups"] - before["filtered_groups"]
    trained_groups = sum(r["groups"] for r in kept)
    return {
        "steps_measured": float(steps),
        "wall_s": wall,
        "step_s": wall / steps,
        "samples_per_s": samples / wall,
        "tokens_per_s": tokens / wall,
        "samples_per_s_per_core": samples / wall / cores,
        "tokens_per_s_per_core": tokens / wall / cores,
        "mean_response_tokens": tokens / samples,
        "generated_tokens_per_step": (kept[-1]["generated_tokens"] - before["generated_tokens"]) / steps,
        "trained_tokens_per_step": sum(r["trained_tokens"] for r in kept) / steps,
        "wait_s": statistics.fmean(r["wait_s"] for r in kept),
        "train_s": statistics.fmean(r["train_s"] for r in kept),
        "sync_s": statistics.fmean(r["sync_s"] for r in kept),
        "engine_busy_fraction": (kept[-1]["engine_busy_s"] - before["engine_busy_s"]) / wall,
        "filter_keep_rate": trained_groups / (trained_groups + filtered),
        "truncated_fraction": sum(r["truncated"] for r in kept) / samples,
        "max_response_tokens": max(r["max_response_tokens"] for r in kept),
        "max_staleness": max(r["max_staleness"] for r in kept),
        "reward_mean": statistics.fmean(r["reward_mean"] for r in kept),
    }


def time_to_reach(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first time a (time, reward) curve reaches ``target``, linear between its points; None if never.
    A curve whose start already meets the target reaches it at its first later point that does: reaching
    takes training, and a time of 0 would make any ratio over it infinite."""
    for (t0, r0), (t1, r1) in zip(curve, curve[1:], strict=False):
        if r1 < target:
            continue
        if r0 < target:
            return t0 + (t1 - t0) * (target - r0) / (r1 - r0)
        return t0 if t0 > 0 else t1  # at the target from the start: its first trained point there
    return None


def reward_curve(start_reward: float, evals: list[dict[str, float]]) -> list[tuple[float, float]]:
    """(elapsed seconds, held-out reward) from the warm start (0 s) through every evaluated snapshot."""
    return [(0.0, start_reward), *((e["elapsed_s"], e["eval/reward_mean"]) for e in evals)]


def time_to_reward(
    start_reward: float,
    sync_runs: list[dict[str, Any]],
    async_runs: list[dict[str, Any]],
    async_name: str = "async_a2",
) -> dict[str, Any]:
    """Best sync's time to its final held-out reward against async's time to the same reward, per seed, and on
    the seed-mean curves (the headline: one noisy evaluation per checkpoint averages out over seeds). A seed
    whose async run never reaches the target is censored (``harness.TimeToReward``), never dropped."""
    per_seed = [
        seed_time(reward_curve(start_reward, sync["evals"]), reward_curve(start_reward, fast["evals"]))
        for sync, fast in zip(sync_runs, async_runs, strict=True)
    ]
    mean_sync = mean_curve([reward_curve(start_reward, run["evals"]) for run in sync_runs])
    mean_async = mean_curve([reward_curve(start_reward, run["evals"]) for run in async_runs])
    return {
        "per_seed": per_seed,
        "mean_curves": {"best_sync": mean_sync, async_name: mean_async},
        "mean_over_seeds": seed_time(mean_sync, mean_async),
    }


def seed_time(sync_curve: Sequence[tuple[float, float]], async_curve: Sequence[tuple[float, float]]) -> dict:
    """Sync's final reward as the target and its run length as its time; async's first time there (None if
    never: its time is then at least its run's length, ``async_run_s``) and the ratio (an upper bound when
    censored)."""
    target, sync_time = sync_curve[-1][1], sync_curve[-1][0]
    times = harness.TimeToReward(sync_time, time_to_reach(async_curve, target), async_curve[-1][0])
    return {
        "target_reward": target,
        "best_sync_s": sync_time,
        "async_s": times.reached_s,
        "async_run_s": times.run_s,
        "censored": times.censored,
        "ratio": times.ratio,
    }


def seed_times(record: dict[str, Any]) -> harness.TimeToReward:
    """A :func:`seed_time` record back as the harness's ``TimeToReward``."""
    return harness.TimeToReward(record["best_sync_s"], record["async_s"], record["async_run_s"])


def mean_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Point-wise mean over seeds of curves evaluated at the same steps."""
    return [
        (statistics.fmean(c[i][0] for c in curves), statistics.fmean(c[i][1] for c in curves))
        for i in range(min(map(len, curves)))
    ]


# ---- the physical bound -------------------------------------------------------------------------------------


def lone_engines(overrides: tuple[str, ...], cores: int, groups_path: str) -> dict[str, float]:
    """The child's job: the arm's engines alone (its placement's threads, pinned to its rollout cores, the
    workload's prompts and sampling), fed ``SATURATION_WAVES`` times their slots; tokens/s measured while more
    requests wait than there are slots. Every response then finishes and the groups (scored) are saved to
    ``groups_path`` for the lone trainer."""
    import torch

    from asyncrl.app.context_length import with_max_model_len
    from asyncrl.config.run import load_run_config
    from asyncrl.data.base import prompt_token_ids
    from asyncrl.data.registry import make_task
    from asyncrl.models.loading import load_model_and_tokenizer
    from asyncrl.rewards.service import RewardService
    from asyncrl.rollout.rlvr_producer import build_trajectory, request_seed, response_text, sampling_params
    from asyncrl.runtime.inline import make_engines
    from asyncrl.runtime.placement import plan_placement
    from asyncrl.types import Group, Request

    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:cores]))
    baseline = harness.resident_memory_mb()["rss_mb"]
    config, _ = with_max_model_len(load_run_config(None, list(overrides)))
    plan = plan_placement(config.runtime, num_engines=config.rollout.num_engines, mode=config.controller.mode)
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(config.model.path, config.model.dtype, "cpu")
    engines = make_engines(config, model, tokenizer, plan.engine_threads)
    slots = config.engine.max_running_requests * len(engines)
    group_size = config.rollout.num_return_sequences
    prompts = list(make_task(config.task).split("train"))[: SATURATION_WAVES * slots // group_size]
    requests = [
        Request(
            request_id=f"{p.uid}#{i}",
            prompt_token_ids=prompt_token_ids(p, tokenizer),
            sampling=sampling_params(config.rollout, request_seed(config.seed, p.uid, i)),
        )
        for p in prompts
        for i in range(group_size)
    ]
    rewards = RewardService.from_config(config.reward)
    try:
        measured, generations = asyncio.run(_serve_saturated(engines, requests, slots))
        groups = []
        for g, prompt in enumerate(prompts):
            trajectories = []
            for i in range(group_size):
                generation = generations[g * group_size + i]
                text = response_text(generation, tokenizer)
                result = asyncio.run(rewards.score(text, prompt))
                trajectories.append(build_trajectory(_Prompt(prompt), i, generation, text, result, 0))
            if config.rollout.filter == "none" or len({t.reward for t in trajectories}) > 1:  # what it trains
                groups.append(Group(prompt_uid=prompt.uid, trajectories=trajectories))
        Path(groups_path).write_bytes(pickle.dumps(groups))
    finally:
        rewards.close()
        for engine in engines:
            engine.shutdown()
    memory = harness.resident_memory_mb()
    return {
        **measured,
        "engines": float(len(engines)),
        "engine_threads": float(plan.engine_threads),
        "kept_groups": float(len(groups)),
        "baseline_rss_mb": baseline,
        "peak_rss_mb": memory["peak_rss_mb"],
    }


@dataclass(frozen=True)
class _Prompt:
    """What ``build_trajectory`` reads of a prompt source's prompt."""

    sample: Any

    @property
    def key(self) -> str:
        return self.sample.uid


async def _serve_saturated(
    engines: list[Any], requests: list[Any], slots: int
) -> tuple[dict[str, float], list]:
    remaining = len(requests)
    mark: dict[str, float] = {}
    started = time.perf_counter()

    async def serve(index: int, request: Any) -> Any:
        nonlocal remaining
        generation = await engines[index % len(engines)].generate(request)
        remaining -= 1
        if remaining < slots and not mark:
            mark["saturated_s"] = time.perf_counter() - started
            mark["tokens"] = float(sum(e.stats()["num_generated_tokens"] for e in engines))
        return generation

    generations = await asyncio.gather(*(serve(i, r) for i, r in enumerate(requests)))
    return {
        "tokens_per_s": mark["tokens"] / mark["saturated_s"],
        "saturated_s": mark["saturated_s"],
    }, generations


def lone_trainer(overrides: tuple[str, ...], cores: int, groups_path: str, steps: int) -> dict[str, float]:
    """The child's job: the trainer alone (its placement's threads, pinned to its cores) training batches of
    the kept groups the lone engines made; trained tokens (prompt + response) per second after one warm-up
    step."""
    import torch

    from asyncrl.config.run import load_run_config
    from asyncrl.models.loading import load_model_and_tokenizer
    from asyncrl.runtime.inline import LocalTrainer
    from asyncrl.runtime.placement import plan_placement
    from asyncrl.trainer.trainer import Trainer

    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[-cores:]))
    baseline = harness.resident_memory_mb()["rss_mb"]
    config = load_run_config(None, list(overrides))
    plan = plan_placement(config.runtime, num_engines=config.rollout.num_engines, mode=config.controller.mode)
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(config.model.path, config.model.dtype, "cpu")
    trainer = LocalTrainer(
        Trainer(
            model,
            config.trainer,
            config.loss,
            config.advantage,
            None,
            pad_token_id=tokenizer.pad_token_id or 0,
        ),
        plan.trainer_threads,
    )
    groups = pickle.loads(Path(groups_path).read_bytes())
    per_step = config.rollout.rollout_batch_size
    batches = [groups[i : i + per_step] for i in range(0, len(groups) - per_step + 1, per_step)][: steps + 1]
    if len(batches) < 2:
        raise RuntimeError(f"the lone engines kept {len(groups)} groups: too few for two training steps")
    try:
        trainer.train_step(batches[0], trainer.version)  # warm-up
        started = time.perf_counter()
        for batch in batches[1:]:
            trainer.train_step(batch, trainer.version)
        seconds = time.perf_counter() - started
    finally:
        trainer.shutdown()
    tokens = sum(len(t.token_ids) for batch in batches[1:] for g in batch for t in g.trajectories)
    return {
        "trained_tokens_per_s": tokens / seconds,
        "step_s": seconds / (len(batches) - 1),
        "trainer_threads": float(plan.trainer_threads),
        "baseline_rss_mb": baseline,
        "peak_rss_mb": harness.resident_memory_mb()["peak_rss_mb"],
    }


# ---- the stages ---------------------------------------------------------------------------------------------


@dataclass
class Bench:
    """The run's shared state: the workload, repeats, where scratch goes, and everything measured so far."""

    work: RLWorkload
    repeats: int
    scratch: Path
    cores: int
    raw: dict[str, list[dict[str, float]]] = dataclasses.field(default_factory=dict)
    studies: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    timelines: dict[str, list[list[dict[str, float]]]] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    best_sync: Arm | None = None
    checkpoint: Callable[[], None] = lambda: None
    """Writes the result as it stands; a stage that takes hours calls it between its parts."""

    def overrides(self, arm: Arm, point: CurvePoint | None = None) -> tuple[str, ...]:
        """The workload's run, the arm's mode and scheduling, then the curve point's change (if any)."""
        prompts = point.prompts_per_step if point else self.work.prompts_per_step
        return (*self.work.overrides(), *arm.config_overrides(prompts), *(point.overrides if point else ()))

    def steady_arm(self, name: str, overrides: tuple[str, ...], measured_steps: int) -> Callable[[], dict]:
        """A harness arm: one steady-state run in a child process, repeat i on seed i (so the arms of a paired
        repeat see the same prompts and sampling seeds, and the repeats different ones); its timeline is kept."""
        steps = self.work.warmup + measured_steps
        seeds = itertools.count()

        def run() -> dict[str, float]:
            result = in_child(run_training, RunSpec((*overrides, f"seed={next(seeds)}"), steps))
            self.timelines.setdefault(name, []).append(result["rows"])
            return steady_state(result["rows"], self.work.warmup, self.cores) | result["memory"]

        return run

    def run_stage(
        self, stage: str, title: str, arms: dict[str, Callable[[], dict]], steps: int, note: str = ""
    ) -> None:
        started = time.perf_counter()
        raw = harness.run_arms(arms, self.repeats, harness.print_run)
        self.raw |= raw
        self.studies[stage] = {
            "title": title,
            "points": list(arms),
            "steps": steps,
            "wall_s": time.perf_counter() - started,
            "command": f"python bench/long_tail.py --stages {stage}",
            "repeats_note": note or f"{self.repeats} interleaved repeats per arm, median (min–max)",
            **stage_provenance(self.work),
        }


def stage_sweep(bench: Bench) -> None:
    arms = {
        f"sweep/{arm.name}": bench.steady_arm(
            f"sweep/{arm.name}", bench.overrides(arm), bench.work.sweep_measured_steps
        )
        for arm in sweep_arms(bench)
    }
    bench.run_stage(
        "sweep", "Sync tuned on the same cores: the best is best_sync", arms, bench.work.sweep_measured_steps
    )
    best = sweep_choice(bench)["name"]
    bench.best_sync = next(arm for arm in SWEEP if arm.name == best)


REDUNDANCY_AXIS = {"sync_queue_r0": 0.0, "sync_queue_rb4": 0.25, "sync_queue_rb2": 0.5}
"""The sweep's one-axis part: queue scheduling at each redundant share of the batch (the share it sets)."""


def sweep_choice(bench: Bench) -> dict[str, Any]:
    """The sweep's best sync by the paired ratio (``harness.best_by_paired_ratio``), its margin over the
    runner-up, and whether the redundancy axis's best sits at the axis's edge."""
    swept = [f"sweep/{arm.name}" for arm in SWEEP if f"sweep/{arm.name}" in bench.raw]
    choice = harness.best_by_paired_ratio(bench.raw, swept)
    choice = {k: v.removeprefix("sweep/") if isinstance(v, str) else v for k, v in choice.items()}
    axis = {f"sweep/{name}": share for name, share in REDUNDANCY_AXIS.items() if f"sweep/{name}" in bench.raw}
    if len(axis) > 1:
        axis_best = harness.best_by_paired_ratio(bench.raw, list(axis))["name"]
        if edge := harness.sweep_edge(axis, axis_best, "redundant share (queue scheduling)"):
            choice["edge"] = edge
    return choice


def sweep_arms(bench: Bench) -> tuple[Arm, ...]:
    quick = bench.work is QUICK_LONG_TAIL
    return tuple(a for a in SWEEP if a.name in ("sync_batch", "sync_queue_rb2")) if quick else SWEEP


def stage_throughput(bench: Bench) -> None:
    best = require_best_sync(bench)
    chosen = (ASYNC_A2,) if bench.work is QUICK_LONG_TAIL else ASYNC_ARMS
    steps = bench.work.measured_steps
    arms = {"throughput/best_sync": bench.steady_arm("throughput/best_sync", bench.overrides(best), steps)}
    arms |= {
        f"throughput/{a.name}": bench.steady_arm(f"throughput/{a.name}", bench.overrides(a), steps)
        for a in chosen
    }
    bench.run_stage("throughput", f"Async arms beside best_sync ({best.name}), steady state", arms, steps)


def full_runs(bench: Bench, stage: str, arms: dict[str, Arm], title: str) -> dict[str, list[dict[str, Any]]]:
    """One full run of each arm per seed (repeat i runs seed i, the arms interleaved), snapshots evaluated on
    held-out prompts after each run; every run's result by arm."""
    work = bench.work
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    seeds = run_seeds(bench)

    def full_run(name: str, arm: Arm) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            seed = seeds[len(runs[name])]
            spec = RunSpec(
                (*bench.overrides(arm), f"seed={seed}"), work.steps, work.eval_every, work.eval_prompts
            )
            result = in_child(run_training, spec)
            runs[name].append(result)
            bench.timelines.setdefault(f"{stage}/{name}", []).append(result["rows"])
            final = result["evals"][-1]
            return (
                steady_state(result["rows"], work.warmup, bench.cores)
                | result["memory"]
                | {
                    "seed": float(seed),
                    "train_wall_s": result["rows"][-1]["elapsed_s"],
                    "reward_final": final["eval/reward_mean"],
                }
            )

        return run

    bench.run_stage(
        stage, title, {f"{stage}/{name}": full_run(name, arm) for name, arm in arms.items()}, work.steps
    )
    return runs


def run_seeds(bench: Bench) -> list[int]:
    """The seeds of a time-to-reward stage's repeats: the workload's, then 0, 1, ... if more repeats are asked."""
    seeds = bench.work.seeds
    return list(seeds[: bench.repeats]) if bench.repeats <= len(seeds) else list(range(bench.repeats))


def time_to_reward_stage(
    bench: Bench, stage: str, arm: Arm, start: dict[str, float], title: str
) -> dict[str, list[dict[str, Any]]]:
    """Full runs of best_sync and ``arm`` per seed, then best sync's time to its final held-out reward over
    ``arm``'s time to the same reward from the warm start's ``start`` evaluation, kept as ``bench.extra[stage]``;
    the runs by arm."""
    best = require_best_sync(bench)
    runs = full_runs(
        bench,
        stage,
        {"best_sync": best, arm.name: arm},
        f"Full runs, {title} vs best_sync ({best.name}), one seed per repeat",
    )
    bench.extra[stage] = {
        **time_to_reward(start["eval/reward_mean"], runs["best_sync"], runs[arm.name], arm.name),
        "evals": {name: [run["evals"] for run in found] for name, found in runs.items()},
        "seeds": run_seeds(bench),
    }
    return runs


def stage_time_to_reward(bench: Bench) -> None:
    require_best_sync(bench)
    runs = time_to_reward_stage(bench, "time_to_reward", ASYNC_A2, warm_start_reward(bench), "async α = 2")
    steps = [0, *(e["step"] for e in runs["best_sync"][0]["evals"])]
    curves = bench.extra["time_to_reward"]["mean_curves"]
    bench.extra["table"] = {
        "title": "Held-out reward against training wall-clock, mean over seeds (time to reward is read off these)",
        "columns": ["step", "best_sync s", "best_sync reward", "async_a2 s", "async_a2 reward"],
        "rows": [
            [step, *curves["best_sync"][i], *curves["async_a2"][i]]
            for i, step in enumerate(steps[: min(len(curves["best_sync"]), len(curves["async_a2"]))])
        ],
    }


def stage_partial_time_to_reward(bench: Bench) -> None:
    """Why partial rollout: it is the one async arm the throughput stage found above best_sync (its ``in_flight``
    update does not wait for the longest response in flight, ``async``'s ``drain`` does), and samples/s alone
    do not say whether its mid-response weight switches cost reward. Why its own warm-start evaluation: this
    stage may run in a later session on another machine, whose cache holds its own warm-start build (a build
    is not bit-identical across CPUs), so the curves' common start is measured with the arms it starts."""
    require_best_sync(bench)
    work = bench.work
    start = in_child(evaluate_warm_start, tuple(work.overrides()), work.eval_prompts)
    stage = "partial_time_to_reward"
    time_to_reward_stage(bench, stage, PARTIAL_ROLLOUT_A2, start, "partial rollout α = 2")
    bench.extra[stage]["warm_start"] = start


HEADROOM = (0.05, 0.9)
"""The warm start's held-out mean reward must lie in this band for the run to mean anything: below it RL finds
too few right answers to learn from in a hundred steps (nearly every group filtered), above it there is nothing
left to learn. Checked before any arm runs, so a warm start that misses it costs minutes, not the suite."""


def warm_start_reward(bench: Bench) -> dict[str, float]:
    """The warm start evaluated like every snapshot (step 0 of every time-to-reward curve), once per run."""
    if "warm_start" not in bench.extra:
        work = bench.work
        bench.extra["warm_start"] = in_child(evaluate_warm_start, tuple(work.overrides()), work.eval_prompts)
    return bench.extra["warm_start"]


def check_headroom(bench: Bench) -> None:
    """Stop before any arm runs when the warm start leaves RL nothing measurable to do (``HEADROOM``)."""
    reward = warm_start_reward(bench)["eval/reward_mean"]
    if problem := outside_headroom(reward):
        raise SystemExit(
            f"{problem}: the workload's SFT recipe (bench/workloads.py) leaves RL no headroom; fix the recipe "
            "before running any arm"
        )
    low, high = HEADROOM
    print(f"warm start: held-out mean reward {reward:.3f} (headroom band {low}-{high})", flush=True)


def outside_headroom(reward: float) -> str | None:
    """What is wrong with a warm start's held-out mean reward for RL (``HEADROOM``), or None."""
    low, high = HEADROOM
    if low <= reward <= high:
        return None
    return f"the warm start's held-out mean reward is {reward:.3f}, outside the headroom band [{low}, {high}]"


def stage_bound(bench: Bench) -> None:
    """Lone engines and lone trainer for the two placements the headline arms use (best_sync's, async's)."""
    best, work = require_best_sync(bench), bench.work
    layouts = {"best_sync": (best, 2, 2), "async": (ASYNC_A2, 1, 1)}
    """placement name → (arm, cores of its rollout role, cores of its training role)"""
    arms = {}
    for placement, (arm, rollout_cores, train_cores) in layouts.items():
        overrides = bench.overrides(arm)
        groups = str(bench.scratch / f"groups-{placement}.pkl")
        arms[f"bound/engine_alone_{placement}"] = lambda o=overrides, c=rollout_cores, g=groups: in_child(
            lone_engines, o, c, g
        )
        arms[f"bound/trainer_alone_{placement}"] = lambda o=overrides, c=train_cores, g=groups: in_child(
            lone_trainer, o, c, g, 4 if work is QUICK_LONG_TAIL else 6
        )
    bench.run_stage("bound", "Each role alone on exactly its placement's cores", arms, 0)
    bench.extra["memory_per_role_mb"] = memory_per_role(bench.raw)


def memory_per_role(raw: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Peak RSS of each lone role over its process's baseline (imports), and that baseline (the driver's floor)."""
    out = {}
    for name, runs in raw.items():
        if name.startswith("bound/"):
            out[name.removeprefix("bound/")] = harness.summary(
                [r["peak_rss_mb"] - r["baseline_rss_mb"] for r in runs]
            )
            out["process_baseline"] = harness.summary([r["baseline_rss_mb"] for r in runs])
    return out


def bounds(bench: Bench) -> dict[str, Any]:
    """Per arm that ran beside best_sync with the async placement: per paired repeat, the best step the lone
    roles allow, the bound (best_sync's measured step over it) and the arm's fraction of it (that best step
    over the arm's measured step). best_sync's own fraction: its lone generation plus lone training over its
    measured step."""
    raw, n = bench.raw, bench.work.samples_per_step
    if "bound/engine_alone_async" not in raw:
        return {}
    out: dict[str, Any] = {}
    for stage in ("throughput", "time_to_reward"):
        base = f"{stage}/best_sync"
        if base not in raw:
            continue
        sync_best = [
            r["generated_tokens_per_step"] / e["tokens_per_s"]
            + r["trained_tokens_per_step"] / t["trained_tokens_per_s"]
            for r, e, t in zip(
                raw[base],
                raw["bound/engine_alone_best_sync"],
                raw["bound/trainer_alone_best_sync"],
                strict=False,
            )
        ]
        out[base] = {
            "best_step_s": harness.summary(sync_best),
            "fraction_of_bound": harness.summary(
                [b / r["step_s"] for b, r in zip(sync_best, raw[base], strict=False)]
            ),
            "engine_rate_of_lone": engine_rate_of_lone(raw[base], raw["bound/engine_alone_best_sync"]),
        }
        for name in raw:
            if not name.startswith(f"{stage}/") or name == base:
                continue
            best_steps, bound, fraction = [], [], []
            for r, s, e, t in zip(
                raw[name],
                raw[base],
                raw["bound/engine_alone_async"],
                raw["bound/trainer_alone_async"],
                strict=False,
            ):
                best = max(
                    r["generated_tokens_per_step"] / e["tokens_per_s"],
                    r["trained_tokens_per_step"] / t["trained_tokens_per_s"],
                )
                best_steps.append(best)
                bound.append((n / s["samples_per_s"]) / best)
                fraction.append(best / r["step_s"])
            out[name] = {
                "best_step_s": harness.summary(best_steps),
                "bound_over_best_sync": harness.summary(bound),
                "fraction_of_bound": harness.summary(fraction),
                "engine_rate_of_lone": engine_rate_of_lone(raw[name], raw["bound/engine_alone_async"]),
            }
    return out


def engine_rate_of_lone(runs: list[dict[str, float]], lone: list[dict[str, float]]) -> dict[str, Any]:
    """Per paired repeat, the tokens the arm's engines generated per second they were busy, over the lone
    engines' saturated rate. Why: an arm short of its bound is either an engine idle part of the step
    (``engine_busy_fraction``) or one that generates slower than it can while busy (a batch below its slots,
    or a core shared with the trainer): this tells the two apart."""
    return harness.summary(
        [
            r["generated_tokens_per_step"] / (r["step_s"] * r["engine_busy_fraction"]) / e["tokens_per_s"]
            for r, e in zip(runs, lone, strict=False)
        ]
    )


def stage_curve(bench: Bench) -> None:
    """Every curve point, the result written after each (the whole curve took two hours on one machine): a
    stopped run continued with ``--extend`` keeps the points it measured, skipped ones included, and
    measures the rest. Each point records the commit and CPU it ran on (``point_provenance``)."""
    best = require_best_sync(bench)
    steps = bench.work.measured_steps
    earlier = bench.studies.get("curve", {})
    names, skipped = list(earlier.get("points", [])), dict(earlier.get("skipped", {}))
    provenance = dict(earlier.get("point_provenance", {}))
    spent, started = earlier.get("wall_s", 0.0), time.perf_counter()

    def record(finished: bool) -> None:
        bench.studies["curve"] = {
            "title": "async α = 2 over best_sync as the tail, the group size and the engines grow",
            "points": names,
            "steps": steps,
            "wall_s": spent + time.perf_counter() - started,
            "command": "python bench/long_tail.py --stages curve",
            "repeats_note": f"{bench.repeats} interleaved repeats per arm at each point, median (min–max)",
            "skipped": skipped,
            "point_provenance": provenance,
            "finished": finished,
            **stage_provenance(bench.work),
        }

    for point in curve_points(bench.work, bench.work is QUICK_LONG_TAIL):
        if point.name in skipped or point.name in provenance:
            continue  # measured (or skipped) before a stop
        if reason := curve_point_without_headroom(bench, point):
            print(f"curve/{point.name}: skipped, {reason}", flush=True)
            skipped[point.name] = reason
        else:
            arms = {
                f"curve/{point.name}/{arm}": bench.steady_arm(
                    f"curve/{point.name}/{arm}", bench.overrides(source, point), steps
                )
                for arm, source in (("best_sync", best), ("async_a2", ASYNC_A2))
            }
            bench.raw |= harness.run_arms(arms, bench.repeats, harness.print_run)
            names += list(arms)
            provenance[point.name] = stage_provenance(bench.work)
        record(finished=False)
        bench.checkpoint()
    record(finished=True)


def curve_point_without_headroom(bench: Bench, point: CurvePoint) -> str | None:
    """Why a curve point cannot be measured, or None. Where a point changes the task, the warm start's held-out
    reward there must be inside ``HEADROOM`` as the workload's is: outside it the zero-variance filter drops
    (nearly) every group and a step waits for groups that never come. At σ = 0 every list has the median
    length, which this warm start never copies right (reward 0.0 on 64 held-out prompts, 2026-11-27), and the
    point's first run had not ended after a quarter of an hour. (The quick twin has no headroom by design.)"""
    if bench.work is QUICK_LONG_TAIL or not any(o.startswith("task.") for o in point.overrides):
        return None
    work = bench.work
    evaluated = in_child(evaluate_warm_start, (*work.overrides(), *point.overrides), work.eval_prompts)
    bench.extra.setdefault("curve_warm_start", {})[point.name] = evaluated
    return outside_headroom(evaluated["eval/reward_mean"])


def require_best_sync(bench: Bench) -> Arm:
    if bench.best_sync is None:
        raise SystemExit("no best_sync: run the sweep stage first, or name one with --best-sync")
    return bench.best_sync


def derive_ratios(bench: Bench) -> dict[str, dict[str, Any]]:
    """Every ratio of the result, from the measured runs alone (so a continued run re-derives its loaded
    stages' with the same code): each arm over its stage's best sync, per paired repeat, in samples/s (and
    tokens/s at steady state); and best sync's time to its final held-out reward over async's, per seed."""
    raw, out = bench.raw, {}

    def over(numerator: str, denominator: str, metric: str = "samples_per_s") -> None:
        suffix = "" if metric == "samples_per_s" else f"_{metric}"
        key = f"{numerator.replace('/', '_')}_over_{denominator.split('/')[-1]}{suffix}"
        out[key] = harness.paired_ratio(raw, numerator, denominator, metric)

    best_of_sweep = sweep_choice(bench)["name"] if any(n.startswith("sweep/") for n in raw) else None
    for name in raw:
        stage, _, arm = name.partition("/")
        if stage == "sweep" and best_of_sweep and arm != best_of_sweep:
            over(name, f"sweep/{best_of_sweep}")
        elif stage == "throughput" and arm != "best_sync":
            over(name, "throughput/best_sync")
            over(name, "throughput/best_sync", "tokens_per_s")
        elif stage == "curve" and arm.endswith("/async_a2"):
            over(name, name.removesuffix("async_a2") + "best_sync")
            if arm.removesuffix("/async_a2") in LAYOUT_POINTS:
                out |= over_best_curve_sync(raw, name)
    for stage, arm in TIME_TO_REWARD_STAGES:
        if f"{stage}/{arm}" in raw:
            out[f"{stage}_samples_per_s_{arm}_over_best_sync"] = harness.paired_ratio(
                raw, f"{stage}/{arm}", f"{stage}/best_sync", "samples_per_s"
            )
        measured = bench.extra.get(stage)
        if measured:
            out[f"{stage}_{arm}_over_best_sync"] = harness.time_to_reward_ratio(
                "best_sync",
                arm,
                "time to best_sync's final held-out reward: the seed-mean curves' ratio, every seed beside it "
                "(a censored seed never reached it: its ratio is an upper bound)",
                [seed_times(seed) for seed in measured["per_seed"]],
                seed_times(measured["mean_over_seeds"]),
            )
    return out


LAYOUT_POINTS = ("engines2",)
"""Curve points that change only how the cores are used, not the work: their best sync is the better of their
own sync and the workload point's (the same work), not their own layout's sync alone."""


def over_best_curve_sync(raw: dict[str, list[dict[str, float]]], name: str) -> dict[str, dict[str, Any]]:
    """A layout point's async arm over the best sync of the same work in the curve (its own layout's sync or the
    workload point's, by the paired ratio). Why: two engines once showed async 1.34× over a two-engine sync,
    while the one-engine sync of the same curve, the better sync there, put it at 0.93×. The two points ran one
    after the other (repeat i with repeat i), not interleaved, so the pairing is looser than within a point."""
    point_sync = name.removesuffix("async_a2") + "best_sync"
    syncs = [sync for sync in (point_sync, "curve/workload/best_sync") if sync in raw]
    best = harness.best_by_paired_ratio(raw, syncs)["name"]
    key = f"{name.replace('/', '_')}_over_best_curve_sync"
    return {key: harness.paired_ratio(raw, name, best, "samples_per_s")}


STAGE_FUNCTIONS = {
    "sweep": stage_sweep,
    "bound": stage_bound,
    "throughput": stage_throughput,
    "time_to_reward": stage_time_to_reward,
    "curve": stage_curve,
    "partial_time_to_reward": stage_partial_time_to_reward,
}


def resources(bench: Bench) -> dict[str, Any]:
    """How each kind of arm split the cores, from the runtime's planner."""
    from asyncrl.config.run import load_run_config

    arms = {arm.name: arm for arm in (*SWEEP, *ASYNC_ARMS)}
    work_overrides = [o for o in bench.work.run if not o.startswith("model.path")]
    return {
        name: harness.placement(
            load_run_config(None, [*work_overrides, *arm.config_overrides(bench.work.prompts_per_step)])
        )
        for name, arm in arms.items()
    } | {
        "every arm": "runtime.type=inline: one process, a thread per role, each run in a fresh process",
        "bound": "lone roles pinned (sched_setaffinity) to the cores their placement gives them",
    }


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "long_tail")
    parser.add_argument(
        "--stages", nargs="*", default=list(STAGES), choices=STAGES, help="run in the order given"
    )
    parser.add_argument(
        "--best-sync", choices=[a.name for a in SWEEP], help="best_sync when the sweep is not run"
    )
    parser.add_argument(
        "--extend",
        metavar="RESULT",
        help="continue a stopped run: keep RESULT's stages (measured on the same code and workload) and run "
        "only the --stages it lacks",
    )
    parser.add_argument(
        "--rederive",
        metavar="RESULT",
        help="derive RESULT's ratios and time to reward again from its stored runs, re-running nothing",
    )
    args = parser.parse_args()
    if args.rederive:
        rederive(Path(args.rederive))
        return
    work = QUICK_LONG_TAIL if args.quick else LONG_TAIL
    with tempfile.TemporaryDirectory(prefix="long-tail-") as tmp:
        bench = Bench(work, harness.repeats_for(args), Path(tmp), len(os.sched_getaffinity(0)))
        done: list[str] = load_stopped_run(bench, Path(args.extend), args.quick) if args.extend else []
        if args.best_sync:
            bench.best_sync = next(a for a in SWEEP if a.name == args.best_sync)
        if not args.quick:  # the quick twin's 30-step warm start has no headroom by design
            check_headroom(bench)
        if args.extend and set(done) >= set(args.stages):  # nothing left to run: re-derive and rewrite
            write(args, bench, done)
        for stage in dict.fromkeys(args.stages):
            if stage in done:
                continue
            bench.checkpoint = lambda: write(args, bench, done)  # a stage's parts, before it is done
            STAGE_FUNCTIONS[stage](bench)
            done.append(stage)
            write(args, bench, done)


MEASURED_CODE = measured_code(registry.by_result("long_tail"))
"""What a stage's numbers depend on besides this script's stage code: a stopped run is continued only where
none of it changed since the run's commit (``run_all --continue`` keeps a result by the same rule)."""


def stage_provenance(work: RLWorkload) -> dict[str, str]:
    """The commit, command, CPU and warm start a stage ran at: a continued run's stages may come from two
    commits and, a session later, from another machine with its own warm-start build (a stage's ratios are
    paired within it; across stages they are not)."""
    return {
        "commit": harness.run_commit(),
        "run_command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpu_model": harness.cpu_model(),
        "warm_start_sha256": warm_start_digest(work),
    }


@functools.cache
def warm_start_digest(work: RLWorkload) -> str:
    """The sha256 of the warm start's weights. Why: the build is cached per machine and is not bit-identical
    across CPUs (the same recipe gave held-out rewards 0.166 on an AMD EPYC and 0.188 on an Intel Xeon), so
    results measured on two builds say which build each used. Once per process: the build does not change
    while it runs."""
    digest = hashlib.sha256()
    with open(work.warm_start.build() / "model.safetensors", "rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_stopped_run(bench: Bench, path: Path, quick: bool) -> list[str]:
    """Load a stopped run's stages into ``bench`` (every repeat of every arm, studies, timelines, the warm
    start's evaluation, best_sync; its ratios are derived again from these) and return them; refuse one
    measured on other code or another workload."""
    result = json.loads(path.read_text())
    commit = result["commit"]
    if result["quick"] != quick:
        raise SystemExit(f"{path} is {'a --quick' if result['quick'] else 'a full'} run: extend it in kind")
    setup = {k: v for k, v in result["setup"].items() if k != "stages"}
    if setup != {k: v for k, v in json.loads(json.dumps(run_setup(bench.work, []))).items() if k != "stages"}:
        raise SystemExit(
            f"{path} was measured on another workload (its setup differs from bench/workloads.py)"
        )
    changed = code_changes_since(commit, MEASURED_CODE)
    if changed != []:
        raise SystemExit(
            f"{path} was measured at {commit}; the measured code ({', '.join(MEASURED_CODE)}) differs from it "
            f"now ({' '.join(changed) if changed else 'uncommitted changes then, or an unknown commit'}): re-run"
        )
    load_measurements(bench, result)
    print(f"continuing {path} (stages {', '.join(result['setup']['stages'])} at {commit})", flush=True)
    return list(result["setup"]["stages"])


def load_measurements(bench: Bench, result: dict[str, Any]) -> None:
    """A result's measurements into ``bench``: every repeat of every arm, studies (labelled with the commit,
    command and CPU they ran at), timelines, the warm start's evaluation, the time-to-reward runs, best_sync."""
    commit = result["commit"]
    for arm, metrics in result["arms"].items():
        repeats = len(next(iter(metrics.values()))["runs"])
        bench.raw[arm] = [{m: stats["runs"][i] for m, stats in metrics.items()} for i in range(repeats)]
    bench.timelines |= result["timelines"]
    for name, study in result["studies"].items():
        stopped_at = {
            "commit": commit,
            "run_command": result["command"],
            "cpu_model": result["machine"]["cpu_model"],
        }
        bench.studies[name] = stopped_at | study
    bench.extra |= {
        k: result[k]
        for k in (
            "warm_start",
            "memory_per_role_mb",
            "time_to_reward",
            "table",
            "curve_warm_start",
            "partial_time_to_reward",
        )
        if k in result
    }
    if result.get("best_sync"):
        bench.best_sync = next(a for a in SWEEP if a.name == result["best_sync"]["name"])


TIME_TO_REWARD_STAGES = (
    ("time_to_reward", ASYNC_A2.name),
    ("partial_time_to_reward", PARTIAL_ROLLOUT_A2.name),
)
"""Each time-to-reward stage and the async arm it runs beside best_sync."""


def rederive(path: Path) -> None:
    """Rewrite ``path``'s derived numbers (time to reward per seed and on the seed-mean curves, every ratio)
    from the measurements it stores, with today's derivation; nothing is re-run, so the measurements, their
    commit and command stay as they were and ``rederived`` names the commit whose code derived them."""
    result = json.loads(path.read_text())
    work = QUICK_LONG_TAIL if result["quick"] else LONG_TAIL
    bench = Bench(work, result["repeats"], path.parent, result["machine"]["cores"])
    load_measurements(bench, result)
    for stage, arm in TIME_TO_REWARD_STAGES:
        if stage in bench.extra:
            start = bench.extra[stage].get("warm_start", bench.extra["warm_start"])["eval/reward_mean"]
            runs = {
                name: [{"evals": evals} for evals in found]
                for name, found in bench.extra[stage]["evals"].items()
            }
            result[stage] |= time_to_reward(start, runs["best_sync"], runs[arm], arm)
    result["ratios"] = derive_ratios(bench)
    result["best_sync"] = best_sync_record(bench)
    result["rederived"] = {
        "commit": harness.run_commit(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "what": "ratios and time-to-reward records derived again from the stored runs; nothing re-measured",
    }
    path.write_text(json.dumps(result, indent=1) + "\n")


def run_setup(work: RLWorkload, stages: list[str]) -> dict[str, Any]:
    """The workload as a result records it (and a continued run checks it against)."""
    return {
        **{k: v for k, v in dataclasses.asdict(work).items() if k != "warm_start"},
        "warm_start": {"command": " ".join(["asyncrl sft", *work.warm_start.sft])},
        "stages": stages,
    }


def best_sync_record(bench: Bench) -> dict[str, Any] | None:
    """The sync every later stage ran beside, and the sweep's choice by the paired ratio. Where they differ (a
    result whose stages ran under the earlier rule, the highest median), the record says by how much the
    stages' divisor trails the sweep's best: their async-vs-best-sync ratios are that much too kind to async."""
    best = bench.best_sync
    if best is None:
        return None
    record: dict[str, Any] = {"name": best.name, "overrides": list(best.overrides)}
    if not any(name.startswith("sweep/") for name in bench.raw):
        return record | {"chosen_by": "named with --best-sync"}
    choice = sweep_choice(bench)
    if choice["name"] == best.name:
        return record | choice
    behind = harness.paired_ratio(bench.raw, f"sweep/{best.name}", f"sweep/{choice['name']}", "samples_per_s")
    return record | {
        "chosen_by": "highest median samples_per_s in the sweep (the rule when the later stages ran)",
        "by_paired_ratio": choice,
        "ran_beside_over_best_of_sweep": behind,
    }


def write(args: argparse.Namespace, bench: Bench, stages: list[str]) -> None:
    """The result of the stages done so far: written after each stage, so hours of measurement survive a run
    that is stopped before its last stage (``setup.stages`` says which ran)."""
    harness.write_result(
        args,
        "long_tail",
        bench.raw,
        ratios=derive_ratios(bench),
        resources=resources(bench),
        setup=run_setup(bench.work, stages),
        extra={
            "studies": bench.studies,
            "best_sync": best_sync_record(bench),
            "bound": bounds(bench),
            **bench.extra,
            "timelines": bench.timelines,
            # the stages' own wall-clock: a continued run's stages ran in several invocations
            "run_wall_s": sum(study["wall_s"] for study in bench.studies.values()),
        },
    )


if __name__ == "__main__":
    main()
