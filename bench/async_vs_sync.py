"""Benchmark: every paradigm on the same long-tailed RLVR workload and the same 2 cores, against a resource ceiling.

Each variant trains the same model on the same prompts (the shipped ``tiny-count`` checkpoint and its task: response
lengths follow the task's log-normal list lengths, so a few responses are many times the median) with the same
batch, through the real runtime (``runtime.type=local``: the trainer and the engine are Ray actors). ``sync``
colocates them on both cores behind a barrier; the other modes give rollout and training one core each. The
same ``async`` in one process (``runtime.type=inline``: engine and trainer threads, one torch thread each) is
run beside it with its own two syncs (``sync_batch_inline``, ``sync_queue_inline``): the runtime without a
driver process and Ray calls between the roles. Syncs with one thread per role (``runtime.colocate=never``,
on Ray and inline) are tried too: on a machine other jobs load, two torch threads per process oversubscribe
the cores and slow the colocated ``sync``. Every sync arm runs on the same 2 cores, and every ratio divides by
the best of them (``best_sync``: by the paired ratio of samples/s, ``harness.best_by_paired_ratio``), per
paired repeat.

Throughput is measured at steady state: the first ``--warmup`` steps (actor start-up, admission filling the
window) are skipped, and trained samples (tokens) are divided by the wall time of the remaining steps.

Two workloads (``--workload``), each its own result file: ``generation_bound`` (the default and the headline)
filters groups for signal (``rollout.filter=zero_variance``, DAPO's dynamic sampling) in every arm, so a step
generates several times what it trains; the engine has K = 2N decode slots, and ``sync_queue`` keeps
redundant prompts in flight so a filtered group is replaced at once, as ROLL Flash's tuned sync baseline
does (``sync_batch`` generates its batch, filters, then generates the missing groups in another round).
``training_bound`` trains every group (K = N): there generation takes only ~2x training and queue and batch
scheduling cannot differ.

Each async arm is checked against a **resource ceiling** measured apart from it: with one core per role an
async step can be no shorter than the engine needs to generate the step's samples with every decode slot
busy on its one core (the ``engine_saturated_1thread`` arm: the bare engine fed more requests than it has
slots) nor than the trainer needs on its one core with nothing beside it (the train step of the one-thread
sync on the arm's own runtime: ``sync_batch_1thread`` on Ray, ``sync_batch_inline_1thread`` in one process).
The best sync's step over the larger of the two is the most the arm can gain; the target is 70–100 % of it,
and a result above it means the measurement is wrong.

Proposition 2 of the ROLL Flash report is computed beside it, as published, and is not a target here:
``1 + K·L_gen / (N·(μ_gen + E·μ_train))`` (α → ∞), and at a finite α the ratio of its (8) and (11),
``(A + L_gen) / (A + L_gen/(α+1))`` with ``A = N/K·(μ_gen + E·μ_train)``, with μ_gen, L_gen (mean and
longest generation time per sample), μ_train measured on the
naive ``sync`` run and K = ``engine.max_running_requests``. Measured speedups landed above it in the first
harness run (the training-bound table in docs/benchmarks.md), and the bound is
what is wrong, not the measurement: (8) and (11) are both *upper* bounds on completion time, so their ratio
bounds nothing; and its model is K workers that each generate at a fixed speed, while here one
continuous-batching engine is the K "workers" and its per-step cost grows with how many slots are busy, so
the latencies measured in sync (where occupancy falls through the tail) are not per-worker constants and a
full engine in async generates a sample in less core time than sync's tail does.

    python bench/async_vs_sync.py [--quick] [--workload generation_bound|training_bound] [--repeats 3]
        [--only NAME ...] [--out bench/results/async_vs_sync.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/async_vs_sync.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import dataclasses
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


from asyncrl.app.runtimes import assemble_controller, make_proxy, runtime_parts  # noqa: E402
from asyncrl.config.run import RunConfig, load_run_config  # noqa: E402
from asyncrl.controller.controller import StepRecord  # noqa: E402
from asyncrl.data.base import prompt_token_ids  # noqa: E402
from asyncrl.data.registry import make_task  # noqa: E402
from asyncrl.engine import make_engine  # noqa: E402
from asyncrl.models.loading import load_model_and_tokenizer  # noqa: E402
from asyncrl.rollout.prompt_source import PromptSource  # noqa: E402
from asyncrl.rollout.rlvr_producer import request_seed, sampling_params  # noqa: E402
from asyncrl.types import Request  # noqa: E402
from bench import cpu_use, harness  # noqa: E402
from bench.engine import on_fresh_thread  # noqa: E402


@dataclass(frozen=True)
class Variant:
    """One row of the table: a name, the config overrides that make it, and its async ratio."""

    name: str
    overrides: tuple[str, ...]
    async_ratio: float
    runtime: str = "local"
    redundant_prompts: bool = False
    """Keeps the workload's ``queue_redundancy`` extra prompts in flight (the queue-scheduled sync arms)."""


