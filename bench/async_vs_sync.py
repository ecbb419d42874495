"""Benchmark: every paradigm on the same long-tailed RLVR workload and the same 2 cores, against Proposition 2.

Each variant trains the same model on the same prompts (the shipped ``tiny-count`` checkpoint and its task: response
lengths follow the task's log-normal list lengths, so a few responses are many times the median) with the same
batch, through the real runtime (``runtime.type=local``: the trainer and the engine are Ray actors). ``sync``
colocates them on both cores behind a barrier; the other modes give rollout and training one core each. An
``inline`` run of ``async`` (one process, threads) is added as a control, and so are two ``sync`` runs with
one thread per role (``runtime.colocate=never``): on a machine other jobs load, two torch threads per process
oversubscribe the cores and slow the colocated ``sync`` far more than the one-thread async roles, which
would inflate every speedup; the one-thread sync isolates what asynchrony itself buys.

Throughput is measured at steady state: the first ``--warmup`` steps (actor start-up, admission filling the
window) are skipped, and trained samples (tokens) are divided by the wall time of the remaining steps.

Proposition 2 of the ROLL Flash report bounds the speedup of an asynchronous pipeline over a synchronous one:
``1 + K·L_gen / (N·(μ_gen + E·μ_train))`` (α → ∞), and at a finite α the ratio of its (8) and (11),
``(A + L_gen) / (A + L_gen/(α+1))`` with ``A = N/K·(μ_gen + E·μ_train)``. The inputs are measured on the
naive ``sync`` run (every sample of a step starts at once there, so a sample's engine latency is its
generation time): μ_gen the mean and L_gen the longest generation time per sample, N samples per step,
E = ``trainer.ppo_epochs``, and μ_train such that ``E·N/K·μ_train`` is the measured train-step wall time.
K, the number of Prop. 1 "workers", is the engine's decode slots, ``engine.max_running_requests`` (set to N
here): a continuous-batching engine runs that many samples at once and hands a freed slot to the next
request at the next step, which is exactly queue scheduling over K workers.

    python bench/async_vs_sync.py [--quick] [--out bench/results/async_vs_sync.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

from asyncrl.app.runtimes import assemble_controller, make_proxy, runtime_parts  # noqa: E402
from asyncrl.config.run import RunConfig, load_run_config  # noqa: E402
from asyncrl.controller.controller import StepRecord  # noqa: E402
from asyncrl.rollout.prompt_source import PromptSource  # noqa: E402


@dataclass(frozen=True)
class Variant:
    """One row of the table: a name, the config overrides that make it, and its async ratio."""

    name: str
    overrides: tuple[str, ...]
    async_ratio: float
    runtime: str = "local"


VARIANTS = (
    Variant("sync_batch", ("controller.mode=sync", "rollout.generation=batch"), 0.0),
    Variant("sync_queue", ("controller.mode=sync", "rollout.generation=queue"), 0.0),
    Variant("one_step_off", ("controller.mode=one_step_off", "buffer.async_ratio=1"), 1.0),
    Variant("async_a2", ("controller.mode=async", "buffer.async_ratio=2"), 2.0),
    Variant("partial_rollout_a1", ("controller.mode=partial_rollout", "buffer.async_ratio=1"), 1.0),
    Variant("async_a2_inline", ("controller.mode=async", "buffer.async_ratio=2"), 2.0, runtime="inline"),
    Variant(
        "sync_batch_1thread",
        ("controller.mode=sync", "rollout.generation=batch", "runtime.colocate=never"),
        0.0,
    ),
    Variant(
        "sync_queue_1thread",
        ("controller.mode=sync", "rollout.generation=queue", "runtime.colocate=never"),
        0.0,
    ),
)
BASELINE, QUEUE_BASELINE = "sync_batch", "sync_queue"
CONTROLS = ("sync_batch_1thread", "sync_queue_1thread")
"""Sync with one thread per role (not colocated): immune to the thread oversubscription a loaded machine
inflicts on the colocated 2-thread sync, at the cost of using one core per phase on a quiet one."""


@dataclass(frozen=True)
class Workload:
    """The shape shared by every variant."""

    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    steps: int
    warmup: int

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt


FULL = Workload(prompts_per_step=8, samples_per_prompt=4, max_new_tokens=160, steps=12, warmup=3)
QUICK = Workload(prompts_per_step=4, samples_per_prompt=4, max_new_tokens=96, steps=4, warmup=1)


def run_config(variant: Variant, work: Workload, out: Path) -> RunConfig:
    """The variant's overrides on the shared workload; a small learning rate keeps response lengths (the
    workload) from drifting apart between modes."""
    n = work.samples_per_step
    shared = (
        f"output_dir={out / variant.name}",
        f"controller.num_steps={work.steps}",
        "controller.eval_prompts=0",
        f"rollout.rollout_batch_size={work.prompts_per_step}",
        f"rollout.num_return_sequences={work.samples_per_prompt}",
        f"rollout.max_new_tokens={work.max_new_tokens}",
        f"engine.max_running_requests={n}",
        "engine.max_model_len=256",
        f"engine.max_kv_tokens={n * 256}",
        "trainer.lr=1e-6",
        "model.path=tiny-count",  # count has the longest responses of the built-in tasks (~4 tokens a number)
        "task.type=count",
        "model.device=cpu",
        f"runtime.type={variant.runtime}",
        "runtime.rollout_num_cpus=1",
        "runtime.train_num_cpus=1",
    )
    return load_run_config(None, [*shared, *variant.overrides])


async def train_steps(config: RunConfig) -> list[dict[str, Any]]:
    """Run the config's steps through the real parts; one record per step, timed at the step's end."""
    steps: list[dict[str, Any]] = []
    with runtime_parts(config) as parts:
        source = PromptSource(parts.task.split("train"), seed=config.seed)
        proxy = make_proxy(parts)

        def on_step(record: StepRecord) -> None:
            steps.append(step_record(record, proxy.stats()))

        controller = assemble_controller(parts, proxy, source, on_step)
        await controller.run(config.controller.num_steps)
        proxy.close()
        await settle()
    return steps


async def settle() -> None:
    """Let the tasks ``proxy.close`` cancelled (aborts of surplus requests) finish before the actors are
    killed, so they do not fail noisily at interpreter shutdown."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    await asyncio.gather(*others, return_exceptions=True)


