"""Configuration of what a run records and where it reports: trackers, the timeline, the progress display.

Key decision: ``jsonl`` is not optional. ``metrics.jsonl`` is the run's own record (summaries, benchmarks and
``asyncrl report`` read it back); the other trackers are views of the same records for people.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TRACKERS = ("console", "jsonl", "tensorboard", "wandb")


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """Where per-step metrics, the config and the final summary go."""

    trackers: tuple[Literal["console", "jsonl", "tensorboard", "wandb"], ...] = ("console", "jsonl")
    """Sinks of every step's metrics. console: a progress bar on a terminal, one line per step otherwise.
    jsonl: ``OUTPUT_DIR/metrics.jsonl`` (required). tensorboard: event files under ``OUTPUT_DIR/tensorboard``.
    wandb: a Weights & Biases run (optional dependency ``wandb``; offline unless ``wandb_mode`` says online)."""
    wandb_project: str = "asyncrl"
    """wandb: project name."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """wandb: offline writes the run under ``OUTPUT_DIR/wandb`` for a later ``wandb sync``; online uploads."""
    timeline: bool = True
    """Record busy spans of the trainer, weight sync, engines and reward scoring to
    ``OUTPUT_DIR/timeline.jsonl`` (the simulator's format; ``asyncrl report`` draws it)."""
    progress: Literal["auto", "bar", "lines"] = "auto"
    """console: auto draws a progress bar when stdout is a terminal and plain lines otherwise (pipes, CI)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "trackers", tuple(self.trackers))
        unknown = [t for t in self.trackers if t not in TRACKERS]
        if unknown:
            raise ValueError(
                f"metrics.trackers: unknown tracker(s) {unknown}; choose from {', '.join(map(repr, TRACKERS))}"
            )
        if "jsonl" not in self.trackers:
            raise ValueError("metrics.trackers must include 'jsonl' (metrics.jsonl is the run's own record)")
        if len(set(self.trackers)) != len(self.trackers):
            raise ValueError(f"metrics.trackers lists a tracker twice: {list(self.trackers)}")
        if self.wandb_mode not in ("offline", "online"):
            raise ValueError(f"metrics.wandb_mode must be 'offline' or 'online', got {self.wandb_mode!r}")
        if self.progress not in ("auto", "bar", "lines"):
            raise ValueError(f"metrics.progress must be 'auto', 'bar' or 'lines', got {self.progress!r}")
