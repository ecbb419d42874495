"""``train(config)``: one training run end to end: build the parts for the config's runtime (``app.runtimes``),
resume, evaluate, train with metrics and checkpoints, evaluate.

Key decision: the run's story is told by its files — ``metrics.jsonl`` per step, ``summary.json`` at the end,
checkpoints under ``checkpoints/`` — so benchmarks and the CLI summary read the same numbers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from asyncrl.app.context_length import with_max_model_len
from asyncrl.app.runtimes import Parts, assemble_controller, make_proxy, make_source, runtime_parts
from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.base import to_dict
from asyncrl.config.run import RunConfig
from asyncrl.controller.controller import StepRecord, held_while_engines_sleep, rollout_metrics
from asyncrl.controller.evaluation import evaluate_run
from asyncrl.controller.periodic_eval import (
    PeriodicEvaluation,
    evaluate_sets,
    is_set_metric,
    periodic_evaluation,
)
from asyncrl.controller.run_state import RunState
from asyncrl.metrics.spans import SpanRecorder
from asyncrl.metrics.tracker import MetricsTracker
from asyncrl.proxy.errors import EnginesLost
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.rollout import endpoint_record
from asyncrl.runtime.errors import TrainerDied
from asyncrl.trainer.checkpoint import checkpoint_due, complete_checkpoints, load_resume


@dataclass
class TrainingSummary:
    """The headline numbers of a run (also written to ``summary.json``)."""

    mode: str
    steps: int
    wall_s: float
    train_wall_s: float
    trained_samples: int
    phase_busy_s: dict[str, float]
    """Measured busy seconds per phase: ``generation`` (the busiest engine had a request in flight), ``train``
    and ``weight_sync`` (as the controller timed them). Not a sync-run estimate: phases overlap in async."""
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    checkpoint: str
    metrics_path: str

    @property
    def reward_gain(self) -> float:
        return self.eval_after.get("eval/reward_mean", 0.0) - self.eval_before.get("eval/reward_mean", 0.0)


async def train(
    config: RunConfig, console: TextIO | None = sys.stdout, stop: asyncio.Event | None = None
) -> TrainingSummary:
    """Run ``config`` to completion (or until ``stop`` is set: then after a final checkpoint) and return its
    summary. A trainer that dies restarts the run from its last verified checkpoint (``runtime.trainer_restarts``
    times): all its parts are built anew and it resumes exactly as ``resume=`` would; the engines too, since
    they serve weights newer than the checkpoint's and refuse older ones. An external producer's endpoint
    comes back on the same port (``rollout.endpoint_record``)."""
    started = time.perf_counter()
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config, context = with_max_model_len(config)
    if context is not None:
        _say(console, f"engine.max_model_len unset: {context.tokens} ({context.why})")
    (out / "config.json").write_text(json.dumps(to_dict(config), indent=1))
    stop = stop or asyncio.Event()
    external = config.producer == "external"
    if external:
        endpoint_record.start_run(out, resuming=bool(config.resume))
    try:
        for num_restarts in itertools.count():
            try:
                with runtime_parts(config) as parts:
                    try:
                        return await _train(parts, out, started, console, stop)
                    except EnginesLost:
                        parts.trainer.check_alive()  # TrainerDied if its death is why (engines' weights died too)
                        raise
            except TrainerDied as error:
                config = _restart_from_checkpoint(config, out, error, num_restarts, stop, console)
                if external:  # harnesses hold the endpoint's URL: the next attempt serves on the same port
                    config = replace(config, serve=endpoint_record.keep_port(config.serve, out))
        raise AssertionError("unreachable: the loop returns or raises")
    finally:
        if external:
            endpoint_record.withdraw(out)


def _restart_from_checkpoint(
    config: RunConfig,
    out: Path,
    error: TrainerDied,
    num_restarts: int,
    stop: asyncio.Event,
    console: TextIO | None,
) -> RunConfig:
    """The config that resumes from the run's newest verified checkpoint; ``error`` again when restarts are
    spent, the run was being stopped anyway, or there is no complete checkpoint to go back to. Only markers
    and listings are read here (``complete_checkpoints``): the restarted trainer's load verifies the hashes,
    and goes back further if the newest is corrupt (``load_resume``)."""
    if num_restarts >= config.runtime.trainer_restarts or stop.is_set():
        raise error
    checkpoint = next(complete_checkpoints(out / "checkpoints"), None)
    if checkpoint is None:
        raise TrainerDied(f"{error}; no complete checkpoint under {out} to restart from") from error
    _say(console, f"trainer lost ({error}); restart {num_restarts + 1} from {checkpoint}")
    return replace(config, resume=str(out))


async def _train(
    parts: Parts, out: Path, started: float, console: TextIO | None, stop: asyncio.Event
) -> TrainingSummary:
    config = parts.config
    (out / "placement.json").write_text(json.dumps(parts.locations(), indent=1))
    extra = None
    if config.resume:  # the trainer's load hashes the files (the ranks, each a share): the driver chooses;
        # off the loop, as a save: under runtime.switch the load sleeps the engines (``SwitchOnTheLoop``)
        checkpoint, extra = await asyncio.to_thread(load_resume, config.resume, parts.trainer.load_checkpoint)
        _say(console, f"resuming from {checkpoint} (step {parts.trainer.step})")
    state = RunState(
        make_source(config, parts.task), out, resumed_step=parts.trainer.step if extra else None, extra=extra
    )
    proxy = make_proxy(parts)
    try:
        return await _train_with_proxy(parts, proxy, state, out, started, console, stop)
    finally:
        state.close()
        await proxy.aclose()  # its cancelled tasks end here, not as tracebacks when Ray shuts down


async def _train_with_proxy(
    parts: Parts,
    proxy: LLMProxy,
    state: RunState,
    out: Path,
    started: float,
    console: TextIO | None,
    stop: asyncio.Event,
) -> TrainingSummary:
    config = parts.config
    if parts.trainer.version > 0:  # the engines start from the loaded model: give them the resumed weights
        resumed = await asyncio.to_thread(
            parts.trainer.state_for_sync
        )  # off the loop: the switch wakes engines
        await proxy.load_weights(resumed, parts.trainer.version)
        applied = getattr(parts.trainer, "weights_applied", None)
        if applied is not None:  # runtime.switch: the copy packed for the engines goes once they hold it
            applied(resumed)
    before = await _evaluate(parts, proxy, "before")
    _say(console, f"held-out reward before: {before.get('eval/reward_mean', float('nan')):.3f}")
    tracker = MetricsTracker(
        out / "metrics.jsonl",
        total_steps=config.controller.num_steps,
        append=bool(config.resume),
        console=console,
        config=config.metrics,
    )
    timeline = _record_timeline(parts, proxy, out) if config.metrics.timeline else None
    try:
        tracker.log_config(to_dict(config))
        # an evaluation running at the checkpoint resumed from gets its line from this one, on these weights
        pending = {k: v for k, v in before.items() if is_set_metric(k)} if state.pending_evals else {}
        summary = await _train_steps(parts, proxy, state, out, tracker, timeline, stop, pending)
        summary = replace(summary, wall_s=time.perf_counter() - started, eval_before=before)
        (out / "summary.json").write_text(json.dumps(asdict(summary), indent=1))
        tracker.log_summary(asdict(summary))
        return summary
    finally:
        tracker.close()
        if timeline is not None:
            timeline.close()


async def _train_steps(
    parts: Parts,
    proxy: LLMProxy,
    state: RunState,
    out: Path,
    tracker: MetricsTracker,
    timeline: SpanRecorder | None,
    stop: asyncio.Event,
    resumed_evals: dict[str, float],
) -> TrainingSummary:
    """The remaining steps, the final checkpoint (before the buffer closes) and the held-out evaluation;
    ``resumed_evals`` go into the first step's line."""
    config = parts.config
    totals = _RunTotals()
    busy_at_start = _engine_busy_s(proxy.stats())
    train_started = time.perf_counter()
    final: list[Path] = []

    evaluation = periodic_evaluation(config, proxy, parts.tokenizer, parts.task, parts.rewards)
    pending = (lambda: evaluation.pending_steps()) if evaluation else list

    async def on_step(record: StepRecord) -> None:
        totals.add(record)
        if timeline is not None:
            _record_step(timeline, record)
        state.record_step(parts.trainer.step, record.groups, controller.buffer.take_dropped())
        line = _step_line(record, parts, proxy, controller.buffer, state, train_started, evaluation)
        tracker.log(parts.trainer.step, line)
        if _periodic_save_due(parts.trainer.step, config, stop):
            extra = state.checkpoint_extra(controller.buffer, pending())  # no await since the step's lines
            await _save(parts, proxy, out, extra)

    controller = assemble_controller(
        parts, proxy, state.source, on_step, evaluation.after_sync if evaluation else None
    )
    state.restore_buffer(controller.buffer)
    if evaluation:
        evaluation.finished |= resumed_evals
    try:
        await controller.run(
            config.controller.num_steps - parts.trainer.step,
            stop=stop,
            before_close=lambda: _end_run(parts, proxy, state, out, controller.buffer, final, pending()),
        )
    finally:
        if evaluation:
            await evaluation.close()  # only a stopped run leaves one running (the last step waits for all)
    if timeline is not None:
        timeline.close()  # the timeline shows training; the held-out evaluation after it is not a step
    train_wall = time.perf_counter() - train_started
    generation_busy = _engine_busy_s(proxy.stats()) - busy_at_start
    after = {} if stop.is_set() else await _evaluate(parts, proxy, "after")
    checkpoint = str(final[0]) if final else ""
    return totals.summary(config, parts.trainer.step, train_wall, generation_busy, after, checkpoint, out)


