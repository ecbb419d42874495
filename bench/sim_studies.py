"""asyncrl's own simulator studies: every mode on the ROLL Flash Think workload (Qwen3-8B on H800, at steady
state), drain vs in-flight updates, and every mode at DORA's size (Qwen2.5-32B on 64 and 128 H800s).

The report's figures are reproduced by ``bench/paper_tables.py``; these studies have no counterpart there. Each
study is the sweep the docs name over an example config in ``asyncrl/examples/sim``, loaded and overridden
exactly as ``asyncrl simulate --sweep`` does (``asyncrl.sim.derive.load_sim_config`` and
``asyncrl.cli.simulate.swept``), and ``scripts/bench_docs.py`` renders each study's block in docs/simulator.md.
A simulation is deterministic per seed, so the harness's repeats are seeds: repeat i of every point runs with
seed i, and a paired ratio (``harness.paired_ratio``) compares two points on the same seed. Every run records
its own wall and CPU time (``wall_s``, ``cpu_s``: the machine is shared, so the CPU time is the steadier).

Writes bench/results/sim_studies.json. Run: ``python bench/sim_studies.py [--quick] [--studies all_modes]``. A run
of some studies keeps the others the ``--out`` file already holds (each study records its own commit, command
and CPU); ``--merge A.json B.json ...`` writes ``--out`` from results run apart (e.g. side by side), later
files winning, and simulates nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/sim_studies.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncrl.app.simulate import simulate
from asyncrl.cli.simulate import swept
from asyncrl.config.sim import SimConfig
from asyncrl.sim.derive import load_sim_config
from bench import harness

EXAMPLES = Path("asyncrl/examples/sim")
MODES = ("sync", "one_step_off", "async", "partial_rollout", "multi_version")
DORA_128 = ("trainer.num_gpus=64", "rollout.num_engines=16")
"""The DORA example (64 GPUs: 32 train, 8 engines of 4) at 128 GPUs, the same 1:1 split."""


@dataclass(frozen=True)
class Ratio:
    """A paired ratio a study quotes, and the report's figure for the same comparison (None: it has none)."""

    numerator: str
    denominator: str
    metric: str = "steady_mean_step_s"
    report: str | None = None


@dataclass(frozen=True)
class Study:
    """One table of docs/simulator.md: its points (label → overrides of the example ``config``), the metrics
    it shows (``steady_*``: over the steady-state window), the ratios it quotes."""

    title: str
    command: str
    config: str
    points: Mapping[str, tuple[str, ...]]
    metrics: tuple[str, ...]
    ratios: Mapping[str, Ratio] = field(default_factory=dict)
    report: str | None = None


def sweep(key: str, values: Sequence[str], *fixed: str) -> dict[str, tuple[str, ...]]:
    """One point per value, named by it, with the overrides ``asyncrl simulate --sweep KEY=...`` applies."""
    return {value: (*fixed, *swept(key, value)) for value in values}


