"""Sinks for a run's records: each step's metrics, the resolved config once, the final summary once.

Key decision: one small ``Tracker`` protocol and one class per sink, chosen by name in ``metrics.trackers``,
so adding a sink never touches the training loop. Optional sinks import their library only when chosen and
say which package is missing, rather than failing at import or silently recording nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO

from asyncrl.config.metrics import MetricsConfig
from asyncrl.metrics.progress import Progress

CONSOLE_KEYS = (
    "reward/mean",
    "response_length/mean",
    "samples_per_s",
    "time/step_s",
    "staleness/max",
    "weight_sync/seconds",
)
"""The handful of numbers a person watches, in the order the console shows them."""
CONSOLE_FAULT_KEYS = {
    "recovery/engine_restarts": "engine_restarts",
    "recovery/reclaimed_requests": "reclaimed",
    "rewards/timed_out": "reward_timeouts",
}
"""Run-wide fault counters the console adds (under these names) once they are above zero: worth a glance then."""


class Tracker(Protocol):
    """One sink. ``log_config`` and ``log_summary`` are called at most once, ``log`` once per step."""

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_summary(self, summary: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonlTracker:
    """Appends one JSON object per step to ``path``, flushed at once (the run's own record)."""

    def __init__(self, path: Path, *, append: bool) -> None:
        """``append`` continues an existing file (a resumed run); otherwise it is started afresh, so a rerun
        into the same directory never mixes two runs' records."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a" if append else "w", encoding="utf-8")

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The config lives in ``config.json`` beside the file, written by the run itself."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """The summary lives in ``summary.json`` beside the file, written by the run itself."""

    def close(self) -> None:
        self._file.close()


class ConsoleTracker:
    """Steps done/total with reward, length, samples/s, step time, staleness and an ETA (see ``Progress``)."""

    def __init__(self, stream: TextIO, *, total_steps: int, mode: str = "auto") -> None:
        self._progress = Progress(total_steps, label="step", stream=stream, mode=mode)  # type: ignore[arg-type]

    def log_config(self, config: Mapping[str, Any]) -> None:
        pass

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        shown = {_console_name(k): metrics[k] for k in CONSOLE_KEYS if k in metrics}
        shown |= {name: metrics[k] for k, name in CONSOLE_FAULT_KEYS.items() if metrics.get(k)}
        self._progress.update(step, shown)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        self._progress.close()


class TensorBoardTracker:
    """Scalars per step, the config and summary as text, in event files under ``log_dir``."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # torch's writer needs the tensorboard package
            raise ValueError(
                "metrics.trackers includes 'tensorboard' but the tensorboard package is not installed "
                "(pip install tensorboard)"
            ) from err
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._writer.add_text("config", _as_code_block(config), 0)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            if _is_number(value):
                self._writer.add_scalar(key, float(value), step)
        self._writer.flush()

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self._writer.add_text("summary", _as_code_block(summary), 0)
        for key, value in flatten(summary).items():
            if _is_number(value):
                self._writer.add_scalar(f"summary/{key}", float(value), 0)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """A Weights & Biases run under ``run_dir/wandb``: offline by default (``wandb sync`` uploads it later)."""

    def __init__(self, run_dir: Path, *, project: str, mode: str, name: str) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ValueError(
                "metrics.trackers includes 'wandb' but the wandb package is not installed "
                "(pip install 'asyncrl[wandb]')"
            ) from err
        run_dir.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(silent=True, console="off")
        self._run = wandb.init(project=project, dir=str(run_dir), mode=mode, name=name, settings=settings)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log({k: v for k, v in metrics.items() if _is_number(v)}, step=step)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self._run.summary.update(flatten(summary))

    def close(self) -> None:
        self._run.finish()


def make_trackers(
    config: MetricsConfig,
    metrics_path: Path,
    *,
    total_steps: int,
    append: bool,
    console: TextIO | None,
) -> list[Tracker]:
    """The sinks ``config.trackers`` names, in that order, writing beside ``metrics_path`` (the JSONL file);
    console is left out when ``console`` is None."""
    run_dir = metrics_path.parent
    trackers: list[Tracker] = []
    for name in config.trackers:
        if name == "jsonl":
            trackers.append(JsonlTracker(metrics_path, append=append))
        elif name == "console" and console is not None:
            trackers.append(ConsoleTracker(console, total_steps=total_steps, mode=config.progress))
        elif name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir / "tensorboard"))
        elif name == "wandb":
            trackers.append(
                WandbTracker(run_dir, project=config.wandb_project, mode=config.wandb_mode, name=run_dir.name)
            )
    return trackers


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of ``a/b`` keys (the summary's ``eval_after`` → ``eval_after/eval/...``)."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten(value, f"{name}/")
        else:
            flat[name] = value
    return flat


def _console_name(key: str) -> str:
    return key.split("/")[0] if key.endswith("/mean") else key


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _plain(value: float) -> float | int | str:
    return value if isinstance(value, int | str) else float(value)


def _as_code_block(record: Mapping[str, Any]) -> str:
    """Markdown code block (TensorBoard's text plugin renders markdown), indented JSON inside."""
    return "```\n" + json.dumps(record, indent=1, default=str) + "\n```"
