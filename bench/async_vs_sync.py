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

    python bench/async_vs_sync.py [--quick] [--repeats 3] [--only NAME ...] [--out bench/results/async_vs_sync.json]
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


from asyncrl.app.runtimes import assemble_controller, make_proxy, runtime_parts  # noqa: E402
from asyncrl.config.run import RunConfig, load_run_config  # noqa: E402
from asyncrl.controller.controller import StepRecord  # noqa: E402
from asyncrl.rollout.prompt_source import PromptSource  # noqa: E402
from asyncrl.runtime.placement import plan_placement  # noqa: E402
from bench import harness  # noqa: E402


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
QUICK_VARIANTS = ("sync_batch", "sync_queue", "async_a2")
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


def step_metrics(steps: list[dict[str, Any]], work: Workload, epochs: int, with_p2: bool) -> dict[str, float]:
    """One run's steady-state numbers; the naive sync run also carries the Proposition 2 inputs."""
    metrics = steady_state(steps, work.warmup)
    if with_p2:
        metrics |= {f"p2_{k}": v for k, v in proposition2_inputs(steps, work.warmup, work, epochs).items()}
    return metrics


def arm(variant: Variant, work: Workload, out_dir: Path):
    """A harness arm: one full run of ``variant`` (a fresh output dir each time)."""
    runs = [0]

    def run() -> dict[str, float]:
        runs[0] += 1
        config = run_config(variant, work, out_dir / f"r{runs[0]}")
        started = time.perf_counter()
        steps = asyncio.run(train_steps(config))
        metrics = step_metrics(steps, work, config.trainer.ppo_epochs, variant.name == BASELINE)
        return metrics | {"total_s": time.perf_counter() - started}

    return run


def bound_fractions(raw: dict[str, list[dict[str, float]]], variant: Variant) -> dict[str, Any]:
    """Per paired repeat: the Prop. 2 bound at the variant's α (from that repeat's naive sync run) and the
    share of it the variant's measured speedup reached. Above 1 is a bug in the bound or the measurement."""
    fractions, bounds = [], []
    for base, row in zip(raw[BASELINE], raw[variant.name], strict=True):
        p2 = {k.removeprefix("p2_"): v for k, v in base.items() if k.startswith("p2_")}
        bound = proposition2_bounds(p2, variant.async_ratio)["bound_at_alpha"]
        bounds.append(bound)
        fractions.append(row["samples_per_s"] / base["samples_per_s"] / bound)
    return {
        "bound_at_alpha": harness.summary(bounds),
        "fraction_of_bound_at_alpha": harness.summary(fractions),
    }


def targets(ratios: dict[str, dict], bounds: dict[str, dict]) -> dict[str, bool]:
    """The issue's targets on medians over paired repeats (controls and the inline row are not targets)."""
    met = {
        f"{name} within 70-100% of bound_at_alpha": 0.7 <= b["fraction_of_bound_at_alpha"]["median"] <= 1.0
        for name, b in bounds.items()
        if not name.endswith("_inline")
    }
    if "async_a2_over_sync_batch" in ratios:
        met["async_a2 >= 2.0x sync_batch"] = ratios["async_a2_over_sync_batch"]["median"] >= 2.0
        met["async_a2 >= 1.3x sync_queue"] = ratios["async_a2_over_sync_queue"]["median"] >= 1.3
    return met


def resources(variants: tuple[Variant, ...], work: Workload) -> dict[str, Any]:
    """How each variant split the cores (placement as the runtime plans it)."""
    out = {}
    for variant in variants:
        config = run_config(variant, work, Path("unused"))
        plan = plan_placement(
            config.runtime, num_engines=config.rollout.num_engines, mode=config.controller.mode
        )
        out[variant.name] = {"runtime": variant.runtime, **plan.describe()}
    return out


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "async_vs_sync")
    parser.add_argument(
        "--only", nargs="*", help="variant names to run (comparisons need both sync baselines)"
    )
    args = parser.parse_args()
    work = QUICK if args.quick else FULL
    names = args.only or (QUICK_VARIANTS if args.quick else [v.name for v in VARIANTS])
    chosen = tuple(v for v in VARIANTS if v.name in names)
    if args.quick:  # seconds: one process, no Ray start-up per run
        chosen = tuple(dataclasses.replace(v, runtime="inline") for v in chosen)
    with tempfile.TemporaryDirectory(prefix="async-vs-sync-") as tmp:
        arms = {v.name: arm(v, work, Path(tmp) / v.name) for v in chosen}
        raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
    ratios, bounds = {}, {}
    if BASELINE in raw and QUEUE_BASELINE in raw:
        for variant in chosen:
            for base in (BASELINE, QUEUE_BASELINE, *CONTROLS):
                if base in raw and base != variant.name:
                    ratios[f"{variant.name}_over_{base}"] = harness.paired_ratio(
                        raw, variant.name, base, "samples_per_s"
                    )
            if variant.async_ratio > 0:
                bounds[variant.name] = bound_fractions(raw, variant)
    setup = vars(work) | {"N": work.samples_per_step, "workload": "training_bound (tiny-count on count)"}
    extra = {"proposition2": bounds, "targets_met": targets(ratios, bounds)}
    harness.write_result(
        args, "async_vs_sync", raw, ratios=ratios, resources=resources(chosen, work), setup=setup, extra=extra
    )


if __name__ == "__main__":
    main()
