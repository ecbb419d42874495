"""``asyncrl report``: PNG charts and one self-contained HTML page from run directories, real or simulated.

Key decision: a report reads only the files a run leaves (``metrics.jsonl``, ``summary.json``,
``timeline.jsonl`` for a real run; ``steps.jsonl``, ``result.json``, ``timeline.jsonl`` for a simulation)
and normalises both into one ``RunSeries``, so several runs of either kind overlay on the same axes and the
Gantt chart of each is drawn by the simulator's own plotting code. Images are embedded in the HTML as data
URIs, so the page can be mailed or attached to an issue as one file.
"""

from __future__ import annotations

import base64
import html
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.metrics.spans import Spans, busy_fractions, read_spans
from asyncrl.metrics.tracker import read_metrics


@dataclass(kw_only=True)
class RunSeries:
    """One run's per-step series (``None`` where the run did not record it) and its headline facts."""

    name: str
    kind: str
    """``real`` (asyncrl train) or ``simulated`` (asyncrl simulate)."""
    steps: list[int]
    elapsed_s: list[float]
    reward: list[float] | None
    length_mean: list[float] | None
    length_p99: list[float] | None
    staleness: dict[int, int]
    """Trained samples by age (trainer version − start version), summed over the run."""
    buffer: dict[str, list[float]] = field(default_factory=dict)
    """Per-step buffer series (``buffer/*`` metrics) where the run recorded them."""
    weight_sync: dict[str, list[float]] = field(default_factory=dict)
    """Per-step weight transfer (``weight_sync/seconds``, ``/bytes``, ``/gb_per_s``) where recorded."""
    eval_before: float | None = None
    eval_after: float | None = None
    evals: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """Evaluation during training: ``<set>/<metric>`` (mean@k, pass@k) → (policy step evaluated, value), the
    run's before and after evaluation included as its two ends."""
    facts: dict[str, Any] = field(default_factory=dict)
    spans: Spans | None = None

    @property
    def horizon_s(self) -> float:
        return self.elapsed_s[-1] if self.elapsed_s else 0.0

    def idle_by_role(self) -> dict[str, float]:
        """Mean idle fraction of each role's workers over the run (from the timeline)."""
        if not self.spans:
            return {}
        busy = busy_fractions(self.spans, max(self.horizon_s, _last_span_end(self.spans)))
        by_role: dict[str, list[float]] = {}
        for worker, fraction in busy.items():
            by_role.setdefault(_role(worker), []).append(1.0 - fraction)
        return {role: sum(v) / len(v) for role, v in by_role.items()}


def load_run(path: str | Path) -> RunSeries:
    """A run directory as a ``RunSeries``; ``ValueError`` naming the directory when it is neither kind."""
    path = Path(path)
    spans = read_spans(path / "timeline.jsonl") if (path / "timeline.jsonl").is_file() else None
    if (path / "metrics.jsonl").is_file():
        return _real_run(path, spans)
    if (path / "steps.jsonl").is_file():
        return _simulated_run(path, spans)
    raise ValueError(
        f"{path}: not a run directory (no metrics.jsonl from asyncrl train, no steps.jsonl from "
        "asyncrl simulate)"
    )


def write_report(run_dirs: list[str | Path], out_dir: str | Path, title: str = "asyncrl report") -> Path:
    """Charts of ``run_dirs`` overlaid (and one timeline per run) as PNGs plus ``index.html``; returns it."""
    runs = [load_run(path) for path in run_dirs]
    _name_uniquely(runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "reward.png": plot_reward(runs, out / "reward.png"),
        "length.png": plot_lengths(runs, out / "length.png"),
        "staleness.png": plot_staleness(runs, out / "staleness.png"),
    }
    if any(run.evals for run in runs):
        figures["eval.png"] = plot_evals(runs, out / "eval.png")
    if any(run.buffer for run in runs):
        figures["buffer.png"] = plot_buffer(runs, out / "buffer.png")
    if any(run.weight_sync for run in runs):
        figures["weight_sync.png"] = plot_weight_sync(runs, out / "weight_sync.png")
    timed = [run for run in runs if run.spans]
    if len(timed) > 1:
        figures["timelines.png"] = plot_timelines_compared(timed, out / "timelines.png")
    for index, run in enumerate(runs):
        if run.spans:
            figures[f"timeline_{index}.png"] = plot_run_timeline(run, out / f"timeline_{index}.png")
    page = out / "index.html"
    page.write_text(render_html(title, runs, figures), encoding="utf-8")
    return page