VARIANTS = (
    Variant("sync_batch", ("controller.mode=sync", "rollout.generation=batch"), 0.0),
    Variant("sync_queue", ("controller.mode=sync", "rollout.generation=queue"), 0.0, redundant_prompts=True),
    Variant("one_step_off", ("controller.mode=one_step_off", "buffer.async_ratio=1"), 1.0),
    Variant("async_a2", ("controller.mode=async", "buffer.async_ratio=2"), 2.0),
    Variant("partial_rollout_a1", ("controller.mode=partial_rollout", "buffer.async_ratio=1"), 1.0),
    Variant("async_a2_inline", ("controller.mode=async", "buffer.async_ratio=2"), 2.0, runtime="inline"),
    Variant("sync_batch_inline", ("controller.mode=sync", "rollout.generation=batch"), 0.0, runtime="inline"),
    Variant(
        "sync_queue_inline",
        ("controller.mode=sync", "rollout.generation=queue"),
        0.0,
        runtime="inline",
        redundant_prompts=True,
    ),
    Variant(
        "sync_batch_1thread",
        ("controller.mode=sync", "rollout.generation=batch", "runtime.colocate=never"),
        0.0,
    ),
    Variant(
        "sync_queue_1thread",
        ("controller.mode=sync", "rollout.generation=queue", "runtime.colocate=never"),
        0.0,
        redundant_prompts=True,
    ),
    Variant(
        "sync_batch_inline_1thread",
        ("controller.mode=sync", "rollout.generation=batch", "runtime.colocate=never"),
        0.0,
        runtime="inline",
    ),
)
BASELINE = "sync_batch"
"""Naive sync: Proposition 2's inputs are measured on it (module docstring)."""
QUICK_VARIANTS = ("sync_batch", "sync_queue", "async_a2", "sync_batch_1thread")
LONE_TRAINERS = {"local": "sync_batch_1thread", "inline": "sync_batch_inline_1thread"}
"""Per runtime, the sync arm whose one-thread trainer step (nothing computing beside it) is the trainer side of
that runtime's async arms' resource ceiling."""


@dataclass(frozen=True)
class Workload:
    """The shape shared by every variant."""

    name: str
    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    steps: int
    warmup: int
    group_filter: str = "none"
    """``rollout.filter`` of every arm: ``zero_variance`` trains only groups whose rewards differ (DAPO's
    dynamic sampling), so a step needs several times its batch generated."""
    slots_per_sample: int = 1
    """The engine's decode slots K as a multiple of the N samples a step trains."""
    queue_redundancy: int = 0
    """Extra prompts ``sync_queue`` keeps in flight (``rollout.max_additional_running_prompts``), so a filtered
    group is replaced without a second round: queue scheduling as ROLL Flash's tuned sync baseline runs it."""

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def slots(self) -> int:
        return self.slots_per_sample * self.samples_per_step


WORKLOADS = {
    "generation_bound": Workload(
        name="generation_bound",
        prompts_per_step=8,
        samples_per_prompt=4,
        max_new_tokens=160,
        steps=12,
        warmup=3,
        group_filter="zero_variance",
        slots_per_sample=2,
        queue_redundancy=4,
    ),
    "training_bound": Workload(
        name="training_bound",
        prompts_per_step=8,
        samples_per_prompt=4,
        max_new_tokens=160,
        steps=12,
        warmup=3,
    ),
}
"""``generation_bound`` (the headline): the shipped model already answers most ``count`` prompts all right
or all wrong, so with groups filtered for signal a sync step generates ~4x the samples it trains, and its
generation takes ~4x its training. ``training_bound``: every group trained; generation takes ~2x training
and asynchrony has less to hide."""
QUICK = dataclasses.replace(
    WORKLOADS["generation_bound"], name="quick", prompts_per_step=4, max_new_tokens=96, steps=4, warmup=1
)


