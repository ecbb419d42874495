"""One training run end to end: build the parts, resume, evaluate, train with metrics and checkpoints, evaluate.

Key decision: the run's story is told by its files — ``metrics.jsonl`` per step, ``summary.json`` at the end,
checkpoints under ``checkpoints/`` — so benchmarks and the CLI summary read the same numbers.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from asyncrl.config.base import to_dict
from asyncrl.config.run import RunConfig
from asyncrl.controller.controller import StepRecord, rollout_metrics
from asyncrl.controller.evaluation import evaluate_run
from asyncrl.metrics.tracker import MetricsTracker
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.runtime.inline import Parts, build_parts, make_controller, make_proxy, make_source
from asyncrl.trainer.checkpoint import checkpoint_due


@dataclass
class TrainingSummary:
    """The headline numbers of a run (also written to ``summary.json``)."""

    mode: str
    steps: int
    wall_s: float
    train_wall_s: float
    trained_samples: int
    sync_estimate_s: float
    """What a synchronous run of the same work would take if its phases had run back to back at the measured
    speeds: engine busy time + training + weight sync. An estimate: where rollout and training share cores,
    overlapped phases each ran slower than alone, so it overstates; bench/async_vs_sync.py measures side by side."""
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    checkpoint: str
    metrics_path: str

    @property
    def reward_gain(self) -> float:
        return self.eval_after.get("eval/reward_mean", 0.0) - self.eval_before.get("eval/reward_mean", 0.0)


async def train(config: RunConfig, console: TextIO | None = sys.stdout) -> TrainingSummary:
    """Run ``config`` to completion and return its summary."""
    started = time.perf_counter()
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(to_dict(config), indent=1))
    with runtime_parts(config) as parts:
        return await _train(parts, out, started, console)


@contextlib.contextmanager
def runtime_parts(config: RunConfig) -> Iterator[Parts]:
    """The run's parts in the runtime ``config.runtime.type`` names; Ray is imported only when asked for."""
    if config.runtime.type == "inline":
        parts: Parts = build_parts(config)
        try:
            yield parts
        finally:
            parts.close()
        return
    from asyncrl.runtime.ray_runtime import build_ray_parts, ray_session

    with ray_session(config.runtime):
        parts = build_ray_parts(config, config.runtime)
        try:
            yield parts
        finally:
            parts.close()


async def _train(parts: Parts, out: Path, started: float, console: TextIO | None) -> TrainingSummary:
    config = parts.config
    source = make_source(config, parts.task)
    if config.resume:
        extra = parts.trainer.load_checkpoint(config.resume)
        source.load_state_dict(extra["prompt_source"])
    proxy = make_proxy(parts)
    try:
        return await _train_with_proxy(parts, proxy, source, out, started, console)
    finally:
        await proxy.aclose()  # its cancelled tasks end here, not as tracebacks when Ray shuts down


