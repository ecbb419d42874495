"""``asyncrl simulate [CONFIG] [KEY=VALUE ...] [--sweep KEY=V1,V2,...]``: a simulated run on the virtual clock."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asyncrl.cli.args import add_config_arguments, split_config_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate a run with cost-model engines and trainer",
        description="Run asyncrl's real producer, buffer, proxy and controller against cost-model workers on "
        "a virtual clock (docs/simulator.md). With model= and hardware= (e.g. model=qwen3-8b hardware=h800) every "
        "engine and trainer cost the config leaves unset is derived from the two (asyncrl.sim.derive). Writes "
        "OUT/result.json, OUT/steps.jsonl, OUT/timeline.jsonl and OUT/timeline.png; "
        "with --sweep, one run per value and OUT/sweep.json and OUT/sweep.png; with two --sweep options, one "
        "run per pair and a heatmap of the mean step time in OUT/sweep.png. Sweeping controller.mode sets the "
        "async ratio of the modes that fix it (sync: 0, one_step_off: 1). OUT is the output_dir key "
        "(default runs/sim).",
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="run once per value of KEY; give it twice for a grid over two keys",
    )


def run(args: argparse.Namespace) -> int:
    from asyncrl.app.simulate import simulate
    from asyncrl.config.loader import parse_override
    from asyncrl.sim.derive import load_sim_config

    path, overrides = split_config_args(args.config_args)
    config = load_sim_config(path, overrides)
    out = Path(config.output_dir)
    if not args.sweep:
        result = simulate(config)
        write_run(result, out)
        print(result.summary_table())
        print(f"outputs: {out}/result.json, {out}/steps.jsonl, {out}/timeline.jsonl, {out}/timeline.png")
        return 0
    if len(args.sweep) > 2:
        raise ValueError(f"--sweep may be given at most twice, got {len(args.sweep)}")
    sweeps = [parse_sweep(text, parse_override) for text in args.sweep]
    if len(sweeps) == 2:
        (row_key, row_values), (col_key, col_values) = sweeps
        points = [[*swept(row_key, r), *swept(col_key, c)] for r in row_values for c in col_values]
        flat = simulate_points(path, overrides, points)
        grid = [flat[i : i + len(col_values)] for i in range(0, len(flat), len(col_values))]
        write_grid((row_key, row_values), (col_key, col_values), grid, out)
        return 0
    key, values = sweeps[0]
    results = simulate_points(path, overrides, [swept(key, v) for v in values])
    write_sweep(key, values, results, out)
    return 0


def simulate_points(path: str | None, overrides: list[str], points: list[list[str]]) -> list:
    """One simulation per sweep point (its overrides added to the run's), with progress on stderr."""
    from asyncrl.app.simulate import simulate
    from asyncrl.metrics.progress import Progress
    from asyncrl.sim.derive import load_sim_config

    progress = Progress(len(points), label="sweep", stream=sys.stderr, unit="run")
    results = []
    for done, point in enumerate(points, start=1):
        results.append(simulate(load_sim_config(path, [*overrides, *point])))
        progress.update(done, {"point": " ".join(point)})
    progress.close()
    return results


def swept(key: str, value: str) -> list[str]:
    """The overrides of one swept value. A swept ``controller.mode`` that fixes α (``sync``, ``one_step_off``)
    brings its α along, so one sweep covers every mode and each config it builds is legal."""
    from asyncrl.modes import MODE_SPECS

    overrides = [f"{key}={value}"]
    spec = MODE_SPECS.get(value) if key == "controller.mode" else None
    if spec is not None and spec.fixed_async_ratio is not None:
        overrides.append(f"buffer.async_ratio={spec.fixed_async_ratio:g}")
    return overrides


def parse_sweep(text: str, parse_override) -> tuple[str, list[str]]:
    """``key=v1,v2`` into the key and its raw values (each parsed as YAML when applied)."""
    key, sep, raw = text.partition("=")
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not sep or not key or not values:
        raise ValueError(f"--sweep must look like key=v1,v2,..., got {text!r}")
    parse_override(f"{key}={values[0]}")
    return key, values


def write_run(result, out: Path) -> None:
    from asyncrl.metrics.plots import plot_timeline
    from asyncrl.metrics.spans import write_spans

    out.mkdir(parents=True, exist_ok=True)
    write_spans(result.spans, out / "timeline.jsonl")
    (out / "result.json").write_text(json.dumps(result.to_json(), indent=1))
    with (out / "steps.jsonl").open("w") as f:
        for row in result.to_json()["steps"]:
            f.write(json.dumps(row) + "\n")
    plot_timeline(result.spans, [step.end_s for step in result.steps], out / "timeline.png")


def write_sweep(key: str, values: list[str], results: list, out: Path) -> None:
    from asyncrl.metrics.plots import plot_sweep

    out.mkdir(parents=True, exist_ok=True)
    rows = [{"value": v, **r.totals} for v, r in zip(values, results, strict=True)]
    (out / "sweep.json").write_text(json.dumps({"key": key, "runs": rows}, indent=1))
    plot_sweep(key, values, [r.totals for r in results], out / "sweep.png")
    print(f"{key:>24}  {'mean_step_s':>11}  {'mean_wait_s':>11}  {'tokens_per_s':>12}  {'engine_busy':>11}")
    for row in rows:
        print(
            f"{row['value']:>24}  {row['mean_step_s']:>11.2f}  {row['mean_wait_s']:>11.2f}  "
            f"{row['tokens_per_s']:>12.1f}  {row['engine_busy_fraction']:>11.3f}"
        )
    print(f"outputs: {out}/sweep.json, {out}/sweep.png")


def write_grid(rows: tuple[str, list[str]], cols: tuple[str, list[str]], grid: list[list], out: Path) -> None:
    """A two-key sweep: OUT/sweep.json with one row per pair, and a heatmap of the mean step time."""
    from asyncrl.metrics.plots import plot_sweep_grid

    out.mkdir(parents=True, exist_ok=True)
    (row_key, row_values), (col_key, col_values) = rows, cols
    runs = [
        {row_key: r, col_key: c, **result.totals}
        for r, line in zip(row_values, grid, strict=True)
        for c, result in zip(col_values, line, strict=True)
    ]
    (out / "sweep.json").write_text(json.dumps({"keys": [row_key, col_key], "runs": runs}, indent=1))
    plot_sweep_grid(rows, cols, [[r.totals["mean_step_s"] for r in line] for line in grid], out / "sweep.png")
    print(f"{row_key:>24}  {col_key:>24}  {'mean_step_s':>11}  {'tokens_per_s':>12}")
    for run in runs:
        print(
            f"{run[row_key]:>24}  {run[col_key]:>24}  {run['mean_step_s']:>11.2f}  {run['tokens_per_s']:>12.1f}"
        )
    print(f"outputs: {out}/sweep.json, {out}/sweep.png")