def run_config(variant: Variant, work: Workload, out: Path) -> RunConfig:
    """The variant's overrides on the shared workload; a small learning rate keeps response lengths (the
    workload) from drifting apart between modes."""
    queue_only = (
        (f"rollout.max_additional_running_prompts={work.queue_redundancy}",)
        if variant.redundant_prompts
        else ()
    )
    shared = (
        f"output_dir={out / variant.name}",
        f"controller.num_steps={work.steps}",
        "controller.eval_prompts=0",
        f"rollout.rollout_batch_size={work.prompts_per_step}",
        f"rollout.num_return_sequences={work.samples_per_prompt}",
        f"rollout.max_new_tokens={work.max_new_tokens}",
        f"rollout.filter={work.group_filter}",
        f"engine.max_running_requests={work.slots}",
        "engine.max_model_len=256",
        f"engine.max_kv_tokens={work.slots * 256}",
        "trainer.lr=1e-6",
        "model.path=tiny-count",  # count has the longest responses of the built-in tasks (~4 tokens a number)
        "task.type=count",
        "model.device=cpu",
        f"runtime.type={variant.runtime}",
        "runtime.rollout_num_cpus=1",
        "runtime.train_num_cpus=1",
    )
    return load_run_config(None, [*shared, *variant.overrides, *queue_only])


async def train_steps(config: RunConfig) -> list[dict[str, Any]]:
    """Run the config's steps through the real parts; one record per step, timed at the step's end."""
    steps: list[dict[str, Any]] = []
    with runtime_parts(config) as parts:
        source = PromptSource(parts.task.split("train"), seed=config.seed)
        proxy = make_proxy(parts)
        pids = cpu_use.role_pids(parts.locations())

        def on_step(record: StepRecord) -> None:
            steps.append(step_record(record, proxy.stats()) | {"cpu": cpu_use.snapshot(pids)})

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
        "generated_tokens": sum(int(e.get("total_tokens", 0)) for e in engines),
        "request_seconds": sum(float(e.get("request_seconds", 0.0)) for e in engines),
    }


def steady_state(steps: list[dict[str, Any]], warmup: int) -> dict[str, float]:
    """Throughput over the steps after ``warmup``, and where their time went (means per step)."""
    kept = steps[warmup:]
    wall = kept[-1]["end_s"] - steps[warmup - 1]["end_s"] if warmup else kept[-1]["end_s"] - kept[0]["end_s"]
    counted = kept if warmup else kept[1:]
    before = steps[warmup - 1] if warmup else kept[0]
    return {
        "steps_measured": len(counted),
        "wall_s": wall,
        "samples_per_s": sum(s["samples"] for s in counted) / wall,
        "tokens_per_s": sum(s["tokens"] for s in counted) / wall,
        "mean_response_tokens": sum(s["tokens"] for s in counted) / sum(s["samples"] for s in counted),
        "generated_tokens_per_step": (counted[-1]["generated_tokens"] - before["generated_tokens"])
        / len(counted),
        "wait_s": statistics.fmean(s["wait_s"] for s in counted),
        "train_s": statistics.fmean(s["train_s"] for s in counted),
        "sync_s": statistics.fmean(s["sync_s"] for s in counted),
        "max_staleness": max(s["max_age"] for s in counted),
        "engine_idle_fraction": counted[-1]["engine_idle"][0] if counted[-1]["engine_idle"] else float("nan"),
        "engine_mean_in_flight": (counted[-1]["request_seconds"] - before["request_seconds"]) / wall,
        **cpu_use.cores_used(before["cpu"], counted[-1]["cpu"], wall),
    }


def proposition2_inputs(steps: list[dict[str, Any]], warmup: int, work: Workload, epochs: int) -> dict:
    """μ_gen, L_gen, μ_train, E, K, N measured on the naive sync run (module docstring)."""
    kept = steps[warmup:]
    latencies = [x for s in kept for x in s["latencies_s"]]
    n, k = work.samples_per_step, work.slots
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


