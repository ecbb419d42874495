"""Every study of docs/simulator.md through the real simulator, with the ROLL Flash report's figures beside it.

Why a benchmark: the studies' tables used to be typed from one-off ``asyncrl simulate`` runs and drifted as
the scheduling code changed under them. Here each study is the sweep the docs name over an example config in
``asyncrl/examples/sim``, loaded and overridden exactly as ``asyncrl simulate --sweep`` does
(``asyncrl.config.loader.load_config`` and ``asyncrl.cli.simulate.swept``), and ``scripts/bench_docs.py``
renders each study's block in docs/simulator.md from the result.

A simulation is deterministic per seed, so the harness's repeats are seeds: repeat i of every point runs with
seed i, and a paired ratio (``harness.paired_ratio``) compares two points on the same seed. The report's
figures are static ``report`` strings quoted from the paper (``/work/shared/reference/roll-flash-report.txt``),
not measured here; the simulator's cost parameters are illustrative, so compare ratios with them, not seconds.

Writes bench/results/sim_studies.json. Run:
``python bench/sim_studies.py [--quick] [--studies queue_vs_batch,async_ratio] [--repeats 3]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/sim_studies.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from asyncrl.app.simulate import simulate
from asyncrl.cli.plan import plan_config
from asyncrl.cli.simulate import swept
from asyncrl.config.loader import load_config
from asyncrl.config.sim import SimConfig
from asyncrl.sim.plan import Plan, recommend
from bench import harness

EXAMPLES = Path("asyncrl/examples/sim")
MODES = ("sync", "one_step_off", "async", "partial_rollout", "multi_version")
SIGMAS = ((10, 1), (10, 5), (10, 7), (10, 10), (50, 5))
"""(μ, σ) of the env step latency: Fig. 9's left panel at μ = 10 s, and its right panel's (50, 5)."""
REDUNDANT_CELLS = ((32, 8), (32, 9), (32, 12), (34, 11), (36, 8), (36, 9), (36, 11), (36, 12))
"""(env groups, group size): Fig. 10's cells, and the pairs with equal env counts the docs compare."""
SAME_ENVS = (((32, 9), (36, 8)), ((32, 12), (34, 11)))
"""Pairs of cells with (about) as many environments: larger groups against more groups, env for env."""
FIG9 = {
    (10, 1): "1.16×",
    (10, 7): "2.12×",
    (10, 10): "2.46× (892 s → 362 s)",
    (50, 5): "1.20× (Fig. 9, right)",
}
"""Batch over env-level async step time at batch 512, Fig. 9 (quoted)."""
FIG10 = {(36, 9): "3.10×", (36, 11): "5.24×", (36, 12): "5.45× (243 s → 45 s)"}
"""32×8 over the cell's step time, Fig. 10 (quoted)."""
PLAN_ARGS = argparse.Namespace(
    mu_gen=10.0, l_gen=100.0, mu_train=2.0, epochs=1, workers=32, samples=256, alpha=2.0, steps=10
)
"""The ``asyncrl plan`` example of docs/simulator.md (``--mu-gen 10 --l-gen 100 --mu-train 2 --K 32 --N 256``)."""


@dataclass(frozen=True)
class Ratio:
    """A paired ratio a study quotes, and the report's figure for the same comparison (None: it has none)."""

    numerator: str
    denominator: str
    metric: str = "mean_step_s"
    report: str | None = None


@dataclass(frozen=True)
class Study:
    """One table of docs/simulator.md: its points (label → overrides of the example ``config``; ``config``
    None is the ``asyncrl plan`` check, whose points are its two placements), the metrics it shows, the
    ratios it quotes, and the report's finding that is not one ratio."""

    title: str
    command: str
    points: Mapping[str, tuple[str, ...]]
    metrics: tuple[str, ...]
    ratios: Mapping[str, Ratio] = field(default_factory=dict)
    config: str | None = None
    report: str | None = None


def sweep(key: str, values: Sequence[str], *fixed: str) -> dict[str, tuple[str, ...]]:
    """One point per value, named by it, with the overrides ``asyncrl simulate --sweep KEY=...`` applies."""
    return {value: (*fixed, *swept(key, value)) for value in values}