def plot_reward(runs: list[RunSeries], path: Path) -> Path:
    """Reward vs step and vs wall-clock; held-out before/after as hollow/filled markers at the ends."""
    plt, fig, (by_step, by_time) = _figure(1, 2)
    for run in runs:
        if run.reward is None:
            continue
        line = by_step.plot(run.steps, run.reward, label=run.name)[0]
        by_time.plot(run.elapsed_s, run.reward, color=line.get_color(), label=run.name)
        for value, x_step, x_time, filled in (
            (run.eval_before, 0, 0.0, False),
            (run.eval_after, run.steps[-1], run.horizon_s, True),
        ):
            if value is not None:
                face = line.get_color() if filled else "none"
                by_step.scatter([x_step], [value], edgecolors=line.get_color(), facecolors=face, zorder=3)
                by_time.scatter([x_time], [value], edgecolors=line.get_color(), facecolors=face, zorder=3)
    by_step.set(xlabel="step", ylabel="train reward (mean)", title="reward (markers: held-out before/after)")
    by_time.set(xlabel="wall-clock (s)", ylabel="train reward (mean)", title="reward vs wall-clock")
    return _save(plt, fig, path, [by_step, by_time])


def plot_evals(runs: list[RunSeries], path: Path) -> Path:
    """Held-out sets scored during training, by the step whose policy was evaluated: mean@k (left) and pass@k
    (right), one line per run and set."""
    plt, fig, (means, passes) = _figure(1, 2)
    for run in runs:
        for key, points in sorted(run.evals.items()):
            axis = means if "/mean@" in key else passes
            steps, values = zip(*sorted(points), strict=True)
            axis.plot(steps, values, marker="o", markersize=3, label=f"{run.name} {key}")
    means.set(xlabel="step evaluated", ylabel="mean reward", title="held-out sets: mean@k")
    passes.set(xlabel="step evaluated", ylabel="share of prompts", title="held-out sets: pass@k")
    return _save(plt, fig, path, [means, passes])


def plot_lengths(runs: list[RunSeries], path: Path) -> Path:
    """Mean (solid) and p99 (dashed) response length per step."""
    plt, fig, (ax,) = _figure(1, 1)
    for run in runs:
        if run.length_mean is None:
            continue
        line = ax.plot(run.steps, run.length_mean, label=f"{run.name} mean")[0]
        if run.length_p99 is not None:
            ax.plot(
                run.steps, run.length_p99, linestyle="--", color=line.get_color(), label=f"{run.name} p99"
            )
    ax.set(xlabel="step", ylabel="response tokens", title="response length")
    return _save(plt, fig, path, [ax])


def plot_staleness(runs: list[RunSeries], path: Path) -> Path:
    """Share of trained samples by age (versions behind the trainer), one bar group per run."""
    plt, fig, (ax,) = _figure(1, 1)
    ages = sorted({age for run in runs for age in run.staleness}) or [0]
    width = 0.8 / max(1, len(runs))
    for index, run in enumerate(runs):
        total = sum(run.staleness.values()) or 1
        shares = [run.staleness.get(age, 0) / total for age in ages]
        ax.bar([a + index * width for a in ages], shares, width=width, label=run.name)
    ax.set_xticks([a + 0.4 - width / 2 for a in ages], [str(a) for a in ages])
    ax.set(
        xlabel="staleness (versions behind the trainer)",
        ylabel="share of trained samples",
        title="staleness histogram",
    )
    return _save(plt, fig, path, [ax])


CUMULATIVE_BUFFER_SERIES = frozenset({"buffer/admitted_groups"})
"""``buffer/*`` metrics that count since the run started; the others are occupancy at the end of the step."""


