"""Charts of runs: a Gantt timeline of every worker's busy spans, and a sweep's metric curves.

They take plain spans and numbers, so a simulated run and a real one draw the same way.

matplotlib is imported inside each function (Agg backend), so importing the simulator stays light.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from asyncrl.metrics.timeline import is_env_worker

COLORS = {
    "generate": "tab:blue",
    "update": "tab:orange",
    "train": "tab:green",
    "env_reset": "tab:purple",
    "env_step": "tab:olive",
    "reward": "tab:cyan",
    "env_fail": "tab:red",
}
MAX_ROWS = 48
"""Rows of the Gantt chart (see ``timeline_rows`` for how the trainer, engines and envs share them)."""


def plot_timeline(
    spans: dict[str, list[list]], step_ends_s: Iterable[float], path: str | Path, title: str = ""
) -> Path:
    """A simulated run's Gantt chart (see ``plot_spans``), dotted lines at step ends."""
    return plot_spans(spans, path, step_ends=list(step_ends_s), xlabel="simulated time (s)", title=title)


def plot_spans(
    spans: dict[str, list[list]],
    path: str | Path,
    *,
    step_ends: Sequence[float] = (),
    xlabel: str = "time (s)",
    title: str = "",
) -> Path:
    """One row per worker (the trainer, engines, then envs, within ``MAX_ROWS`` as ``timeline_rows``
    chooses), its spans coloured by kind; the y-label counts the workers left out. Real runs
    (``metrics/spans.py``) and simulated ones share this drawing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 1.5 + 0.25 * len(timeline_rows(spans)[0])))
    draw_spans(ax, spans, step_ends=step_ends, xlabel=xlabel)
    ax.set_title(title or "busy spans per worker (dotted: step ends)")
    return _save(fig, path)


def draw_spans(
    ax, spans: dict[str, list[list]], *, step_ends: Sequence[float] = (), xlabel: str = ""
) -> None:
    """Draw the Gantt rows of ``spans`` on ``ax`` (one axes of a larger figure, or ``plot_spans``'s own)."""
    workers, left_out = timeline_rows(spans)
    _draw_rows(ax, workers, spans)
    for end in step_ends:
        ax.axvline(end, color="grey", linewidth=0.5, linestyle=":")
    ax.set_yticks(range(len(workers)), workers, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(left_out_label(left_out))
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, loc="upper right", fontsize=7)


def timeline_rows(workers: Iterable[str], max_rows: int = MAX_ROWS) -> tuple[list[str], dict[str, int]]:
    """(rows, left out): the trainer first (always), then engines, then envs, each in creation order, then
    the reward row of a real run, at most ``max_rows`` rows; ``left out`` counts the engines and envs beyond
    them. Engines keep at least three quarters of the rows after the trainer, envs at least the remaining
    quarter; either kind takes the rows the other does not need."""
    names = set(workers) - {"trainer"}
    shared = sorted(names & {"reward"})
    names -= set(shared)
    envs = sorted(filter(is_env_worker, names), key=_engine_order)
    engines = sorted(names.difference(envs), key=_engine_order)
    room = max_rows - 1 - len(shared)
    num_env_rows = min(len(envs), max(room - len(engines), room // 4))
    num_engine_rows = min(len(engines), room - num_env_rows)
    rows = ["trainer"] + engines[:num_engine_rows] + envs[:num_env_rows] + shared
    return rows, {"engines": len(engines) - num_engine_rows, "envs": len(envs) - num_env_rows}


def left_out_label(left_out: dict[str, int]) -> str:
    """``"not shown: 3 engines, 412 envs"`` for the non-zero counts, or ``""`` when every worker is shown."""
    parts = [f"{n} {kind}" for kind, n in left_out.items() if n]
    return f"not shown: {', '.join(parts)}" if parts else ""


def _draw_rows(ax, workers: list[str], spans: dict[str, list[list]]) -> None:
    """Each worker's spans as bars of its kind's colour; each kind is labelled once for the legend."""
    labelled: set[str] = set()
    for row, worker in enumerate(workers):
        for kind, color in COLORS.items():
            bars = [(s, e - s) for s, e, k in spans.get(worker, []) if k == kind]
            if bars:
                label = None if kind in labelled else kind
                labelled.add(kind)
                ax.broken_barh(bars, (row - 0.4, 0.8), color=color, label=label)


def plot_sweep(
    key: str, values: Sequence[object], totals: Sequence[dict[str, float]], path: str | Path
) -> Path:
    """Mean step time and trained tokens/s (each run's ``totals``) against the swept value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(v) for v in values]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    left.bar(labels, [t["mean_step_s"] for t in totals], color="tab:blue")
    left.set_ylabel("mean step time (s)")
    right.bar(labels, [t["tokens_per_s"] for t in totals], color="tab:green")
    right.set_ylabel("trained tokens / s")
    for ax in (left, right):
        ax.set_xlabel(key)
    return _save(fig, path)


def plot_sweep_grid(
    rows: tuple[str, Sequence[object]],
    cols: tuple[str, Sequence[object]],
    values: Sequence[Sequence[float]],
    path: str | Path,
    label: str = "mean step time (s)",
) -> Path:
    """A heatmap of ``values[row][col]`` over a two-key sweep, each cell annotated with its value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (row_key, row_values), (col_key, col_values) = rows, cols
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(col_values), 1.4 + 0.6 * len(row_values)))
    image = ax.imshow(values, cmap="viridis_r", aspect="auto")
    middle = (min(map(min, values)) + max(map(max, values))) / 2
    for r, line in enumerate(values):
        for c, value in enumerate(line):
            color = "white" if value > middle else "black"  # dark cells are the high values (viridis_r)
            ax.text(c, r, f"{value:.0f}", ha="center", va="center", color=color, fontsize=8)
    ax.set_xticks(range(len(col_values)), [str(v) for v in col_values])
    ax.set_yticks(range(len(row_values)), [str(v) for v in row_values])
    ax.set_xlabel(col_key)
    ax.set_ylabel(row_key)
    fig.colorbar(image, ax=ax, label=label)
    return _save(fig, path)


def _engine_order(name: str) -> tuple[int, str]:
    digits = "".join(ch for ch in name if ch.isdigit())
    return (int(digits) if digits else 0, name)


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