def queue_studies() -> dict[str, Study]:
    """Queue scheduling vs batch rollout (Fig. 7) and prompt replication (Fig. 8) at the report's shapes."""
    shapes = ((32, 16), (64, 16), (16, 32))
    fig8 = {
        (32, 16): "1.30× (116 s → 89 s)",
        (64, 16): "1.84× (149 s → 81 s)",
        (16, 32): "1.95× (162 s → 83 s)",
    }
    replication = {
        f"{b}x{n}/{name}": (f"rollout.rollout_batch_size={b}", f"rollout.num_return_sequences={n}", override)
        for b, n in shapes
        for name, override in (
            ("grouped", "rollout.prompt_replication=false"),
            ("replicated", "rollout.prompt_replication=true"),
        )
    }
    return {
        "queue_vs_batch": Study(
            title="Queue scheduling vs batch rollout (8×8, 16 additional prompts, zero-variance filter)",
            command="asyncrl simulate asyncrl/examples/sim/queue_vs_batch.yaml "
            "--sweep rollout.generation=batch,queue",
            config="queue_vs_batch",
            points=sweep("rollout.generation", ("batch", "queue")),
            metrics=("mean_wait_s", "mean_step_s", "engine_busy_fraction", "tokens_per_s"),
            ratios={
                "batch_over_queue": Ratio(
                    "batch", "queue", "mean_wait_s", "3.4× (generation 125 s → 37 s per step, Fig. 7)"
                )
            },
        ),
        "prompt_replication": Study(
            title="Prompt replication (batch × responses per prompt)",
            command="asyncrl simulate asyncrl/examples/sim/prompt_replication.yaml rollout.rollout_batch_size=B "
            "rollout.num_return_sequences=N --sweep rollout.prompt_replication=false,true",
            config="prompt_replication",
            points=replication,
            metrics=("mean_step_s", "engine_busy_fraction"),
            ratios={
                f"{b}x{n}": Ratio(f"{b}x{n}/grouped", f"{b}x{n}/replicated", report=f"{fig8[b, n]}, Fig. 8")
                for b, n in shapes
            },
        ),
    }


def async_studies() -> dict[str, Study]:
    """The async ratio (§3.2, Takeaway 3) and the train/infer split of 40 accelerators (Fig. 3a)."""
    splits = {
        f"train{t}_infer{40 - t}": (f"trainer.num_gpus={t}", f"rollout.num_engines={40 - t}")
        for t in (8, 16, 24, 32)
    }
    colocated = ("trainer.colocated=true", "rollout.num_engines=40", *swept("controller.mode", "sync"))
    fig3 = {"train16_infer24": "nearly 2×, the best split of 40 GPUs (Fig. 3a)"}
    return {
        "async_ratio": Study(
            title="Async ratio α at 24 train / 16 infer, ~11 k-token responses (partial rollout)",
            command="asyncrl simulate asyncrl/examples/sim/async_ratio.yaml --sweep buffer.async_ratio=0,1,2,4",
            config="async_ratio",
            points={f"alpha_{a}": (f"buffer.async_ratio={a}",) for a in (0, 1, 2, 4)},
            metrics=("mean_step_s", "tokens_per_s", "engine_busy_fraction", "mean_staleness"),
            ratios={
                "alpha_1": Ratio("alpha_0", "alpha_1", report="1.28× (+28 % throughput, §3.2)"),
                "alpha_2": Ratio("alpha_0", "alpha_2", report="1.64× (+64 % throughput, §3.2)"),
                "alpha_4": Ratio("alpha_0", "alpha_4", report="no gain beyond α = 2 (Takeaway 3)"),
            },
        ),
        "train_infer_split": Study(
            title="Train/infer split of 40 accelerators (partial rollout, α = 2) against colocated sync on all 40",
            command="asyncrl simulate asyncrl/examples/sim/train_infer_split.yaml trainer.num_gpus=T "
            "rollout.num_engines=40-T (and the colocated sync baseline: trainer.colocated=true "
            "rollout.num_engines=40 controller.mode=sync buffer.async_ratio=0)",
            config="train_infer_split",
            points={"sync_colocated40": colocated, **splits},
            metrics=("mean_step_s", "mean_wait_s", "engine_busy_fraction", "trainer_busy_fraction"),
            ratios={name: Ratio("sync_colocated40", name, report=fig3.get(name)) for name in splits},
        ),
    }


def mode_studies() -> dict[str, Study]:
    """Every controller mode on one workload, and drain vs in-flight weight updates: asyncrl's own studies,
    with no counterpart in the report."""
    return {
        "all_modes": Study(
            title="All modes on the async-ratio workload (16 engines, α = 2 where the mode takes it)",
            command="asyncrl simulate asyncrl/examples/sim/async_ratio.yaml --sweep controller.mode="
            + ",".join(MODES),
            config="async_ratio",
            points=sweep("controller.mode", MODES),
            metrics=(
                "mean_step_s",
                "tokens_per_s",
                "engine_busy_fraction",
                "mean_staleness",
                "num_migrations",
                "kv_bytes_moved",
                "max_versions_alive",
            ),
            ratios={
                "sync_over_partial_rollout": Ratio("sync", "partial_rollout"),
                "async_over_multi_version": Ratio("async", "multi_version"),
                "multi_version_over_partial_rollout": Ratio("multi_version", "partial_rollout"),
            },
        ),
        "drain": Study(
            title="Drain vs in-flight weight updates (`async` mode on the async-ratio workload)",
            command="asyncrl simulate asyncrl/examples/sim/async_ratio.yaml controller.mode=async "
            "--sweep controller.wait_for_weight_sync=true,false",
            config="async_ratio",
            points=sweep(
                "controller.wait_for_weight_sync", ("true", "false"), *swept("controller.mode", "async")
            ),
            metrics=("mean_step_s", "mean_sync_s", "engine_busy_fraction"),
            ratios={"wait_over_no_wait": Ratio("true", "false")},
        ),
    }