def buffer_panels(series: dict[str, list[float]]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(occupancy series, cumulative series) of one run's ``buffer/*`` metrics.

    Why two panels: a cumulative count reaches thousands over a default run while occupancy stays in the
    tens, so on one axis occupancy reads as a flat line at zero."""
    occupancy = {key: values for key, values in series.items() if key not in CUMULATIVE_BUFFER_SERIES}
    cumulative = {key: values for key, values in series.items() if key in CUMULATIVE_BUFFER_SERIES}
    return occupancy, cumulative


def plot_buffer(runs: list[RunSeries], path: Path) -> Path:
    """Every ``buffer/*`` series each run recorded, per step: occupancy (left) and cumulative counts (right,
    on their own axis)."""
    plt, fig, (occupied, counted) = _figure(1, 2)
    for run in runs:
        for axis, panel in zip((occupied, counted), buffer_panels(run.buffer), strict=True):
            for key, values in panel.items():
                axis.plot(run.steps, values, label=f"{run.name} {key.removeprefix('buffer/')}")
    occupied.set(xlabel="step", ylabel="groups", title="buffer occupancy after each step")
    counted.set(xlabel="step", ylabel="groups", title="groups admitted since the start")
    return _save(plt, fig, path, [occupied, counted])


def plot_weight_sync(runs: list[RunSeries], path: Path) -> Path:
    """Seconds and MB of each step's weight transfer (what the trainer shipped, e.g. a delta's bytes)."""
    plt, fig, (seconds, sizes) = _figure(1, 2)
    for run in runs:
        if run.weight_sync:
            seconds.plot(run.steps, run.weight_sync["weight_sync/seconds"], label=run.name)
            sizes.plot(run.steps, [b / 1e6 for b in run.weight_sync["weight_sync/bytes"]], label=run.name)
    seconds.set(xlabel="step", ylabel="seconds", title="weight sync time per step")
    sizes.set(xlabel="step", ylabel="MB shipped", title="weight sync bytes per step")
    return _save(plt, fig, path, [seconds, sizes])


def plot_run_timeline(run: RunSeries, path: Path) -> Path:
    """The run's Gantt chart with each role's idle fraction in the title."""
    from asyncrl.metrics.plots import plot_spans

    idle = ", ".join(f"{role} {fraction:.0%}" for role, fraction in sorted(run.idle_by_role().items()))
    assert run.spans is not None
    return plot_spans(
        run.spans,
        path,
        xlabel="simulated time (s)" if run.kind == "simulated" else "wall-clock since start (s)",
        title=f"{run.name}: busy spans per worker (idle: {idle})",
    )


def plot_timelines_compared(runs: list[RunSeries], path: Path) -> Path:
    """Every run's Gantt chart stacked on one time axis, so idle gaps compare at a glance (sync vs async)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from asyncrl.metrics.plots import draw_spans, timeline_rows

    heights = [1.0 + 0.3 * len(timeline_rows(run.spans or {})[0]) for run in runs]
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, sum(heights)), sharex=True, height_ratios=heights)
    for ax, run in zip(axes, runs, strict=True):
        draw_spans(ax, run.spans or {})
        idle = ", ".join(f"{role} {fraction:.0%}" for role, fraction in sorted(run.idle_by_role().items()))
        ax.set_title(f"{run.name} ({run.kind}): idle {idle}", fontsize=9)
    axes[-1].set_xlabel("time since the first step started (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def render_html(title: str, runs: list[RunSeries], figures: dict[str, Path]) -> str:
    """The report page: a table of runs, then every figure embedded as a PNG data URI."""
    rows = "\n".join(_table_row(run) for run in runs)
    images = "\n".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{_b64(path)}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
        for name, path in figures.items()
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "run",
            "kind",
            "steps",
            "wall-clock (s)",
            "held-out before",
            "held-out after",
            "facts",
            "idle by role",
            "weight sync (median s, GB/s)",
        )
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}img{max-width:100%}</style></head>"
        f"<body><h1>{html.escape(title)}</h1><table><tr>{head}</tr>\n{rows}</table>\n{images}</body></html>"
    )


# ---- loading ---------------------------------------------------------------------------------------------


def _real_run(path: Path, spans: Spans | None) -> RunSeries:
    records = read_metrics(path / "metrics.jsonl")
    if not records:
        raise ValueError(f"{path}/metrics.jsonl: no steps recorded yet")
    summary = _read_json(path / "summary.json")
    config = _read_json(path / "config.json")
    buffer_keys = sorted({k for r in records for k in r if k.startswith("buffer/")})
    sync_keys = ("weight_sync/seconds", "weight_sync/bytes", "weight_sync/gb_per_s")
    facts = {
        "mode": config.get("controller", {}).get("mode"),
        "async_ratio": config.get("buffer", {}).get("async_ratio"),
        "trained_samples": summary.get("trained_samples"),
    }
    return RunSeries(
        name=path.name,
        kind="real",
        steps=[int(r["step"]) for r in records],
        elapsed_s=[float(r.get("time/elapsed_s", 0.0)) for r in records],
        reward=_series(records, "reward/mean"),
        length_mean=_series(records, "response_length/mean"),
        length_p99=_series(records, "response_length/p99"),
        staleness=_staleness_of_real(records),
        buffer={key: [float(r.get(key, float("nan"))) for r in records] for key in buffer_keys},
        weight_sync={key: [float(r.get(key, float("nan"))) for r in records] for key in sync_keys}
        if all(key in records[-1] for key in sync_keys)
        else {},
        eval_before=summary.get("eval_before", {}).get("eval/reward_mean"),
        eval_after=summary.get("eval_after", {}).get("eval/reward_mean"),
        evals=_eval_series([summary.get("eval_before", {}), *records, summary.get("eval_after", {})]),
        facts={k: v for k, v in facts.items() if v is not None},
        spans=spans,
    )


def _eval_series(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """``<set>/mean@k`` and ``<set>/pass@k`` points at the step each evaluation scored (``eval/<set>/step``)."""
    series: dict[str, dict[int, float]] = {}
    for record in records:
        names = {key.split("/")[1] for key in record if key.startswith("eval/") and key.count("/") == 2}
        for name in names:
            step = record.get(f"eval/{name}/step")
            means = [key for key in record if key.startswith(f"eval/{name}/mean@")]
            if step is None or not means:
                continue
            k = means[0].rsplit("@", 1)[1]
            for metric in (f"mean@{k}", f"pass@{k}"):
                if f"eval/{name}/{metric}" in record:
                    series.setdefault(f"{name}/{metric}", {})[int(step)] = float(
                        record[f"eval/{name}/{metric}"]
                    )
    return {key: sorted(points.items()) for key, points in series.items()}


def _simulated_run(path: Path, spans: Spans | None) -> RunSeries:
    with (path / "steps.jsonl").open(encoding="utf-8") as f:
        steps = [json.loads(line) for line in f if line.strip()]
    if not steps:
        raise ValueError(f"{path}/steps.jsonl: no steps recorded")
    result = _read_json(path / "result.json")
    staleness: dict[int, int] = {}
    for step in steps:
        for age, count in step.get("staleness", {}).items():
            staleness[int(age)] = staleness.get(int(age), 0) + int(count)
    config = result.get("config", {})
    facts = {
        "mode": config.get("controller", {}).get("mode"),
        "async_ratio": config.get("buffer", {}).get("async_ratio"),
        "engines": config.get("rollout", {}).get("num_engines"),
    }
    return RunSeries(
        name=path.name,
        kind="simulated",
        steps=[int(s["step"]) for s in steps],
        elapsed_s=[float(s["end_s"]) for s in steps],
        reward=None,
        length_mean=[float(s["mean_response_length"]) for s in steps],
        length_p99=None,
        staleness=staleness,
        facts={k: v for k, v in facts.items() if v is not None},
        spans=spans,
    )


def _staleness_of_real(records: list[dict[str, Any]]) -> dict[int, int]:
    totals: dict[int, int] = {}
    for record in records:
        for key, value in record.items():
            if key.startswith("staleness/age_"):
                age = int(key.removeprefix("staleness/age_"))
                totals[age] = totals.get(age, 0) + int(value)
    return totals


def _series(records: list[dict[str, Any]], key: str) -> list[float] | None:
    if not any(key in r for r in records):
        return None
    return [float(r.get(key, float("nan"))) for r in records]


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _name_uniquely(runs: list[RunSeries]) -> None:
    """Runs from directories with the same name (``a/run``, ``b/run``) get ``#2``, ``#3`` suffixes."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
        if seen[run.name] > 1:
            run.name = f"{run.name}#{seen[run.name]}"


def _role(worker: str) -> str:
    from asyncrl.metrics.timeline import is_env_worker

    if worker in ("trainer", "reward"):
        return worker
    return "envs" if is_env_worker(worker) else "engines"


def _last_span_end(spans: Spans) -> float:
    return max((end for items in spans.values() for _, end, _ in items), default=0.0)


# ---- drawing ---------------------------------------------------------------------------------------------


def _figure(rows: int, cols: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
    return plt, fig, list(axes.flat)


def _save(plt, fig, path: Path, axes: list) -> Path:
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _table_row(run: RunSeries) -> str:
    def fmt(value: float | None) -> str:
        return "–" if value is None else f"{value:.3f}"

    facts = ", ".join(f"{k}={v}" for k, v in run.facts.items())
    idle = ", ".join(f"{role} {f:.0%}" for role, f in sorted(run.idle_by_role().items())) or "no timeline"
    cells = (
        run.name,
        run.kind,
        str(run.steps[-1]),
        f"{run.horizon_s:.1f}",
        fmt(run.eval_before),
        fmt(run.eval_after),
        facts,
        idle,
        _weight_sync_cell(run),
    )
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def _weight_sync_cell(run: RunSeries) -> str:
    if not run.weight_sync:
        return "–"
    seconds = statistics.median(run.weight_sync["weight_sync/seconds"])
    speed = statistics.median(run.weight_sync["weight_sync/gb_per_s"])
    return f"{seconds:.3f} s, {speed:.2f} GB/s"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")
