"""What a simulated run measured: per-step times on the virtual clock, totals, and every worker's spans."""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from typing import Any

from asyncrl import staleness
from asyncrl.config.base import to_dict
from asyncrl.config.sim import SimConfig
from asyncrl.metrics.timeline import Timeline
from asyncrl.sim.engine import SimEngine
from asyncrl.sim.workers import SimTrainer, TrainRecord


@dataclass
class SimRun:
    """What a finished simulated run leaves behind for ``build_result``."""

    trainer: SimTrainer
    engines: list[SimEngine]
    step_ends: list[float]
    timeline: Timeline
    proxy_stats: dict
    producer_counts: dict[str, int]
    dropped: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class StepMetrics:
    """One training step; times are virtual seconds. ``wait_s`` is the trainer waiting for a batch (in sync
    mode: the generation time), ``sync_s`` the weight update until every engine serves the new version."""

    step: int
    start_s: float
    end_s: float
    wait_s: float
    train_s: float
    sync_s: float
    num_samples: int
    num_tokens: int
    mean_response_length: float
    num_truncated: int
    staleness: dict[int, int]

    @property
    def step_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """A finished simulation: ``steps`` in order, ``totals`` (see ``totals_of``), ``spans`` per worker."""

    config: dict[str, Any]
    steps: list[StepMetrics]
    totals: dict[str, float]
    spans: dict[str, list[list]] = field(default_factory=dict)
    trainer_records: list[TrainRecord] = field(default_factory=list)
    """The trainer's raw record of every step (per-sample lengths and start versions)."""

    def to_json(self) -> dict[str, Any]:
        """Plain data: config, totals and steps (spans are left to the timeline file)."""
        steps = [asdict(s) | {"step_s": s.step_s} for s in self.steps]
        return {"config": self.config, "totals": self.totals, "steps": steps}

    def summary_table(self) -> str:
        """The totals as an aligned two-column table."""
        width = max(len(key) for key in self.totals)
        return "\n".join(f"{key:<{width}}  {_fmt(value)}" for key, value in self.totals.items())


def build_result(config: SimConfig, run: SimRun, wall_s: float) -> SimResult:
    steps = step_metrics(run)
    return SimResult(
        config=to_dict(config),
        steps=steps,
        totals=totals_of(config, run, steps, wall_s),
        spans=dict(run.timeline.spans),
        trainer_records=list(run.trainer.records),
    )


def step_metrics(run: SimRun) -> list[StepMetrics]:
    """Join the trainer's records with the controller's step ends into per-step metrics."""
    steps, previous_end = [], 0.0
    for index, (record, end) in enumerate(zip(run.trainer.records, run.step_ends, strict=True)):
        lengths = record.response_lengths
        steps.append(
            StepMetrics(
                step=index + 1,
                start_s=previous_end,
                end_s=end,
                wait_s=record.start_s - previous_end,
                train_s=record.end_s - record.start_s,
                sync_s=end - record.end_s,
                num_samples=record.num_samples,
                num_tokens=record.num_tokens,
                mean_response_length=sum(lengths) / max(1, len(lengths)),
                num_truncated=record.num_truncated,
                staleness=staleness.staleness_histogram(record.start_versions, record.version),
            )
        )
        previous_end = end
    return steps