def agentic_studies() -> dict[str, Study]:
    """Env-level async rollout as the env latency's σ grows (Fig. 9) and redundant environments under two
    failure models (Fig. 10)."""
    latency = {
        f"mu{mu}_sigma{sigma}/{stepping}": (
            f"env.mean_s={mu}",
            f"env.sigma_s={sigma}",
            *swept("env_manager.stepping", stepping),
        )
        for mu, sigma in SIGMAS
        for stepping in ("batch", "async")
    }
    models = {"fail_slow": (), "slow_seed": ("env.fail_slow_p=0", "env.slow_seed_p=0.05")}
    redundant = {
        f"{model}/{g}x{n}": (*fixed, f"env_manager.num_env_groups={g}", f"env_manager.group_size={n}")
        for model, fixed in models.items()
        for g, n in REDUNDANT_CELLS
    }
    return {
        "env_latency_sigma": Study(
            title="Env-level async rollout vs batch env stepping (sync training, 64 groups × 8, 10 turns)",
            command="asyncrl simulate asyncrl/examples/sim/env_latency_sigma.yaml --sweep env_manager.stepping=batch,async "
            "--sweep env.sigma_s=1,5,7,10 (and env.mean_s=50 env.sigma_s=5)",
            config="env_latency_sigma",
            points=latency,
            metrics=("mean_step_s", "engine_busy_fraction"),
            ratios={
                f"mu{mu}_sigma{sigma}": Ratio(
                    f"mu{mu}_sigma{sigma}/batch", f"mu{mu}_sigma{sigma}/async", report=FIG9.get((mu, sigma))
                )
                for mu, sigma in SIGMAS
            },
            report="batch 512 (Fig. 9): the speedup grows with σ at μ = 10 s and shrinks as μ grows at σ = 5 s",
        ),
        "redundant_envs": Study(
            title="Redundant environments (32 groups × 8 trained per step; fail-slow per step vs slow seeds)",
            command="asyncrl simulate asyncrl/examples/sim/redundant_envs.yaml --sweep env_manager.num_env_groups=32,34,36 "
            "--sweep env_manager.group_size=8,9,11,12 (slow seeds: env.fail_slow_p=0 env.slow_seed_p=0.05)",
            config="redundant_envs",
            points=redundant,
            metrics=("mean_step_s", "engine_busy_fraction"),
            ratios={
                **{
                    f"{model}/{g}x{n}": Ratio(f"{model}/32x8", f"{model}/{g}x{n}", report=FIG10.get((g, n)))
                    for model in models
                    for g, n in REDUNDANT_CELLS[1:]
                },
                **{
                    f"{model}/same_envs_{a}x{b}_vs_{c}x{d}": Ratio(f"{model}/{a}x{b}", f"{model}/{c}x{d}")
                    for model in models
                    for (a, b), (c, d) in SAME_ENVS
                },
            },
            report="32×8 takes 243 s; more env groups help more than larger groups (Fig. 10; failure model not stated)",
        ),
    }


def plan_study() -> dict[str, Study]:
    """The ``asyncrl plan`` example: its bounds (in ``derived``) checked by simulating both placements."""
    return {
        "plan": Study(
            title="`asyncrl plan`: colocated sync vs the β* split (partial rollout, α = 2), 10 steps",
            command="asyncrl plan --mu-gen 10 --l-gen 100 --mu-train 2 --E 1 --K 32 --N 256 --alpha 2",
            points={"sync": (), "split": ()},
            metrics=("mean_step_s",),
            ratios={"sync_over_split": Ratio("sync", "split")},
        )
    }


def studies() -> dict[str, Study]:
    """Every study, in the order docs/simulator.md shows them."""
    return {**queue_studies(), **async_studies(), **mode_studies(), **agentic_studies(), **plan_study()}


def the_plan() -> Plan:
    """What ``asyncrl plan`` recommends for the docs' example (``PLAN_ARGS``)."""
    args = PLAN_ARGS
    return recommend(
        args.samples, args.workers, args.mu_gen, args.l_gen, args.mu_train, args.epochs, args.alpha
    )