def _step_line(
    record: StepRecord,
    parts: Parts,
    proxy: LLMProxy,
    buffer: SampleBuffer,
    state: RunState,
    train_started: float,
    evaluation: PeriodicEvaluation | None,
) -> dict[str, float]:
    """One step's ``metrics.jsonl`` line: the step's own numbers (``step_metrics``), the buffer's, the rewards'
    counters, the evaluations finished since the last line and what a resume restored."""
    metrics = step_metrics(record, proxy.stats(), train_started) | buffer_metrics(buffer)
    metrics |= {f"rewards/{k}": float(v) for k, v in getattr(parts.rewards, "counts", {}).items()}
    metrics |= evaluation.take_finished() if evaluation else {}
    return metrics | {f"resume/{k}": float(v) for k, v in state.restored.items()}


def _periodic_save_due(step: int, config: RunConfig, stop: asyncio.Event) -> bool:
    """Whether the step just trained saves a periodic checkpoint (``trainer.checkpoint_every``).

    The run's last step saves only the final checkpoint, taken at once after it (``_end_run``): a periodic save
    first would let the rollout, which goes on during a save, finish groups the final one then keeps, and a
    resume trains those before the earlier-admitted ones it regenerates."""
    last = step >= config.controller.num_steps or stop.is_set()
    return checkpoint_due(step, config.trainer.checkpoint_every) and not last