def step_record(record: StepRecord, proxy_stats: dict[str, Any]) -> dict[str, Any]:
    samples = [t for g in record.groups for t in g.trajectories]
    engines = proxy_stats.get("engines", [])
    return {
        "end_s": time.perf_counter(),
        "samples": len(samples),
        "tokens": sum(t.num_response_tokens for t in samples),
        "wait_s": record.wait_s,
        "train_s": record.train_s,
        "sync_s": record.sync_s,
        "max_age": max(record.version - t.start_version for t in samples),
        "latencies_s": [t.timings.get("latency_s", float("nan")) for t in samples],
        "engine_idle": [float(e["idle_fraction"]) for e in engines if "idle_fraction" in e],
    }


def steady_state(steps: list[dict[str, Any]], warmup: int) -> dict[str, float]:
    """Throughput over the steps after ``warmup``, and where their time went (means per step)."""
    kept = steps[warmup:]
    wall = kept[-1]["end_s"] - steps[warmup - 1]["end_s"] if warmup else kept[-1]["end_s"] - kept[0]["end_s"]
    counted = kept if warmup else kept[1:]
    return {
        "steps_measured": len(counted),
        "wall_s": wall,
        "samples_per_s": sum(s["samples"] for s in counted) / wall,
        "tokens_per_s": sum(s["tokens"] for s in counted) / wall,
        "mean_response_tokens": sum(s["tokens"] for s in counted) / sum(s["samples"] for s in counted),
        "wait_s": statistics.fmean(s["wait_s"] for s in counted),
        "train_s": statistics.fmean(s["train_s"] for s in counted),
        "sync_s": statistics.fmean(s["sync_s"] for s in counted),
        "max_staleness": max(s["max_age"] for s in counted),
        "engine_idle_fraction": counted[-1]["engine_idle"][0] if counted[-1]["engine_idle"] else float("nan"),
    }


def proposition2_inputs(steps: list[dict[str, Any]], warmup: int, work: Workload, epochs: int) -> dict:
    """μ_gen, L_gen, μ_train, E, K, N measured on the naive sync run (module docstring)."""
    kept = steps[warmup:]
    latencies = [x for s in kept for x in s["latencies_s"]]
    n = k = work.samples_per_step
    train_s = statistics.fmean(s["train_s"] for s in kept)
    return {
        "mu_gen_s": statistics.fmean(latencies),
        "L_gen_s": max(latencies),
        "mu_train_s": train_s * k / (epochs * n),
        "E": epochs,
        "K": k,
        "N": n,
        "train_step_s": train_s,
    }


