"""The ROLL Flash report's figures, predicted by asyncrl's real scheduler on the cost model from first principles.

Every point runs ``asyncrl simulate`` on an example config of ``asyncrl/examples/sim`` whose engine and trainer
costs derive from one model (Qwen3-8B) and one hardware profile (H800: spec ceilings with the efficiencies the
calibration probe measured on an H200), at steady state (warm-up excluded, stopped once the step time
settles). Nothing is fitted per figure: the choices the report leaves open are made once, in the example
configs' headers and in ``CHOICES`` below, and hold for every figure.

A simulation is deterministic per seed, so repeats are seeds (repeat i of every arm runs seed i) and a claim's
prediction is the paired ratio of two arms per seed. Each claim carries the report's figure (quoted from
``/work/shared/reference/roll-flash-report.txt``, not measured) and whether the median prediction is within
±20 % of it. Writes bench/results/paper_tables.json. Run:
``python bench/paper_tables.py [--quick] [--figures fig1b_think,fig7] [--repeats 3] [--claims-only]``;
``--claims-only`` runs only the arms a claim reads (not Fig. 3a's other splits, nor Fig. 1b's Sync-ROLL);
``--merge A.json B.json`` joins results of separate ``--figures`` runs at one commit (run side by side) into
one result, its points computed again from the runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/paper_tables.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.app.simulate import simulate
from asyncrl.cli.simulate import swept
from asyncrl.sim.derive import load_sim_config
from bench import harness

EXAMPLES = Path("asyncrl/examples/sim")
SOURCE = "ROLL Flash (roll-flash-report.txt)"
TOLERANCE = 0.2
"""A prediction counts as reproducing a reported ratio within ±20 % of it (the issue's target)."""
METRICS = ("steady_samples_per_s", "steady_mean_step_s", "steady_mean_wait_s", "steady_num_steps")
CHOICES = (
    "hardware: H800 for every figure (the report names no GPU; DORA, by the same ecosystem, runs H800)",
    "model: Qwen3-8B (the report's), dense bf16, served with paged KV (vLLM/SGLang), 90 % of device memory: "
    "an engine holds the KV that fits beside its weights (about 380 k tokens on an H800), admits by context so far "
    "and preempts the newest request (recompute) when its running contexts outgrow it; at most 256 running",
    "responses: lognormal, mean 11,000 (Think) or 2,000 (Base) tokens, clipped at 30,720, total log-sigma 1 of "
    "which half the variance is the prompt's (per-response and per-prompt sigma 0.71: a hard prompt makes all its "
    "responses long); 256-token prompts",
    "batch: 256 prompts x 16 responses per step (Appendix A.1's config), unless the figure varies it",
    "Async: partial rollout (in-flight weight updates) at async ratio 2 on a 1:1 train/infer split (§3); as the "
    "report states, no admitted sample is wasted (a batch waits for the oldest admitted groups, §4.3) and requests "
    "running at an update are aborted and recomputed (prompt and partial output prefilled again, §4.2)",
    "Sync-Naive: colocated, batch rollout, a prompt's responses on one engine (grouped decoding: proxy affinity "
    "always wins); Sync-ROLL: colocated, queue scheduling and prompt replication; colocated arms pay the colocated "
    "switch (trainer state offloaded and back, KV re-zeroed, weights by CUDA IPC, 0.5 s fixed)",
    "trainer: two no-grad log-prob passes per trained token (footnote to Fig. 3a: reference and proximal "
    "models), at the MFU our trainer reached on the H200 probe",
    "filtering (Fig. 7): per-prompt pass rates ~ Beta(0.5, 0.5); agentic figures keep their example configs' "
    "env models (Fig. 10's failure rates are not in the report); a failed episode is played again so a step "
    "trains its full batch (Fig. 10: 'fixing the total rollout batch size at 256')",
    "steady state: 5 warm-up steps excluded, stopped when two 10-step windows agree within 3 % (cap 45)",
)


@dataclass(frozen=True)
class Claim:
    """A number the report states, as a ratio of one metric between two arms of a figure."""

    setting: str
    reported: float
    numerator: str
    denominator: str
    metric: str
    quote: str


@dataclass(frozen=True)
class Figure:
    """One figure: the example config, its arms (label -> overrides), and the claims read off it."""

    title: str
    config: str
    arms: Mapping[str, tuple[str, ...]]
    claims: tuple[Claim, ...]
    best_of: tuple[str, ...] = ()
    """Arms among which the report names the best (Fig. 3a's split): the prediction's best is recorded."""
    best_reported: str = ""
    notes: dict[str, str] = field(default_factory=dict)


def sync_colocated(gpus: int, *extra: str) -> tuple[str, ...]:
    return (
        "trainer.colocated=true",
        f"rollout.num_engines={gpus}",
        *swept("controller.mode", "sync"),
        *extra,
    )


GROUPED = ("rollout.prompt_replication=false", "proxy.affinity_slack=1000000")
"""Grouped decoding: a prompt's responses on one engine. The affinity slack is what makes it one engine (the
default, 2, lets the proxy spread a group over engines as soon as its engine holds 3 more than the least
loaded: replication in effect); a slack above any step's request count means affinity always wins."""
NAIVE = ("rollout.generation=batch", *GROUPED)
ROLL_FLASH_ASYNC = ("controller.wait_for_older=true", "engine.recompute_kv_on_update=true")
"""What ROLL Flash's Async does with work in flight, as the report states it, on every Async arm: no admitted
sample is wasted (§4.3: a batch waits for the oldest admitted groups, as ROLL's get_batch drains the oldest step
first, instead of taking the first fresh groups and reclaiming the late, long ones), and requests running at a
weight update are aborted and recomputed (§4.2: prompt and partial output prefilled again on the new weights)."""
GPU_COUNTS = (16, 32, 64, 128)


def fig1b(model: str, claims: tuple[Claim, ...]) -> Figure:
    arms: dict[str, tuple[str, ...]] = {}
    for gpus in GPU_COUNTS:
        arms[f"async_{gpus}"] = (
            f"rollout.num_engines={gpus // 2}",
            f"trainer.num_gpus={gpus // 2}",
            *ROLL_FLASH_ASYNC,
        )
        arms[f"sync_roll_{gpus}"] = sync_colocated(gpus)
        arms[f"sync_naive_{gpus}"] = sync_colocated(gpus, *NAIVE)
    return Figure(
        title=f"Fig. 1(b): throughput against GPU count, Qwen3-8B-{model}",
        config=f"roll_flash_{model.lower()}",
        arms=arms,
        claims=claims,
    )


def rate(setting: str, reported: float, a: str, b: str, quote: str) -> Claim:
    return Claim(setting, reported, a, b, "steady_samples_per_s", quote)


def slower(setting: str, reported: float, slow: str, fast: str, metric: str, quote: str) -> Claim:
    """``slow``'s time over ``fast``'s: a speedup of ``fast``."""
    return Claim(setting, reported, slow, fast, metric, quote)


def figures() -> dict[str, Figure]:
    splits = {
        f"async_{t}T{40 - t}I": (f"trainer.num_gpus={t}", f"rollout.num_engines={40 - t}", *ROLL_FLASH_ASYNC)
        for t in (8, 16, 24, 32)
    }
    ratio_arms = {}
    for train, infer in ((32, 8), (24, 16)):
        place = (f"trainer.num_gpus={train}", f"rollout.num_engines={infer}")
        ratio_arms[f"{train}T{infer}I_alpha0"] = (*place, *swept("controller.mode", "sync"))
        for alpha in (1, 2, 4):
            ratio_arms[f"{train}T{infer}I_alpha{alpha}"] = (
                *place,
                f"buffer.async_ratio={alpha}",
                *ROLL_FLASH_ASYNC,
            )
    replication = {}
    fig8 = {
        (32, 16): (1.30, "116 s -> 89 s"),
        (64, 16): (1.84, "149 s -> 81 s"),
        (16, 32): (1.95, "162 s -> 83 s"),
        (16, 64): (1.84, ""),
    }
    for (batch, n), _ in fig8.items():
        shape = (f"rollout.rollout_batch_size={batch}", f"rollout.num_return_sequences={n}")
        replication[f"{batch}x{n}_grouped"] = (*shape, *GROUPED)
        replication[f"{batch}x{n}_replicated"] = (*shape, "rollout.prompt_replication=true")
    sigmas = {(10, 1): 1.16, (10, 7): 2.12, (10, 10): 2.46, (50, 5): 1.20}
    envs = {
        f"mu{mu}_sigma{sigma}_{stepping}": (
            f"env.mean_s={mu}",
            f"env.sigma_s={sigma}",
            f"env_manager.stepping={stepping}",
        )
        for mu, sigma in sigmas
        for stepping in ("batch", "async")
    }
    cells = {(32, 8): None, (36, 9): 3.10, (36, 11): 5.24, (36, 12): 5.45}
    redundant = {
        f"{g}x{n}": (f"env_manager.num_env_groups={g}", f"env_manager.group_size={n}") for g, n in cells
    }
    return {
        "fig1b_think": fig1b(
            "Think",
            (
                rate(
                    "Think: Async at 128 GPUs over Async at 16",
                    7.6,
                    "async_128",
                    "async_16",
                    "7.6x speedup with 8x GPUs (§3, Takeaway 1)",
                ),
                rate(
                    "Think, 128 GPUs: Async over Sync-Naive",
                    2.13,
                    "async_128",
                    "sync_naive_128",
                    "2.13x higher than Sync-Naive (§3)",
                ),
            ),
        ),
        "fig1b_base": fig1b(
            "Base",
            (
                rate(
                    "Base, 128 GPUs: Async over Sync-Naive",
                    2.24,
                    "async_128",
                    "sync_naive_128",
                    "2.24x higher throughput than Sync-Naive at 128 GPUs (§3)",
                ),
                rate(
                    "Base, 16 GPUs: Async over Sync-Naive",
                    1.53,
                    "async_16",
                    "sync_naive_16",
                    "1.53x to 2.24x faster (Fig. 1 caption; taken as 16 to 128 GPUs)",
                ),
            ),
        ),
        "fig3a": Figure(
            title="Fig. 3(a): train/infer split of 40 GPUs, Async against ROLL-Sync on all 40 (Think)",
            config="roll_flash_think",
            arms={"sync_roll_40": sync_colocated(40), **splits},
            claims=(
                slower(
                    "16T/24I over ROLL-Sync (step time)",
                    2.0,
                    "sync_roll_40",
                    "async_16T24I",
                    "steady_mean_step_s",
                    "nearly 2x speedup over baseline (Fig. 3a)",
                ),
            ),
            best_of=tuple(splits),
            best_reported="async_16T24I",
        ),
        "async_ratio": Figure(
            title="§3.2 (Takeaway 3): async ratio at 32T8I and 24T16I against the synchronous baseline (Think)",
            config="roll_flash_think",
            arms=ratio_arms,
            claims=(
                rate(
                    "32T8I: alpha 1 over sync",
                    1.25,
                    "32T8I_alpha1",
                    "32T8I_alpha0",
                    "+25 %, the highest achievable in this setting",
                ),
                rate(
                    "32T8I: alpha 2 over sync",
                    1.25,
                    "32T8I_alpha2",
                    "32T8I_alpha0",
                    "no more than alpha 1's +25 % (§3.2)",
                ),
                rate("24T16I: alpha 1 over sync", 1.28, "24T16I_alpha1", "24T16I_alpha0", "+28 % (§3.2)"),
                rate("24T16I: alpha 2 over sync", 1.64, "24T16I_alpha2", "24T16I_alpha0", "+64 % (§3.2)"),
                rate(
                    "24T16I: alpha 4 over sync",
                    1.64,
                    "24T16I_alpha4",
                    "24T16I_alpha0",
                    "no gain beyond alpha 2 (§3.2)",
                ),
            ),
        ),
        "fig7": Figure(
            title="Fig. 7: queue scheduling against batch rollout, 8x8 with 16 additional prompts, zero-variance filter",
            config="queue_vs_batch",
            arms={"batch": ("rollout.generation=batch",), "queue": ("rollout.generation=queue",)},
            claims=(
                slower(
                    "8x8: batch over queue generation time",
                    3.4,
                    "batch",
                    "queue",
                    "steady_mean_wait_s",
                    "125 s -> 37 s per step (3.4x)",
                ),
            ),
        ),
        "fig8": Figure(
            title="Fig. 8: prompt replication against grouped decoding (generation time per step)",
            config="prompt_replication",
            arms=replication,
            claims=tuple(
                slower(
                    f"{b}x{n}: grouped over replicated",
                    value,
                    f"{b}x{n}_grouped",
                    f"{b}x{n}_replicated",
                    "steady_mean_wait_s",
                    f"{value}x {quote}".strip(),
                )
                for (b, n), (value, quote) in fig8.items()
            ),
        ),
        "fig9": Figure(
            title="Fig. 9: env-level async rollout against batch env stepping, batch 512, env latency N(mu, sigma)",
            config="env_latency_sigma",
            arms=envs,
            claims=tuple(
                slower(
                    f"mu {mu} s, sigma {sigma} s: batch over async step time",
                    value,
                    f"mu{mu}_sigma{sigma}_batch",
                    f"mu{mu}_sigma{sigma}_async",
                    "steady_mean_step_s",
                    f"{value}x (Fig. 9)",
                )
                for (mu, sigma), value in sigmas.items()
            ),
        ),
        "fig10": Figure(
            title="Fig. 10: redundant environments (groups x group size; 32 x 8 trained per step)",
            config="redundant_envs",
            arms=redundant,
            claims=tuple(
                slower(
                    f"32x8 over {g}x{n} step time",
                    value,
                    "32x8",
                    f"{g}x{n}",
                    "steady_mean_step_s",
                    f"{value}x (Fig. 10)",
                )
                for (g, n), value in cells.items()
                if value is not None
            ),
        ),
    }


class SeededArm:
    """An arm whose i-th call simulates seed i (``harness.run_arms`` calls every arm once per repeat)."""

    def __init__(self, config: str, overrides: tuple[str, ...], quick: bool) -> None:
        self.path = str(EXAMPLES / f"{config}.yaml")
        self.overrides = [*overrides, "timeline=none"]
        if quick:  # a smoke run of every code path, not a result: one step, RLVR batches cut to 16 prompts
            self.overrides += ["steady_state.enabled=false", "controller.num_steps=1"]
            if "env" not in config:
                self.overrides.append("rollout.rollout_batch_size=16")
        self.calls = 0

    def __call__(self) -> dict[str, float]:
        seed, self.calls = self.calls, self.calls + 1
        totals = simulate(load_sim_config(self.path, [*self.overrides, f"seed={seed}"])).totals
        if "steady_mean_step_s" not in totals:  # --quick: no steady state, the whole run's figures stand in
            totals = totals | {
                "steady_samples_per_s": totals["samples_per_s"],
                "steady_mean_step_s": totals["mean_step_s"],
                "steady_mean_wait_s": totals["mean_wait_s"],
                "steady_num_steps": totals["num_steps"],
            }
        return {metric: float(totals[metric]) for metric in METRICS}


def claimed_labels(figure: Figure) -> list[str]:
    """The arms some claim of ``figure`` reads, in the figure's order."""
    used = {label for claim in figure.claims for label in (claim.numerator, claim.denominator)}
    return [label for label in figure.arms if label in used]


def run_figure(
    name: str, figure: Figure, repeats: int, quick: bool, claims_only: bool = False
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """One figure's raw runs (arms ``NAME/LABEL``), its claims as result points, and its record."""
    labels = list(figure.arms)[:2] if quick else list(figure.arms)
    if claims_only:
        labels = [label for label in labels if label in claimed_labels(figure)]
    arms = {f"{name}/{label}": SeededArm(figure.config, figure.arms[label], quick) for label in labels}
    start = time.perf_counter()
    raw = harness.run_arms(arms, repeats, harness.print_run)
    record = figure_record(figure, labels, time.perf_counter() - start)
    return raw, figure_points(name, figure, raw, record), record


def figure_record(figure: Figure, labels: list[str], wall_s: float) -> dict[str, Any]:
    """What a figure ran: its config, its arms, the length model and the assumption it states, wall time."""
    lengths = load_sim_config(str(EXAMPLES / f"{figure.config}.yaml")).lengths
    if not lengths.assumption:
        raise ValueError(f"{figure.config}.yaml: lengths.assumption must say what the length model assumes")
    return {
        "title": figure.title,
        "config": f"{EXAMPLES}/{figure.config}.yaml",
        "arms": {label: list(figure.arms[label]) for label in labels},
        "lengths": {
            "distribution": lengths.distribution,
            "mean": lengths.mean,
            "sigma": lengths.sigma,
            "prompt_sigma": lengths.prompt_sigma,
            "assumption": lengths.assumption,
        },
        "wall_s": wall_s,
    }


def figure_points(
    name: str, figure: Figure, raw: Mapping[str, list[dict[str, float]]], record: dict[str, Any]
) -> list[dict[str, Any]]:
    """The claims of ``figure`` whose arms ran (``raw``), as result points; the best split into ``record``."""
    labels = [label for label in figure.arms if f"{name}/{label}" in raw]
    points = []
    for claim in figure.claims:
        if not {claim.numerator, claim.denominator} <= set(labels):
            continue
        ratio = harness.paired_ratio(
            raw, f"{name}/{claim.numerator}", f"{name}/{claim.denominator}", claim.metric
        )
        predicted = {key: ratio[key] for key in ("min", "median", "max", "runs")}
        points.append(
            {
                "source": SOURCE,
                "figure": figure.title,
                "setting": claim.setting,
                "reported": claim.reported,
                "quote": claim.quote,
                "predicted": predicted,
                "ratio": {
                    "numerator": claim.numerator,
                    "denominator": claim.denominator,
                    "metric": claim.metric,
                },
                "within_tolerance": abs(predicted["median"] / claim.reported - 1) <= TOLERANCE,
            }
        )
    if figure.best_of and set(figure.best_of) <= set(labels):
        record["best"] = best_per_seed(raw, name, figure)
    return points


def best_per_seed(raw: Mapping[str, list[dict[str, float]]], name: str, figure: Figure) -> dict[str, Any]:
    """The arm with the highest throughput among ``figure.best_of``, per seed, beside the report's."""
    repeats = len(raw[f"{name}/{figure.best_of[0]}"])
    best = [
        max(figure.best_of, key=lambda label: raw[f"{name}/{label}"][seed]["steady_samples_per_s"])
        for seed in range(repeats)
    ]
    return {
        "predicted_per_seed": best,
        "reported": figure.best_reported,
        "agrees": all(b == figure.best_reported for b in best),
    }


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "paper_tables")
    parser.add_argument("--figures", default=",".join(figures()), help="comma-separated figure names")
    parser.add_argument("--claims-only", action="store_true", help="run only the arms some claim reads")
    parser.add_argument(
        "--merge", nargs="+", metavar="RESULT", help="join results of separate --figures runs"
    )
    args = parser.parse_args()
    if args.merge:
        merge(args, [json.loads(Path(path).read_text()) for path in args.merge])
        return
    known, chosen = figures(), args.figures.split(",")
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise SystemExit(f"unknown figures {unknown}; known: {', '.join(known)}")
    repeats, start = harness.repeats_for(args), time.perf_counter()
    raw: dict[str, Any] = {}
    points: list[dict[str, Any]] = []
    records: dict[str, Any] = {}
    for name in chosen:
        figure_raw, new_points, records[name] = run_figure(
            name, known[name], repeats, args.quick, args.claims_only
        )
        raw |= figure_raw
        points += new_points
    write(args, raw, points, records, chosen, repeats, time.perf_counter() - start)


def write(
    args: Any,
    raw: Mapping[str, Any],
    points: list[dict[str, Any]],
    records: dict[str, Any],
    chosen: list[str],
    repeats: int,
    wall_s: float,
    commit: str | None = None,
) -> None:
    within = sum(point["within_tolerance"] for point in points)
    extra = {
        "points": points,
        "figures": records,
        "choices": list(CHOICES),
        "within_tolerance": {"count": within, "of": len(points), "tolerance": TOLERANCE},
        "run_wall_s": wall_s,
    }
    resources = {
        "all_arms": "one process, one thread (the simulator is single-threaded Python); virtual time"
    }
    setup = {"seeds": list(range(repeats)), "figures": chosen}
    result = harness.write_result(args, "paper_tables", raw, resources=resources, setup=setup, extra=extra)
    if commit is not None:  # a merge records the commit its parts ran at, not the one it was joined at
        result["commit"] = commit
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def merge(args: Any, parts: list[dict[str, Any]]) -> None:
    """One result from ``parts`` (separate ``--figures`` runs at one commit): their runs, figure records and
    wall times joined, every claim's point computed again from the runs."""
    commits = {part["commit"] for part in parts}
    if len(commits) != 1 or any(part["quick"] for part in parts):
        raise SystemExit(f"merge: parts must be full runs at one commit, got {sorted(commits)}")
    known, raw, records, chosen = figures(), {}, {}, []
    for part in parts:
        for arm, metrics in part["arms"].items():
            runs = zip(*(metrics[metric]["runs"] for metric in METRICS), strict=True)
            raw[arm] = [dict(zip(METRICS, values, strict=True)) for values in runs]
        records |= part["figures"]
        chosen += part["setup"]["figures"]
    points = []
    for name in chosen:
        part_record = records[name]
        record = figure_record(known[name], list(part_record["arms"]), part_record["wall_s"])
        records[name] = record
        points += figure_points(name, known[name], raw, record)
    repeats = min(len(runs) for runs in raw.values())
    wall_s = sum(part["run_wall_s"] for part in parts)
    write(args, raw, points, records, chosen, repeats, wall_s, commits.pop())


if __name__ == "__main__":
    main()