def point_config(study: Study, label: str, seed: int, steps: int | None) -> SimConfig:
    """The config of one point at ``seed``: the example config with the point's overrides, as ``asyncrl
    simulate`` loads it; for the plan study, the placement ``asyncrl plan`` simulates. ``steps`` None keeps
    the config's own step count."""
    if study.config is None:
        plan, args = the_plan(), argparse.Namespace(**vars(PLAN_ARGS))
        args.steps = steps or args.steps
        if label == "sync":
            config = plan_config(args, args.workers, None, "sync")
        else:
            config = plan_config(args, plan.num_rollout_workers, plan.num_train_workers, "partial_rollout")
        return replace(config, seed=seed)
    extra = [f"controller.num_steps={steps}"] if steps else []
    path = str(EXAMPLES / f"{study.config}.yaml")
    return load_config(SimConfig, path, [*study.points[label], *extra, f"seed={seed}"])


class SeededPoint:
    """An arm of ``harness.run_arms`` whose i-th call simulates seed i: ``run_arms`` calls every arm once
    per repeat, in order, so repeat i of every point of a study shares seed i and ratios pair equal draws."""

    def __init__(self, study: Study, label: str, steps: int | None) -> None:
        self.study, self.label, self.steps, self.calls = study, label, steps, 0

    def __call__(self) -> dict[str, float]:
        seed, self.calls = self.calls, self.calls + 1
        totals = simulate(point_config(self.study, self.label, seed, self.steps)).totals
        # multi_version's migration counters are absent from the other modes' totals: none happened there
        return {metric: float(totals.get(metric, 0.0)) for metric in self.study.metrics}


def run_study(
    name: str, study: Study, repeats: int, quick: bool
) -> tuple[dict[str, list[dict[str, float]]], dict[str, Any], dict[str, Any]]:
    """One study's raw runs (arms named ``NAME/POINT``), paired ratios and record for the result.

    ``quick`` keeps the first two points at one step: enough to exercise every code path, not a result."""
    steps = 1 if quick else None
    labels = list(study.points)[:2] if quick else list(study.points)
    arms = {f"{name}/{label}": SeededPoint(study, label, steps) for label in labels}
    start = time.perf_counter()
    raw = harness.run_arms(arms, repeats, harness.print_run)
    wall_s = time.perf_counter() - start
    ratios = {
        f"{name}/{key}": harness.paired_ratio(
            raw, f"{name}/{r.numerator}", f"{name}/{r.denominator}", r.metric
        )
        | ({"report": r.report} if r.report else {})
        for key, r in study.ratios.items()
        if {r.numerator, r.denominator} <= set(labels)
    }
    record = {
        "title": study.title,
        "command": study.command,
        "config": f"{EXAMPLES}/{study.config}.yaml" if study.config else None,
        "steps": point_config(study, labels[0], 0, steps).controller.num_steps,
        "points": {label: list(study.points[label]) for label in labels},
        "report": study.report,
        "wall_s": wall_s,
    }
    if study.config is None:
        record["derived"] = plan_bounds(the_plan())
    return raw, ratios, record


def plan_bounds(plan: Plan) -> dict[str, float]:
    """What ``asyncrl plan`` prints before simulating: β*, the split and Proposition 2's two bounds."""
    return {
        "beta_star": plan.beta,
        "train_workers": plan.num_train_workers,
        "rollout_workers": plan.num_rollout_workers,
        "sync_bound_s": plan.sync_bound_s,
        "async_bound_s": plan.async_bound_s,
        "speedup_bound": plan.speedup_bound,
    }


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "sim_studies")
    parser.add_argument("--studies", default=",".join(studies()), help="comma-separated study names")
    args = parser.parse_args()
    chosen, known = args.studies.split(","), studies()
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise SystemExit(f"unknown studies {unknown}; known: {', '.join(known)}")
    repeats, start = harness.repeats_for(args), time.perf_counter()
    raw: dict[str, list[dict[str, float]]] = {}
    ratios: dict[str, dict[str, Any]] = {}
    records: dict[str, Any] = {}
    for name in chosen:
        study_raw, study_ratios, records[name] = run_study(name, known[name], repeats, args.quick)
        raw |= study_raw
        ratios |= study_ratios
    resources = {
        "all_arms": "one process, one thread (the simulator is single-threaded Python); virtual time"
    }
    setup = {"seeds": list(range(repeats)), "studies": chosen}
    extra = {"studies": records, "run_wall_s": time.perf_counter() - start}
    harness.write_result(
        args, "sim_studies", raw, ratios=ratios, resources=resources, setup=setup, extra=extra
    )


if __name__ == "__main__":
    main()