async def _train_with_proxy(
    parts: Parts, proxy: LLMProxy, source: PromptSource, out: Path, started: float, console: TextIO | None
) -> TrainingSummary:
    config = parts.config
    if parts.trainer.version > 0:  # the engines start from the loaded model: give them the resumed weights
        await proxy.model_update(parts.trainer.state_for_sync(), parts.trainer.version)
        await proxy.update_applied(parts.trainer.version)
    before = await _evaluate(parts, proxy, "before")
    _say(console, f"held-out reward before: {before.get('eval/reward_mean', float('nan')):.3f}")
    remaining = config.controller.num_steps - parts.trainer.step
    tracker = MetricsTracker(
        out / "metrics.jsonl",
        total_steps=config.controller.num_steps,
        append=bool(config.resume),
        console=console,
    )
    samples = [0]
    phase_s = {"train": 0.0, "sync": 0.0}
    busy_at_start = _engine_busy_s(proxy.stats())
    train_started = time.perf_counter()
    final: list[Path] = []

    def on_step(record: StepRecord) -> None:
        samples[0] += sum(len(g) for g in record.groups)
        phase_s["train"] += record.train_s
        phase_s["sync"] += record.sync_s
        tracker.log(parts.trainer.step, step_metrics(record, proxy.stats(), train_started))
        # The last step saves here, inside the loop: once the controller closes the buffer, producers end
        # their in-flight prompts as aborted, and a save after that would skip them on resume.
        last = parts.trainer.step >= config.controller.num_steps
        if last or checkpoint_due(parts.trainer.step, config.trainer.checkpoint_every):
            path = _save(parts, source, out)
            if last:
                final.append(path)

    controller = make_controller(parts, proxy, source, on_step)
    try:
        await controller.run(remaining)
    finally:
        tracker.close()
    train_wall = time.perf_counter() - train_started
    generation_busy = _engine_busy_s(proxy.stats()) - busy_at_start
    checkpoint = final[0] if final else _save(parts, source, out)
    after = await _evaluate(parts, proxy, "after")
    summary = TrainingSummary(
        mode=config.controller.mode,
        steps=parts.trainer.step,
        wall_s=time.perf_counter() - started,
        train_wall_s=train_wall,
        trained_samples=samples[0],
        sync_estimate_s=generation_busy + phase_s["train"] + phase_s["sync"],
        eval_before=before,
        eval_after=after,
        checkpoint=str(checkpoint),
        metrics_path=str(out / "metrics.jsonl"),
    )
    (out / "summary.json").write_text(json.dumps(asdict(summary), indent=1))
    return summary


MULTI_VERSION_STATS = ("num_migrations", "kv_bytes_moved", "versions_alive", "num_switches")
"""Cumulative counters of the multi_version orchestrator copied into every step's metrics."""


def _engine_busy_s(proxy_stats: dict) -> float:
    """Wall time during which any engine was generating, approximated by the busiest engine's busy time."""
    return max((engine["busy_seconds"] for engine in proxy_stats["engines"]), default=0.0)


def step_metrics(record: StepRecord, proxy_stats: dict, train_started: float) -> dict[str, float]:
    """The JSONL record of one step: rollout statistics, trainer metrics, phase times and throughput."""
    step_s = record.wait_s + record.train_s + record.sync_s
    metrics = rollout_metrics(record.groups, record.version)
    tokens = sum(t.num_response_tokens for g in record.groups for t in g.trajectories)
    metrics |= {f"train/{k}": v for k, v in record.train_metrics.items()}
    metrics |= {
        "time/step_s": step_s,
        "time/wait_s": record.wait_s,
        "time/train_s": record.train_s,
        "time/sync_s": record.sync_s,
        "time/elapsed_s": time.perf_counter() - train_started,
        "samples_per_s": metrics["samples"] / step_s,
        "tokens_per_s": tokens / step_s,
    }
    for index, engine in enumerate(proxy_stats.get("engines", [])):
        if "idle_fraction" in engine:
            metrics[f"engine{index}/idle_fraction"] = float(engine["idle_fraction"])
    for key in MULTI_VERSION_STATS:  # only the multi_version orchestrator reports these
        if key in proxy_stats:
            metrics[f"multi_version/{key}"] = float(proxy_stats[key])
    return metrics


async def _evaluate(parts: Parts, proxy: LLMProxy, tag: str) -> dict[str, float]:
    return await evaluate_run(parts.config, proxy, parts.tokenizer, parts.task, parts.rewards, tag=tag)


def _save(parts: Parts, source: PromptSource, out: Path) -> Path:
    return parts.trainer.save_checkpoint(
        out / "checkpoints",
        extra={"prompt_source": source.state_dict()},
        keep_last=parts.config.trainer.keep_last_checkpoints,
    )


def _say(console: TextIO | None, text: str) -> None:
    if console is not None:
        print(text, file=console, flush=True)