def mode_studies() -> dict[str, Study]:
    """Every controller mode on one workload, and drain vs in-flight weight updates: asyncrl's own studies,
    with no counterpart in the report."""
    return {
        "all_modes": Study(
            title="All modes on the ROLL Flash Think workload at 256 prompts x 16 per step (8 train GPUs, 8 "
            "engines, α = 2 where the mode takes it)",
            command="asyncrl simulate asyncrl/examples/sim/roll_flash_think.yaml "
            "--sweep controller.mode=" + ",".join(MODES),
            config="roll_flash_think",
            points=sweep("controller.mode", MODES),
            metrics=(
                "steady_mean_step_s",
                "steady_tokens_per_s",
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
            title="Drain vs in-flight weight updates (`async` mode on the Think workload)",
            command="asyncrl simulate asyncrl/examples/sim/roll_flash_think.yaml controller.mode=async "
            "--sweep controller.wait_for_weight_sync=true,false",
            config="roll_flash_think",
            points=sweep(
                "controller.wait_for_weight_sync", ("true", "false"), *swept("controller.mode", "async")
            ),
            metrics=("steady_mean_step_s", "mean_sync_s", "engine_busy_fraction"),
            ratios={"wait_over_no_wait": Ratio("true", "false")},
        ),
        "dora": Study(
            title="All modes at DORA's size: Qwen2.5-32B on 64 and 128 H800s (1:1 train/infer split, engines "
            "of 4), 512 prompts x 16 per step, responses 2.4 k tokens on average up to 30 k, α = 1 where "
            "the mode takes it",
            command="asyncrl simulate asyncrl/examples/sim/dora_qwen25_32b.yaml [trainer.num_gpus=64 "
            "rollout.num_engines=16] --sweep controller.mode=" + ",".join(MODES),
            config="dora_qwen25_32b",
            points={
                f"{mode}_{gpus}": (*swept("controller.mode", mode), *extra)
                for gpus, extra in ((64, ()), (128, DORA_128))
                for mode in MODES
            },
            metrics=(
                "mean_step_s",
                "tokens_per_s",
                "engine_busy_fraction",
                "mean_staleness",
                "num_migrations",
                "max_versions_alive",
            ),
            ratios={
                "sync_over_multi_version_64": Ratio("sync_64", "multi_version_64", "mean_step_s"),
                "sync_over_multi_version_128": Ratio("sync_128", "multi_version_128", "mean_step_s"),
                "multi_version_64_over_128": Ratio("multi_version_64", "multi_version_128", "mean_step_s"),
            },
        ),
    }


def studies() -> dict[str, Study]:
    """Every study, in the order docs/simulator.md shows them."""
    return mode_studies()


def point_config(study: Study, label: str, seed: int, steps: int | None) -> SimConfig:
    """The config of one point at ``seed``: the example config with the point's overrides, as ``asyncrl
    simulate`` loads it. ``steps`` (``--quick``) replaces the steady-state run by that many steps."""
    extra = ["timeline=none"]
    if steps:
        extra += [
            f"controller.num_steps={steps}",
            "steady_state.enabled=false",
            "rollout.rollout_batch_size=16",
        ]
    path = str(EXAMPLES / f"{study.config}.yaml")
    return load_sim_config(path, [*study.points[label], *extra, f"seed={seed}"])


class SeededPoint:
    """An arm of ``harness.run_arms`` whose i-th call simulates seed i: ``run_arms`` calls every arm once
    per repeat, in order, so repeat i of every point of a study shares seed i and ratios pair equal draws."""

    def __init__(self, study: Study, label: str, steps: int | None) -> None:
        self.study, self.label, self.steps, self.calls = study, label, steps, 0

    def __call__(self) -> dict[str, float]:
        seed, self.calls = self.calls, self.calls + 1
        config = point_config(self.study, self.label, seed, self.steps)
        wall, cpu = time.perf_counter(), time.process_time()
        totals = simulate(config).totals
        spent = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        if self.steps:  # --quick: no steady state; the whole run's figures stand in
            totals = {**totals, **{f"steady_{k}": v for k, v in totals.items()}}
        # multi_version's migration counters are absent from the other modes' totals: none happened there
        return {metric: float(totals.get(metric, 0.0)) for metric in self.study.metrics} | spent


def run_study(
    name: str, study: Study, repeats: int, quick: bool, labels: Sequence[str] | None = None
) -> tuple[dict[str, list[dict[str, float]]], dict[str, Any], dict[str, Any]]:
    """One study's raw runs (arms named ``NAME/POINT``), paired ratios and record for the result; ``labels``:
    only these points (the rest can run in another process and be merged).

    ``quick`` keeps the first two points at one step: enough to exercise every code path, not a result."""
    steps = 1 if quick else None
    labels = list(study.points)[:2] if quick else list(labels or study.points)
    arms = {f"{name}/{label}": SeededPoint(study, label, steps) for label in labels}
    start = time.perf_counter()
    raw = harness.run_arms(arms, repeats, harness.print_run)
    wall_s = time.perf_counter() - start
    provenance = {
        "commit": harness.run_commit(),
        "run_command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpu_model": harness.cpu_model(),
    }
    record = {
        "title": study.title,
        "command": study.command,
        "config": f"{EXAMPLES}/{study.config}.yaml",
        "steps": point_config(study, labels[0], 0, steps).controller.num_steps,
        "points": {label: list(study.points[label]) for label in labels},
        "report": study.report,
        "wall_s": wall_s,
        **provenance,
        "point_provenance": {label: provenance for label in labels},
    }
    return raw, study_ratios(name, study, raw), record


def study_ratios(name: str, study: Study, raw: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, Any]:
    """The study's paired ratios over the points ``raw`` holds (arms ``NAME/POINT``, run i at seed i)."""
    return {
        f"{name}/{key}": harness.paired_ratio(
            raw, f"{name}/{r.numerator}", f"{name}/{r.denominator}", r.metric
        )
        | ({"report": r.report} if r.report else {})
        for key, r in study.ratios.items()
        if {f"{name}/{r.numerator}", f"{name}/{r.denominator}"} <= set(raw)
    }


def merged(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One result holding every point of every study of ``results`` (a later result's point replaces an
    earlier one's), studies and points in the order ``studies()`` lists them, each study's ratios recomputed
    over its merged points (from each repeat's run: repeat i is seed i in every result). A study that ran in
    several processes records each point's provenance and, as its wall time, the longest of them (they ran
    side by side); the rest of the record (machine, memory) is the last result's."""
    known = studies()
    holders: dict[str, list[Mapping[str, Any]]] = {}
    for result in results:
        for name in result["studies"]:
            holders.setdefault(name, []).append(result)
    order = sorted(holders, key=lambda name: list(known).index(name) if name in known else len(known))
    arms: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    records: dict[str, Any] = {}
    for name in order:
        parts = holders[name]
        records[name] = record = dict(parts[-1]["studies"][name])
        if len(parts) == 1 or name not in known:
            result = parts[-1]  # a study run before studies recorded their own provenance gets its result's
            record.setdefault("commit", result["commit"])
            record.setdefault("run_command", result["command"])
            record.setdefault("cpu_model", result["machine"]["cpu_model"])
            arms |= {arm: stats for arm, stats in result["arms"].items() if arm.startswith(f"{name}/")}
            ratios |= {key: stats for key, stats in result["ratios"].items() if key.startswith(f"{name}/")}
            continue
        study = known[name]
        ran = {label: part for part in parts for label in part["studies"][name]["points"]}
        labels = [label for label in study.points if label in ran]
        study_arms = {f"{name}/{label}": ran[label]["arms"][f"{name}/{label}"] for label in labels}
        provenance = {
            label: ran[label]["studies"][name].get("point_provenance", {}).get(label)
            or {key: ran[label]["studies"][name][key] for key in ("commit", "run_command", "cpu_model")}
            for label in labels
        }
        record |= {
            "points": {label: list(study.points[label]) for label in labels},
            "point_provenance": provenance,
            "wall_s": max(part["studies"][name]["wall_s"] for part in parts),
            "commit": parts[-1]["studies"][name]["commit"],
            "run_command": "; ".join(dict.fromkeys(p["run_command"] for p in provenance.values())),
        }
        raw = {
            arm: [{metric: stats["runs"][i] for metric, stats in metrics.items()} for i in range(len(runs))]
            for arm, metrics in study_arms.items()
            for runs in [next(iter(metrics.values()))["runs"]]
        }
        arms |= study_arms
        ratios |= study_ratios(name, study, raw)
    last = dict(results[-1])
    return last | {
        "arms": arms,
        "ratios": ratios,
        "setup": {**last["setup"], "studies": order},
        "studies": records,
    }


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "sim_studies")
    parser.add_argument("--studies", default=",".join(studies()), help="comma-separated study names")
    parser.add_argument("--points", help="comma-separated points of the one study chosen (default: all)")
    parser.add_argument(
        "--merge", nargs="+", metavar="RESULT", help="merge these results into --out, run nothing"
    )
    args = parser.parse_args()
    if args.merge:
        result = merged([json.loads(Path(path).read_text()) for path in args.merge])
        harness.check_schema(result)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return
    out = Path(args.out)
    earlier = json.loads(out.read_text()) if out.exists() and not args.quick else None
    chosen, known = args.studies.split(","), studies()
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise SystemExit(f"unknown studies {unknown}; known: {', '.join(known)}")
    points = args.points.split(",") if args.points else None
    if points and (len(chosen) != 1 or set(points) - set(known[chosen[0]].points)):
        raise SystemExit(
            f"--points names points of one study; {chosen[0]} has {', '.join(known[chosen[0]].points)}"
        )
    repeats, start = harness.repeats_for(args), time.perf_counter()
    raw: dict[str, list[dict[str, float]]] = {}
    ratios: dict[str, dict[str, Any]] = {}
    records: dict[str, Any] = {}
    for name in chosen:
        study_raw, ran_ratios, records[name] = run_study(name, known[name], repeats, args.quick, points)
        raw |= study_raw
        ratios |= ran_ratios
    resources = {
        "all_arms": "one process, one thread (the simulator is single-threaded Python); virtual time"
    }
    setup = {"seeds": list(range(repeats)), "studies": chosen}
    extra = {"studies": records, "run_wall_s": time.perf_counter() - start}
    result = harness.write_result(
        args, "sim_studies", raw, ratios=ratios, resources=resources, setup=setup, extra=extra
    )
    if earlier is not None and earlier.get("schema") == harness.SCHEMA_VERSION and "studies" in earlier:
        out.write_text(json.dumps(merged([earlier, result]), indent=1) + "\n")  # keep the studies not run


if __name__ == "__main__":
    main()