def proposition2_bounds(p: dict, async_ratio: float) -> dict[str, float]:
    """The α → ∞ bound ``1 + K·L/(N(μ_gen + E·μ_train))`` and the finite-α bound ``(A + L)/(A + L/(α+1))``."""
    a = p["N"] / p["K"] * (p["mu_gen_s"] + p["E"] * p["mu_train_s"])
    return {
        "bound_alpha_inf": 1 + p["K"] * p["L_gen_s"] / (p["N"] * (p["mu_gen_s"] + p["E"] * p["mu_train_s"])),
        "bound_at_alpha": (a + p["L_gen_s"]) / (a + p["L_gen_s"] / (async_ratio + 1)),
    }


def compare(results: dict[str, dict], variants: tuple[Variant, ...], p2: dict) -> None:
    """Add speedups over both sync baselines and the share of the Proposition 2 bounds reached."""
    base = results[BASELINE]["samples_per_s"]
    queue = results[QUEUE_BASELINE]["samples_per_s"]
    for variant in variants:
        row = results[variant.name]
        row["speedup_vs_sync_batch"] = row["samples_per_s"] / base
        row["speedup_vs_sync_queue"] = row["samples_per_s"] / queue
        for control in CONTROLS:
            if control in results:
                row[f"speedup_vs_{control}"] = row["samples_per_s"] / results[control]["samples_per_s"]
        if variant.async_ratio > 0:
            bounds = proposition2_bounds(p2, variant.async_ratio)
            row |= bounds
            row["fraction_of_bound_alpha_inf"] = row["speedup_vs_sync_batch"] / bounds["bound_alpha_inf"]
            row["fraction_of_bound_at_alpha"] = row["speedup_vs_sync_batch"] / bounds["bound_at_alpha"]


def targets(results: dict[str, dict]) -> dict[str, bool]:
    """The issue's targets, for the variants that ran (the inline row is a control, not a target)."""
    async_rows = {k: v for k, v in results.items() if "bound_at_alpha" in v and not k.endswith("_inline")}
    met = {
        f"{k} >= 80% of bound_at_alpha": v["fraction_of_bound_at_alpha"] >= 0.8 for k, v in async_rows.items()
    }
    if "async_a2" in results:
        met["async_a2 >= 1.5x sync_batch"] = results["async_a2"]["speedup_vs_sync_batch"] >= 1.5
        met["async_a2 >= 1.2x sync_queue"] = results["async_a2"]["speedup_vs_sync_queue"] >= 1.2
    return met


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def run_all(work: Workload, variants: tuple[Variant, ...], out_dir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": machine(), "workload": vars(work) | {"N": work.samples_per_step}}
    results: dict[str, dict] = {}
    raw: dict[str, list] = {}
    for variant in variants:
        config = run_config(variant, work, out_dir)
        started = time.perf_counter()
        raw[variant.name] = asyncio.run(train_steps(config))
        results[variant.name] = steady_state(raw[variant.name], work.warmup) | {
            "total_s": time.perf_counter() - started,
            "async_ratio": variant.async_ratio,
            "runtime": variant.runtime,
        }
        print(variant.name, json.dumps(results[variant.name]), flush=True)
    report["results"] = results
    if BASELINE in results and QUEUE_BASELINE in results:
        epochs = config.trainer.ppo_epochs
        report["proposition2"] = proposition2_inputs(raw[BASELINE], work.warmup, work, epochs)
        compare(results, variants, report["proposition2"])
        report["targets_met"] = targets(results)
    report["load_average_at_end"] = os.getloadavg()
    report["per_step"] = {name: [strip(s) for s in steps] for name, steps in raw.items()}
    return report


def strip(step: dict[str, Any]) -> dict[str, Any]:
    """A step without its per-sample latencies and absolute clock, for the JSON file."""
    return {k: v for k, v in step.items() if k not in ("latencies_s", "end_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 steps of 16 samples")
    parser.add_argument("--out", default="bench/results/async_vs_sync.json")
    parser.add_argument(
        "--only", nargs="*", help="variant names to run (comparisons need both sync baselines)"
    )
    args = parser.parse_args()
    work = QUICK if args.quick else FULL
    chosen = tuple(v for v in VARIANTS if not args.only or v.name in args.only)
    with tempfile.TemporaryDirectory(prefix="async-vs-sync-") as tmp:
        report = run_all(work, chosen, Path(tmp))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report.get(k) for k in ("proposition2", "targets_met")}, indent=1))


if __name__ == "__main__":
    main()