@dataclass
class _RunTotals:
    """What a run's summary adds up over its steps: samples trained, and the train and sync time the controller
    measured (generation's busy time comes from the engines, not from steps)."""

    samples: int = 0
    train_s: float = 0.0
    sync_s: float = 0.0

    def add(self, record: StepRecord) -> None:
        self.samples += sum(len(g) for g in record.groups)
        self.train_s += record.train_s
        self.sync_s += record.sync_s

    def summary(
        self,
        config: RunConfig,
        steps: int,
        train_wall_s: float,
        generation_busy_s: float,
        eval_after: dict[str, float],
        checkpoint: str,
        out: Path,
    ) -> TrainingSummary:
        """The run's summary, less what ``train`` adds around it (wall time, the evaluation before)."""
        return TrainingSummary(
            mode=config.controller.mode,
            steps=steps,
            wall_s=0.0,
            train_wall_s=train_wall_s,
            trained_samples=self.samples,
            phase_busy_s={"generation": generation_busy_s, "train": self.train_s, "weight_sync": self.sync_s},
            eval_before={},
            eval_after=eval_after,
            checkpoint=checkpoint,
            metrics_path=str(out / "metrics.jsonl"),
        )


def buffer_metrics(buffer: SampleBuffer) -> dict[str, float]:
    """Buffer occupancy and every drop so far by reason (stale, filtered, failed, aborted, ...)."""
    accounting = buffer.accounting()
    metrics = {
        "buffer/buffered_groups": float(accounting.num_buffered),
        "buffer/in_flight_groups": float(accounting.num_in_flight),
        "buffer/stale_in_flight_groups": float(accounting.num_stale_in_flight),
        "buffer/admitted_groups": float(accounting.num_admitted),
    }
    return metrics | {f"dropped/{kind}": float(n) for kind, n in sorted(accounting.num_dropped.items())}


