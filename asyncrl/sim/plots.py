"""Charts of simulated runs: a Gantt timeline of every worker's busy spans, and a sweep's metric curves.

matplotlib is imported inside each function (Agg backend), so importing the simulator stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from asyncrl.sim.result import SimResult

COLORS = {"generate": "tab:blue", "update": "tab:orange", "train": "tab:green"}
MAX_ROWS = 48


def plot_timeline(result: SimResult, path: str | Path, title: str = "") -> Path:
    """One row per worker (the trainer and up to ``MAX_ROWS - 1`` engines), its spans coloured by kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = ["trainer"] + sorted((w for w in result.spans if w != "trainer"), key=_engine_order)
    workers = workers[:MAX_ROWS]
    fig, ax = plt.subplots(figsize=(12, 1.5 + 0.25 * len(workers)))
    for row, worker in enumerate(workers):
        for kind in COLORS:
            bars = [(s, e - s) for s, e, k in result.spans.get(worker, []) if k == kind]
            if bars:
                ax.broken_barh(bars, (row - 0.4, 0.8), color=COLORS[kind], label=kind if row < 2 else None)
    for step in result.steps:
        ax.axvline(step.end_s, color="grey", linewidth=0.5, linestyle=":")
    ax.set_yticks(range(len(workers)), workers, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (s)")
    ax.set_title(title or "busy spans per worker (dotted: step ends)")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(
        dict(zip(labels, handles, strict=False)).values(),
        dict(zip(labels, handles, strict=False)).keys(),
        loc="upper right",
        fontsize=7,
    )
    return _save(fig, path)


def plot_sweep(key: str, values: Sequence[object], results: Sequence[SimResult], path: str | Path) -> Path:
    """Mean step time and trained tokens/s against the swept value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(v) for v in values]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    left.bar(labels, [r.totals["mean_step_s"] for r in results], color="tab:blue")
    left.set_ylabel("mean step time (s)")
    right.bar(labels, [r.totals["tokens_per_s"] for r in results], color="tab:green")
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