DEFAULT_OUT = "bench/results/async_vs_sync.json"
SATURATED = "engine_saturated_1thread"
"""The bare engine on one thread, every decode slot kept busy: the fastest one core can generate this
workload's responses. Not a training run, so it takes no part in the ratios."""
SATURATION_WAVES = 4
"""Requests the saturated engine serves, in multiples of its slots; it is measured only while more are
waiting than it has slots, so its tail does not count."""


def saturated_engine_arm(work: Workload, out_dir: Path):
    """A harness arm: the engine of the async arms (same model, engine config, prompts and sampling; one torch
    thread, as ``runtime.rollout_num_cpus=1`` gives it) alone, fed more requests than it has slots."""
    variant = next(v for v in VARIANTS if v.name == "async_a2")

    def run() -> dict[str, float]:
        config = run_config(variant, work, out_dir)
        return on_fresh_thread(lambda: saturated_rate(config, SATURATION_WAVES * work.slots), 1)

    return run


def saturated_rate(config: RunConfig, num_requests: int) -> dict[str, float]:
    """Generated tokens per second from the start until fewer requests remain than the engine has slots."""
    model, tokenizer = load_model_and_tokenizer(config.model.path, device="cpu")
    samples = make_task(config.task).split("train")
    per_prompt = config.rollout.num_return_sequences
    requests = [
        Request(
            request_id=str(i),
            prompt_token_ids=prompt_token_ids(samples[i // per_prompt], tokenizer),
            sampling=sampling_params(
                config.rollout, request_seed(config.seed, str(i // per_prompt), i % per_prompt)
            ),
        )
        for i in range(num_requests)
    ]
    engine = make_engine(model, tokenizer, config.engine, num_threads=1)
    try:
        return asyncio.run(_serve_until_unsaturated(engine, requests, config.engine.max_running_requests))
    finally:
        engine.shutdown()


async def _serve_until_unsaturated(engine: Any, requests: list[Request], slots: int) -> dict[str, float]:
    remaining = len(requests)
    mark: dict[str, float] = {}
    started = time.perf_counter()

    async def serve(request: Request) -> None:
        nonlocal remaining
        await engine.generate(request)
        remaining -= 1
        if remaining < slots and not mark:
            mark["seconds"] = time.perf_counter() - started
            mark["tokens"] = float(engine.stats()["num_generated_tokens"])

    await asyncio.gather(*(serve(r) for r in requests))
    return {"tokens_per_s": mark["tokens"] / mark["seconds"], "saturated_s": mark["seconds"]}


def best_sync(raw: dict[str, list[dict[str, float]]]) -> dict[str, Any] | None:
    """The best sync arm (any runtime and placement: all run on the same 2 cores) by the paired ratio of
    samples/s (``harness.best_by_paired_ratio``), with its margin over the runner-up: the denominator of every
    async-vs-sync ratio."""
    syncs = [v.name for v in VARIANTS if v.async_ratio == 0 and v.name in raw]
    return harness.best_by_paired_ratio(raw, syncs) if syncs else None


def resource_ceilings(
    raw: dict[str, list[dict[str, float]]], variant: Variant, work: Workload, best: str, lone_trainer: str
) -> dict[str, Any]:
    """Per paired repeat, the most an async arm with one core per role can gain over the best sync, and the
    share of it the arm reached (the share is the ceiling's step time over the arm's: it does not depend on
    which sync divides both).

    An async step can be no shorter than the engine needs to generate its samples at full occupancy on its
    one core (``SATURATED``'s rate; every token the arm's engine generated counts, filtered groups and
    aborted surplus included) nor than the trainer needs on its one core alone (``lone_trainer``'s train step:
    a one-thread sync on the arm's own runtime, no other role computing beside it). Both are measured apart
    from the arm, so this is a true bound: above 1 the measurement is wrong. Below, the gap is what the
    pipeline loses to admission waits, weight syncs and the two roles slowing each other down."""
    n = work.samples_per_step
    ceilings, fractions, generation, training = [], [], [], []
    for i, row in enumerate(raw[variant.name]):
        sync_step = n / raw[best][i]["samples_per_s"]
        gen_s = row["generated_tokens_per_step"] / raw[SATURATED][i]["tokens_per_s"]
        train_s = raw[lone_trainer][i]["train_s"]
        ceiling = sync_step / max(gen_s, train_s)
        ceilings.append(ceiling)
        fractions.append(row["samples_per_s"] / raw[best][i]["samples_per_s"] / ceiling)
        generation.append(gen_s)
        training.append(train_s)
    return {
        "ceiling": harness.summary(ceilings),
        "fraction_of_ceiling": harness.summary(fractions),
        "saturated_generation_s_per_step": harness.summary(generation),
        "lone_train_s_per_step": harness.summary(training),
    }


def targets(ratios: dict[str, dict], ceilings: dict[str, dict]) -> dict[str, bool]:
    """The issue's targets on medians over paired repeats (the sync controls are not targets).

    The 70–100 % band is checked against the resource ceiling, not Proposition 2 (see the module
    docstring for why its ratio is no bound on this engine)."""
    met = {
        f"{name} within 70-100% of its resource ceiling": 0.7 <= c["fraction_of_ceiling"]["median"] <= 1.0
        for name, c in ceilings.items()
    }
    if "async_a2_over_best_sync" in ratios:
        met["async_a2 >= 1.3x the best sync"] = ratios["async_a2_over_best_sync"]["median"] >= 1.3
    return met


def resources(variants: tuple[Variant, ...], work: Workload) -> dict[str, Any]:
    """How each variant split the cores (placement as the runtime plans it)."""
    return {
        variant.name: harness.placement(run_config(variant, work, Path("unused"))) for variant in variants
    }


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "async_vs_sync")
    parser.add_argument(
        "--only", nargs="*", help="variant names to run (comparisons need both sync baselines)"
    )
    parser.add_argument("--workload", choices=list(WORKLOADS), default="generation_bound")
    args = parser.parse_args()
    work = QUICK if args.quick else WORKLOADS[args.workload]
    if args.workload != "generation_bound" and args.out == DEFAULT_OUT:
        args.out = DEFAULT_OUT.replace(".json", f"_{args.workload}.json")
    names = args.only or (QUICK_VARIANTS if args.quick else [v.name for v in VARIANTS])
    chosen = tuple(v for v in VARIANTS if v.name in names)
    if args.quick:  # seconds: one process, no Ray start-up per run
        chosen = tuple(dataclasses.replace(v, runtime="inline") for v in chosen)
    with tempfile.TemporaryDirectory(prefix="async-vs-sync-") as tmp:
        arms = {v.name: arm(v, work, Path(tmp) / v.name) for v in chosen}
        if any(v.async_ratio > 0 for v in chosen):
            arms[SATURATED] = saturated_engine_arm(work, Path(tmp) / SATURATED)
        raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
    ratios, bounds, ceilings = {}, {}, {}
    choice = best_sync(raw)
    best = choice["name"] if choice else None
    for variant in chosen:
        if best is None or variant.name == best:
            continue
        ratios[f"{variant.name}_over_best_sync"] = harness.paired_ratio(
            raw, variant.name, best, "samples_per_s"
        )
        if variant.async_ratio > 0:
            if BASELINE in raw:
                bounds[variant.name] = bound_fractions(raw, variant)
            lone = LONE_TRAINERS[variant.runtime] if not args.quick else "sync_batch_1thread"
            if lone in raw:
                ceilings[variant.name] = resource_ceilings(raw, variant, work, best, lone)
    setup = vars(work) | {"N": work.samples_per_step, "K": work.slots, "model": "tiny-count on count"}
    extra = {
        "best_sync": best,
        "best_sync_choice": choice,
        "resource_ceiling": ceilings,
        "proposition2": bounds,
        "targets_met": targets(ratios, ceilings),
    }
    placement = resources(chosen, work) | {
        SATURATED: "the bare engine alone on one torch thread (no trainer, no Ray): a ceiling input only"
    }
    harness.write_result(
        args, "async_vs_sync", raw, ratios=ratios, resources=placement, setup=setup, extra=extra
    )


if __name__ == "__main__":
    main()