def _record_timeline(parts: Parts, proxy: LLMProxy, out: Path) -> SpanRecorder:
    """A span recorder on ``out/timeline.jsonl`` fed by the engines (through the proxy) and the rewards."""
    recorder = SpanRecorder(out / "timeline.jsonl", append=bool(parts.config.resume))
    proxy.record_busy_spans(recorder.engine_span)
    parts.rewards.on_scored = recorder.reward_span
    return recorder


def _record_step(timeline: SpanRecorder, record: StepRecord) -> None:
    """The trainer's spans of the step just finished: training, then suspend → weight sync → resume.

    ``on_step`` runs right after the sync, so the step's phases end now, on the clock the controller used.
    """
    end = timeline.clock()
    timeline.add("trainer", end - record.sync_s - record.train_s, end - record.sync_s, "train")
    timeline.add("trainer", end - record.sync_s, end, "update")
    _record_switch(timeline, record, end)
    timeline.flush()


def _record_switch(timeline: SpanRecorder, record: StepRecord, end: float) -> None:
    """The colocated switch's phases (``runtime.switch``) on their own lane: sleep and reload open the train
    span, sync, offload and wake open the update span, each as long as it was timed (``colocate/*_s``)."""
    metrics = record.train_metrics
    if "colocate/sleep_s" not in metrics:
        return
    cursor = end - record.sync_s - record.train_s
    for phase in ("sleep", "reload"):
        timeline.add("colocate", cursor, cursor + metrics[f"colocate/{phase}_s"], phase)
        cursor += metrics[f"colocate/{phase}_s"]
    cursor = end - record.sync_s
    for phase in ("sync", "offload", "wake"):
        if f"colocate/{phase}_s" in metrics:
            timeline.add("colocate", cursor, cursor + metrics[f"colocate/{phase}_s"], phase)
            cursor += metrics[f"colocate/{phase}_s"]


def _engine_busy_s(proxy_stats: dict) -> float:
    """Wall time during which any engine was generating, approximated by the busiest engine's busy time."""
    return max((engine["busy_seconds"] for engine in proxy_stats["engines"]), default=0.0)


MULTI_VERSION_STATS = ("num_migrations", "kv_bytes_moved", "versions_alive", "num_switches")
"""Cumulative counters of the multi_version orchestrator copied into every step's metrics."""
RECOVERY_STATS = {
    "num_engine_restarts": "recovery/engine_restarts",
    "num_failed_restarts": "recovery/failed_restarts",
    "num_failed_probes": "recovery/failed_probes",
    "num_reclaimed": "recovery/reclaimed_requests",
    "num_retries": "recovery/rerouted_requests",
}
"""Cumulative engine-recovery counters of the proxy (when it recovers engines), as step metrics."""


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
    metrics |= weight_sync_metrics(record.transfer_s, record.transfer_bytes)
    for index, engine in enumerate(proxy_stats.get("engines", [])):
        for key in ("idle_fraction", "mean_in_flight"):
            if key in engine:
                metrics[f"engine{index}/{key}"] = float(engine[key])
    for key in MULTI_VERSION_STATS:  # only the multi_version orchestrator reports these
        if key in proxy_stats:
            metrics[f"multi_version/{key}"] = float(proxy_stats[key])
    if "num_engine_restarts" in proxy_stats:  # only a proxy that recovers engines reports these
        metrics |= {name: float(proxy_stats[key]) for key, name in RECOVERY_STATS.items()}
    return metrics