def totals_of(config: SimConfig, run: SimRun, steps: list[StepMetrics], wall_s: float) -> dict[str, float]:
    """Throughput, mean phase times, utilisation, staleness and work counts of the whole run (and, in
    ``multi_version`` mode, the migration counters)."""
    horizon = steps[-1].end_s if steps else 0.0
    samples = sum(s.num_samples for s in steps)
    tokens = sum(s.num_tokens for s in steps)
    ages: collections.Counter[int] = collections.Counter()
    for step in steps:
        ages.update(step.staleness)
    engine_busy = [run.timeline.busy_fraction(e.name, horizon) for e in run.engines]
    totals = {
        "num_gpus": float(config.num_gpus),
        "num_engines": float(len(run.engines)),
        "num_steps": float(len(steps)),
        "sim_time_s": horizon,
        "mean_step_s": horizon / max(1, len(steps)),
        "mean_wait_s": _mean([s.wait_s for s in steps]),
        "mean_train_s": _mean([s.train_s for s in steps]),
        "mean_sync_s": _mean([s.sync_s for s in steps]),
        "trained_samples": float(samples),
        "trained_tokens": float(tokens),
        "samples_per_s": samples / horizon if horizon else 0.0,
        "tokens_per_s": tokens / horizon if horizon else 0.0,
        "tokens_per_s_per_gpu": tokens / horizon / config.num_gpus if horizon else 0.0,
        "engine_busy_fraction": _mean(engine_busy),
        "trainer_busy_fraction": run.timeline.busy_fraction("trainer", horizon),
        "generated_tokens": float(sum(e.counts["tokens"] for e in run.engines)),
        "requests": float(run.producer_counts.get("requests", 0)),
        "aborted_requests": float(sum(e.counts["aborted"] for e in run.engines)),
        "preempted_requests": float(sum(e.counts.get("preempted", 0) for e in run.engines)),
        "mean_staleness": sum(a * n for a, n in ages.items()) / max(1, sum(ages.values())),
        "max_staleness": float(max(ages, default=0)),
        "wall_s": wall_s,
    }
    dropped = {f"dropped_{kind}": float(n) for kind, n in sorted(run.dropped.items())}
    return totals | dropped | multi_version_totals(run.proxy_stats) | steady_totals(config, steps)


def is_steady(step_ends: list[float], warmup: int, window: int, tolerance: float) -> bool:
    """Whether the mean step time of the last ``window`` steps is within ``tolerance`` of the ``window``
    before them, both after ``warmup`` steps (``step_ends``: virtual time at each step's end)."""
    if len(step_ends) < warmup + 2 * window:
        return False
    ends = [0.0, *step_ends]
    last = ends[-1] - ends[-1 - window]
    previous = ends[-1 - window] - ends[-1 - 2 * window]
    return previous > 0 and abs(last / previous - 1) <= tolerance


def steady_totals(config: SimConfig, steps: list[StepMetrics]) -> dict[str, float]:
    """The steady-state window's throughput and phase times: every step after ``steady_state.warmup_steps``;
    ``steady_converged`` is 1 when the run stopped because the step time settled, 0 when it hit the cap."""
    steady = config.steady_state
    window = steps[steady.warmup_steps :]
    if not steady.enabled or not window:
        return {}
    span = window[-1].end_s - window[0].start_s
    ends = [s.end_s for s in steps]
    converged = is_steady(ends, steady.warmup_steps, steady.window_steps, steady.tolerance)
    return {
        "steady_first_step": float(window[0].step),
        "steady_num_steps": float(len(window)),
        "steady_converged": float(converged),
        "steady_mean_step_s": span / len(window),
        "steady_mean_wait_s": _mean([s.wait_s for s in window]),
        "steady_mean_train_s": _mean([s.train_s for s in window]),
        "steady_samples_per_s": sum(s.num_samples for s in window) / span if span else 0.0,
        "steady_tokens_per_s": sum(s.num_tokens for s in window) / span if span else 0.0,
    }


MULTI_VERSION_TOTALS = ("num_migrations", "kv_bytes_moved", "num_switches", "max_versions_alive")
"""The orchestrator's counters a ``multi_version`` run adds to its totals."""


def multi_version_totals(proxy_stats: dict[str, Any]) -> dict[str, float]:
    """Migrations, KV bytes moved, engine switches and the widest version window of a ``multi_version`` run
    (from ``MultiVersionProxy.stats()``); empty for the other modes' ``LLMProxy``, which has none of them."""
    return {key: float(proxy_stats[key]) for key in MULTI_VERSION_TOTALS if key in proxy_stats}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _fmt(value: float) -> str:
    return f"{int(value)}" if float(value).is_integer() else f"{value:.4g}"