def weight_sync_metrics(seconds: float, nbytes: int) -> dict[str, float]:
    """``weight_sync/seconds``, ``/bytes`` and ``/gb_per_s`` of one step's weight transfer (see
    ``StepRecord.transfer_s``); GB/s is 0 when nothing was timed."""
    return {
        "weight_sync/seconds": seconds,
        "weight_sync/bytes": float(nbytes),
        "weight_sync/gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else 0.0,
    }


async def _evaluate(parts: Parts, proxy: LLMProxy, tag: str) -> dict[str, float]:
    """The held-out evaluation, and the eval sets of ``controller.eval_every`` at the trainer's version."""
    metrics = await evaluate_run(parts.config, proxy, parts.tokenizer, parts.task, parts.rewards, tag=tag)
    sets = await evaluate_sets(
        parts.config, proxy, parts.tokenizer, parts.task, parts.rewards, parts.trainer.step
    )
    return metrics | sets


async def _end_run(
    parts: Parts,
    proxy: LLMProxy,
    state: RunState,
    out: Path,
    buffer: SampleBuffer,
    final: list[Path],
    pending_evals: list[int],
) -> None:
    """The drops since the last step, the final checkpoint (which counts them), then the unfinished prompts
    (which it does not: a run resumed from it trains or drops them itself).

    The checkpoint's state and the unfinished lines are taken in one instant, and the buffer is closed right
    then, before the save (``_save``, off the event loop): the rollout stops at exactly the state the
    checkpoint keeps, so no prompt is drawn, finished or dropped during the save that neither the checkpoint
    nor the ledger accounts for. Closed, the producers only wind down (aborting what they had in flight)."""
    state.record_step(parts.trainer.step, [], buffer.take_dropped())
    extra = state.checkpoint_extra(buffer, pending_evals)
    state.record_unfinished(parts.trainer.step, buffer)
    buffer.close("training finished")
    final.append(await _save(parts, proxy, out, extra))


async def _save(parts: Parts, proxy: LLMProxy, out: Path, extra: dict[str, Any]) -> Path:
    """A checkpoint of the trainer, with ``extra`` (``RunState.checkpoint_extra``) beside it, saved off the
    event loop.

    Why off the loop: a save takes minutes at scale (Qwen3-8B on 8 ranks: about 115 GB written, fsynced and
    hashed, docs/reliability.md), and a loop blocked that long routes no request, collects no generation or
    reward and answers no engine control call; once it ran again, every ``wait_for`` whose deadline had passed
    meanwhile would fail even with its result in (rewards lost as timed out, engines replaced as unhealthy).

    Why the checkpoint still matches one step: the caller takes ``extra`` on the loop with no ``await`` between
    it and the step's ledger lines, as plain data (nothing the rollout goes on changing), and the controller
    awaits ``on_step`` and ``before_close`` before it trains or publishes again, so the trainer's state stays the
    step's until the save is done. The inline trainer runs the save on its training thread.

    Under ``runtime.switch`` the save sleeps the engines (``ColocatedTrainer.save_checkpoint``), as a step does:
    the proxy then holds new calls and stops the timeout clocks of those on the engines, as the controller does
    around a step (``sleeps_engines``), so a call's ``proxy.request_timeout_s`` never reads the save as an engine
    failure."""
    async with held_while_engines_sleep(parts.trainer, proxy):
        return await asyncio.to_thread(
            parts.trainer.save_checkpoint,
            out / "checkpoints",
            extra=extra,
            keep_last=parts.config.trainer.keep_last_checkpoints,
        )


def _say(console: TextIO | None, text: str) -> None:
    if console is not None:
        print(text, file=console, flush=True)
