"""Simulator validation: calibrate from micro-measurements of the bare parts, then predict real runs it never saw.

The real runs are ``bench/async_vs_sync.py``'s (its runtime and helpers: the shipped ``tiny-count`` model on the
``count`` task, ``runtime.type=local``, the engine and the trainer Ray actors with one core and one torch
thread each), in seven configurations: ``sync`` (batch generation, roles on separate cores), ``async`` at
α = 1 and α = 2 on the same batch (8 prompts × 4 samples), ``sync`` and ``async`` α = 2 on a wider batch
(16 × 4), and ``sync`` and ``async`` α = 2 on ``async_vs_sync``'s generation-bound workload (``_filtered``:
only groups whose rewards differ are trained, twice the decode slots). Each runs ``--repeats`` times, interleaved through ``harness.run_arms``; its metric is the steady
step time (wall time after the warm-up steps / steps).

Calibration touches none of those runs (``asyncrl.sim.calibrate``), and uses the thread count the real
engine and trainer actors get (``runtime.placement``):
- decode: the bare ``LLMEngine`` stepping batches of 1-64 fixed-length requests; a line ``a + b · batch``
  through the decode steps, prefill per prompt token from the first steps;
- training: the bare ``Trainer`` (the runs' trainer, loss and advantage settings) on synthetic batches of
  two sizes and two response lengths; a line through (tokens, seconds) gives the per-token cost and the
  fixed overhead;
- contention: the same train step timed again while a separate process decodes with the bare engine
  (``trainer.concurrent_slowdown``; the async runs overlap the two);
- weight sync: the trainer's weights published through the ``object_store`` transport's flat buffers
  (in-process, without Ray's object store) and loaded into the bare engine;
- response lengths: a short generation pass of the bare engine over task prompts drawn with another seed,
  replayed per response as an empirical distribution; prompt length: that pass's mean prompt;
- pass rates: that pass's responses scored by the run's reward, a Beta fitted to the per-prompt pass rates
  (``calibrate.fit_pass_rates``), which decides how many groups the filtered runs drop. The simulator draws
  rewards independently of lengths, so a correlation between the two (long answers failing more) is not
  replayed.
Each configuration is then simulated with the real run's own ``rollout``, ``buffer``, ``controller`` and
``proxy`` sections. Reported per configuration: real step time (min/median/max), simulated step time, the
error against the median and whether the prediction lies within the real spread; and the async/sync speedup,
real (per paired repeat) against simulated.

What the calibration cannot see, by design: the runtime's own per-step costs (Ray calls, the driver's
producer, rewards and proxy on the shared cores). The error column is how much they weigh.

    python bench/sim_vs_real.py [--quick] [--repeats 3] [--out bench/results/sim_vs_real.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/sim_vs_real.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import copy
import dataclasses
import multiprocessing
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from asyncrl.app.simulate import simulate
from asyncrl.config.run import RunConfig
from asyncrl.config.sim import LengthConfig, SimConfig, SimEngineConfig, SimRewardConfig, SimTrainerConfig
from asyncrl.data.base import prompt_token_ids
from asyncrl.data.registry import make_task
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.models.loading import load_model_and_tokenizer, state_dict_for_sync
from asyncrl.rewards.service import make_reward_fn
from asyncrl.rollout.rlvr_producer import request_seed, response_text, sampling_params
from asyncrl.runtime.placement import plan_placement
from asyncrl.sim import calibrate
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Group, Request, SamplingParams, Trajectory
from asyncrl.weight_sync.transports import FlatBufferSync
from bench import harness
from bench.async_vs_sync import QUICK, VARIANTS, WORKLOADS, Variant, Workload, arm, run_config

NARROW, NARROW_QUICK = (
    Workload(name="narrow", prompts_per_step=8, samples_per_prompt=4, max_new_tokens=160, steps=12, warmup=3),
    Workload(
        name="narrow_quick", prompts_per_step=2, samples_per_prompt=4, max_new_tokens=64, steps=4, warmup=1
    ),
)
WIDE, WIDE_QUICK = (
    Workload(name="wide", prompts_per_step=16, samples_per_prompt=4, max_new_tokens=160, steps=12, warmup=3),
    Workload(
        name="wide_quick", prompts_per_step=4, samples_per_prompt=4, max_new_tokens=64, steps=4, warmup=1
    ),
)
FILTERED, FILTERED_QUICK = (
    dataclasses.replace(WORKLOADS["generation_bound"], name="filtered"),
    dataclasses.replace(QUICK, name="filtered_quick"),
)
"""``async_vs_sync``'s generation-bound workload: only groups whose rewards differ are trained, so the pass
rates the calibration fits decide how much a step generates."""
_BY_NAME = {v.name: v for v in VARIANTS}
SYNC = _BY_NAME["sync_batch_1thread"]
ASYNC_A1 = Variant("async_a1", ("controller.mode=async", "buffer.async_ratio=1"), 1.0)
ASYNC_A2 = _BY_NAME["async_a2"]
CALIBRATION_SEED = 12_345
"""Seed of the generation pass's prompt draw and sampling: not the runs' seed, so it sees other prompts."""


SPEEDUPS = {
    "async_a1_over_sync": ("async_a1", "sync"),
    "async_a2_over_sync": ("async_a2", "sync"),
    "async_a2_wide_over_sync_wide": ("async_a2_wide", "sync_wide"),
    "async_a2_filtered_over_sync_filtered": ("async_a2_filtered", "sync_filtered"),
}
"""Speedup = sync step time / async step time on the same batch shape."""


@dataclass(frozen=True)
class Prediction:
    """One predicted configuration: a mode (``Variant``) on a batch shape."""

    name: str
    variant: Variant
    work: Workload


def configurations(quick: bool) -> tuple[Prediction, ...]:
    narrow, wide, filtered = (NARROW_QUICK, WIDE_QUICK, FILTERED_QUICK) if quick else (NARROW, WIDE, FILTERED)
    return (
        Prediction("sync", SYNC, narrow),
        Prediction("async_a1", ASYNC_A1, narrow),
        Prediction("async_a2", ASYNC_A2, narrow),
        Prediction("sync_wide", SYNC, wide),
        Prediction("async_a2_wide", ASYNC_A2, wide),
        Prediction("sync_filtered", SYNC, filtered),
        Prediction("async_a2_filtered", ASYNC_A2, filtered),
    )


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """How much calibration work to do (``--quick`` shrinks it to seconds)."""

    profile_batches: tuple[int, ...]
    profile_steps: int
    train_samples: tuple[int, ...]
    train_response_tokens: tuple[int, ...]
    train_repeats: int
    pass_prompts: int
    pass_samples: int


FULL_SIZES = Sizes(
    profile_batches=(1, 2, 4, 8, 16, 32, 64),
    profile_steps=12,
    train_samples=(32, 64),
    train_response_tokens=(8, 24),
    train_repeats=3,
    pass_prompts=128,
    pass_samples=4,
)
QUICK_SIZES = Sizes(
    profile_batches=(1, 4),
    profile_steps=3,
    train_samples=(4,),
    train_response_tokens=(4, 8),
    train_repeats=1,
    pass_prompts=4,
    pass_samples=2,
)


# ---- the real runs -----------------------------------------------------------------------------------


def real_arm(prediction: Prediction, out_dir: Path, quick: bool) -> harness.Arm:
    """``async_vs_sync``'s arm for the configuration (inline in ``--quick``), reporting its steady step time."""
    variant = dataclasses.replace(prediction.variant, runtime="inline") if quick else prediction.variant
    run = arm(variant, prediction.work, out_dir)

    def measured() -> dict[str, float]:
        metrics = run()
        return {"step_s": metrics["wall_s"] / metrics["steps_measured"], **metrics}

    return measured


def threads_of(config: RunConfig) -> tuple[int, int]:
    """(engine threads, trainer threads) of the run's placement: what the micro-measurements must use."""
    placement = plan_placement(
        config.runtime, num_engines=config.rollout.num_engines, mode=config.controller.mode
    )
    return placement.engine_threads, placement.trainer_threads


# ---- micro-measurements ------------------------------------------------------------------------------


def with_threads(threads: int, measure: Callable[[], Any]) -> Any:
    """Run ``measure`` with ``threads`` torch threads, restoring the count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return measure()
    finally:
        torch.set_num_threads(before)


def profile_engine(
    model: Any, config: RunConfig, prompt_tokens: int, sizes: Sizes
) -> list[calibrate.EngineProfile]:
    """Every batch size of ``sizes``: first (prefill) and median decode step of the bare engine."""
    return [
        profile_batch(model, config, batch, prompt_tokens, sizes.profile_steps)
        for batch in sizes.profile_batches
    ]


def profile_batch(
    model: Any, config: RunConfig, batch: int, prompt_tokens: int, steps: int
) -> calibrate.EngineProfile:
    engine = LLMEngine(model, None, config.engine)
    sampling = SamplingParams(max_new_tokens=steps + 1, ignore_eos=True)
    for index in range(batch):
        prompt = [(7 * index + j) % 100 + 3 for j in range(prompt_tokens)]
        engine.add_request(
            Request(request_id=f"p{batch}-{index}", prompt_token_ids=prompt, sampling=sampling)
        )
    times = []
    while engine.has_work():
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    return calibrate.EngineProfile(
        batch=batch,
        prompt_tokens=prompt_tokens,
        first_step_s=times[0],
        decode_step_s=statistics.median(times[1:]),
    )


@dataclass(frozen=True)
class GenerationPass:
    """What the bare engine's pass over unseen prompts gives the calibration."""

    prompt_lengths: list[int]
    response_lengths: list[int]
    rewards_per_prompt: list[list[float]]
    """The run's reward of each prompt's ``pass_samples`` responses: the pass rates behind filtering."""


def generation_pass(model: Any, tokenizer: Any, config: RunConfig, sizes: Sizes) -> GenerationPass:
    """The bare engine sampling the task's prompts as a run does (``rollout`` sampling settings, the run's
    reward), on prompts drawn with ``CALIBRATION_SEED``."""
    samples = random.Random(CALIBRATION_SEED).sample(
        list(make_task(config.task).split("train")), sizes.pass_prompts
    )
    engine = LLMEngine(model, tokenizer, config.engine)
    prompts = []
    for p, sample in enumerate(samples):
        ids = prompt_token_ids(sample, tokenizer)
        prompts.append(len(ids))
        for i in range(sizes.pass_samples):
            sampling = sampling_params(config.rollout, request_seed(CALIBRATION_SEED, sample.uid, i))
            engine.add_request(Request(request_id=f"c{p}#{i}", prompt_token_ids=ids, sampling=sampling))
    responses, rewards = [], [[0.0] * sizes.pass_samples for _ in samples]
    reward = make_reward_fn(config.reward)
    while engine.has_work():
        for generation in engine.step():
            responses.append(generation.num_tokens)
            p, _, i = generation.request_id[1:].partition("#")
            rewards[int(p)][int(i)] = reward(response_text(generation, tokenizer), samples[int(p)])[0]
    return GenerationPass(prompts, responses, rewards)


def synthetic_groups(
    num_samples: int, group_size: int, prompt_tokens: int, response_tokens: int
) -> list[Group]:
    """A batch of ``num_samples`` made-up trajectories of fixed lengths, rewards alternating 0/1 (so GRPO
    advantages are not all zero and the loss has a gradient)."""
    gen = torch.Generator().manual_seed(num_samples * 1000 + response_tokens)
    groups = []
    for p in range(num_samples // group_size):
        prompt = torch.randint(3, 100, (prompt_tokens,), generator=gen).tolist()
        trajectories = [
            Trajectory(
                prompt_uid=f"p{p}",
                sample_index=i,
                token_ids=prompt + torch.randint(3, 100, (response_tokens,), generator=gen).tolist(),
                loss_mask=[0] * prompt_tokens + [1] * response_tokens,
                logprobs=[0.0] * prompt_tokens + [-1.0] * response_tokens,
                versions=[-1] * prompt_tokens + [0] * response_tokens,
                start_version=0,
                num_prompt_tokens=prompt_tokens,
                reward=float(i % 2),
            )
            for i in range(group_size)
        ]
        groups.append(Group(prompt_uid=f"p{p}", trajectories=trajectories))
    return groups


def bare_trainer(model: Any, config: RunConfig) -> Trainer:
    return Trainer(copy.deepcopy(model), config.trainer, config.loss, config.advantage)


def time_train_step(trainer: Trainer, groups: list[Group], repeats: int) -> list[float]:
    """``repeats`` timed train steps after one untimed (first-call allocation)."""
    trainer.train_step(groups, trainer.version)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        trainer.train_step(groups, trainer.version)
        times.append(time.perf_counter() - started)
    return times


def measure_training(
    trainer: Trainer, config: RunConfig, prompt_tokens: int, sizes: Sizes
) -> list[dict[str, float]]:
    """Median seconds of a train step at every (samples, response tokens) of ``sizes``; tokens counted as
    the simulated trainer counts them (prompt + response)."""
    rows = []
    for samples in sizes.train_samples:
        for response in sizes.train_response_tokens:
            groups = synthetic_groups(samples, config.rollout.num_return_sequences, prompt_tokens, response)
            seconds = statistics.median(time_train_step(trainer, groups, sizes.train_repeats))
            rows.append(
                {"samples": samples, "tokens": samples * (prompt_tokens + response), "seconds": seconds}
            )
    return rows


def decode_until_stopped(model_path: str, dtype: str, threads: int, stop: Any, ready: Any) -> None:
    """A separate process's bare engine decoding a full batch until ``stop`` is set (the contention load)."""
    torch.set_num_threads(threads)
    model, _ = load_model_and_tokenizer(model_path, dtype, "cpu")
    engine = LLMEngine(model)
    sampling = SamplingParams(max_new_tokens=64, ignore_eos=True)
    ready.set()
    batch = 0
    while not stop.is_set():
        batch += 1
        for index in range(32):
            engine.add_request(
                Request(request_id=f"b{batch}-{index}", prompt_token_ids=[3] * 12, sampling=sampling)
            )
        while engine.has_work() and not stop.is_set():
            engine.step()


def measure_contention(
    trainer: Trainer, config: RunConfig, groups: list[Group], threads: int, repeats: int
) -> dict:
    """Train steps timed alone, then while another process decodes with ``threads`` threads."""
    alone = time_train_step(trainer, groups, repeats)
    context = multiprocessing.get_context("spawn")
    stop, ready = context.Event(), context.Event()
    model = config.model
    decoder = context.Process(
        target=decode_until_stopped, args=(model.path, model.dtype, threads, stop, ready)
    )
    decoder.start()
    try:
        if not ready.wait(timeout=120):
            raise RuntimeError("the contention decoder did not start within 120 s")
        beside = time_train_step(trainer, groups, repeats)
    finally:
        stop.set()
        decoder.join(timeout=30)
    return {"alone_s": alone, "beside_s": beside, "slowdown": calibrate.concurrent_slowdown(alone, beside)}


def measure_weight_sync(trainer: Trainer, model: Any, config: RunConfig, repeats: int) -> list[float]:
    """Seconds to publish the trainer's weights as flat buffers and load them into a bare engine."""
    engine = LLMEngine(copy.deepcopy(model), None, config.engine)
    transport = FlatBufferSync()
    times = []
    for version in range(1, repeats + 1):
        started = time.perf_counter()
        update = transport.publish(version, state_dict_for_sync(trainer.model))
        engine.update_weights(update, version)
        times.append(time.perf_counter() - started)
    return times


def calibrate_all(config: RunConfig, sizes: Sizes) -> dict[str, Any]:
    """Every micro-measurement and the cost model fitted to it (module docstring)."""
    engine_threads, trainer_threads = threads_of(config)
    model, tokenizer = load_model_and_tokenizer(config.model.path, config.model.dtype, "cpu")
    observed = with_threads(engine_threads, lambda: generation_pass(model, tokenizer, config, sizes))
    prompt_tokens = max(1, round(statistics.fmean(observed.prompt_lengths)))
    alpha, beta = calibrate.fit_pass_rates(observed.rewards_per_prompt)
    profile = with_threads(engine_threads, lambda: profile_engine(model, config, prompt_tokens, sizes))
    trainer = bare_trainer(model, config)
    training = with_threads(trainer_threads, lambda: measure_training(trainer, config, prompt_tokens, sizes))
    train_fixed, train_per_token = calibrate.fit_line(
        [r["tokens"] for r in training], [r["seconds"] for r in training]
    )
    contention_groups = synthetic_groups(
        sizes.train_samples[0],
        config.rollout.num_return_sequences,
        prompt_tokens,
        sizes.train_response_tokens[-1],
    )
    contention = with_threads(
        trainer_threads,
        lambda: measure_contention(trainer, config, contention_groups, engine_threads, sizes.train_repeats),
    )
    sync_s = with_threads(trainer_threads, lambda: measure_weight_sync(trainer, model, config, 5))
    return {
        "threads": {"engine": engine_threads, "trainer": trainer_threads},
        "prompt_tokens": prompt_tokens,
        "response_lengths": observed.response_lengths,
        "response_length_summary": length_summary(observed.response_lengths),
        "pass_rates": {
            "alpha": alpha,
            "beta": beta,
            "prompts": len(observed.rewards_per_prompt),
            "groups_with_reward_variance": sum(len(set(r)) > 1 for r in observed.rewards_per_prompt)
            / len(observed.rewards_per_prompt),
        },
        "engine_profile": [dataclasses.asdict(row) for row in profile],
        "engine": dataclasses.asdict(calibrate.fit_engine(profile)),
        "training": training,
        "trainer": {"step_overhead_s": train_fixed, "gpu_s_per_token": train_per_token},
        "contention": contention,
        "weight_sync_s": sync_s,
    }


def length_summary(lengths: list[int]) -> dict[str, float]:
    """Count, mean, median, p99 and max of the generation pass's response lengths (for the record)."""
    ordered = sorted(lengths)
    return {
        "count": len(ordered),
        "mean": statistics.fmean(ordered),
        "median": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "max": ordered[-1],
    }


# ---- the simulation ----------------------------------------------------------------------------------


def sim_config(config: RunConfig, calibration: dict[str, Any], lengths_path: Path) -> SimConfig:
    """The real run's configuration with the calibrated cost models: its own rollout, buffer, controller and
    proxy sections, so the simulated run is scheduled exactly as the real one."""
    engine = calibration["engine"]
    return SimConfig(
        seed=0,
        num_prompts=1000,
        prompt_tokens=calibration["prompt_tokens"],
        lengths=LengthConfig(distribution="empirical", path=str(lengths_path)),
        engine=SimEngineConfig(
            decode_step_s=engine["decode_step_s"],
            decode_s_per_request=engine["decode_s_per_request"],
            knee_batch=config.engine.max_running_requests,
            prefill_s_per_token=engine["prefill_s_per_token"],
            max_running_requests=config.engine.max_running_requests,
            max_kv_tokens=config.engine.max_kv_tokens,
            max_model_len=config.engine.max_model_len,
            weight_update_s=statistics.median(calibration["weight_sync_s"]),
        ),
        reward=SimRewardConfig(
            pass_rate_alpha=calibration["pass_rates"]["alpha"],
            pass_rate_beta=calibration["pass_rates"]["beta"],
        ),
        trainer=SimTrainerConfig(
            num_gpus=1,
            gpu_s_per_token=calibration["trainer"]["gpu_s_per_token"],
            step_overhead_s=calibration["trainer"]["step_overhead_s"],
            epochs=config.trainer.ppo_epochs,
            concurrent_slowdown=calibration["contention"]["slowdown"],
        ),
        rollout=config.rollout,
        buffer=config.buffer,
        controller=config.controller,
        proxy=config.proxy,
        timeline="none",
    )


def simulated_step_s(config: SimConfig, warmup: int) -> float:
    """Steady simulated step time, as the real runs measure it: after ``warmup`` steps, wall / steps."""
    ends = [step.end_s for step in simulate(config).steps]
    return (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup)


def predictions(
    chosen: tuple[Prediction, ...], raw: dict[str, list[dict[str, float]]], calibration: dict, out_dir: Path
) -> dict[str, dict[str, Any]]:
    """Per configuration: its real step times against the simulated one (``calibrate.prediction``)."""
    lengths_path = calibrate.write_lengths_jsonl(calibration["response_lengths"], out_dir / "lengths.jsonl")
    scored = {}
    for prediction in chosen:
        config = run_config(prediction.variant, prediction.work, out_dir / "unused")
        simulated = simulated_step_s(sim_config(config, calibration, lengths_path), prediction.work.warmup)
        scored[prediction.name] = calibrate.prediction(
            [run["step_s"] for run in raw[prediction.name]], simulated
        )
    return scored


def speedups(raw: dict[str, list[dict[str, float]]], scored: dict[str, dict[str, Any]]) -> tuple[dict, dict]:
    """Real speedups per paired repeat (sync step / async step, via ``harness.paired_ratio``) and the
    simulated ones beside them."""
    real, simulated = {}, {}
    for name, (fast, slow) in SPEEDUPS.items():
        real[name] = harness.paired_ratio(raw, slow, fast, "step_s")
        sim = scored[slow]["simulated"] / scored[fast]["simulated"]
        simulated[name] = {"simulated": sim, "error_vs_median": sim / real[name]["median"] - 1}
    return real, simulated


def table(scored: dict[str, dict[str, Any]], simulated_speedups: dict, real_speedups: dict) -> dict[str, Any]:
    """The rows ``scripts/bench_docs.py`` renders beside the arms: predictions, then speedups."""
    rows = [
        [
            name,
            s["real_min"],
            s["real_median"],
            s["real_max"],
            s["simulated"],
            s["error_vs_median"],
            s["within_real_spread"],
        ]
        for name, s in scored.items()
    ]
    rows += [
        [
            name,
            real_speedups[name]["min"],
            real_speedups[name]["median"],
            real_speedups[name]["max"],
            s["simulated"],
            s["error_vs_median"],
            real_speedups[name]["min"] <= s["simulated"] <= real_speedups[name]["max"],
        ]
        for name, s in simulated_speedups.items()
    ]
    columns = [
        "configuration (step s) / speedup",
        "real min",
        "real median",
        "real max",
        "simulated",
        "error vs median",
        "within real spread",
    ]
    return {
        "title": "Predicted vs real (simulator calibrated on micro-measurements only)",
        "columns": columns,
        "rows": rows,
    }


def describe(prediction: Prediction) -> dict[str, Any]:
    """How the configuration's real run splits the cores (its placement, as the runtime plans it)."""
    config = run_config(prediction.variant, prediction.work, Path("unused"))
    return plan_placement(
        config.runtime, num_engines=config.rollout.num_engines, mode=config.controller.mode
    ).describe()


def main() -> None:
    args = harness.parser(__doc__.splitlines()[0], "sim_vs_real").parse_args()
    chosen = configurations(args.quick)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    base = run_config(SYNC, chosen[0].work, Path("unused"))
    calibration = calibrate_all(base, sizes)
    with tempfile.TemporaryDirectory(prefix="sim-vs-real-") as tmp:
        arms = {p.name: real_arm(p, Path(tmp) / p.name, args.quick) for p in chosen}
        raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
        scored = predictions(chosen, raw, calibration, Path(tmp))
    real_speedups, simulated_speedups = speedups(raw, scored)
    resources = {
        p.name: {"runtime": "inline" if args.quick else p.variant.runtime, **describe(p)} for p in chosen
    } | {
        "calibration": f"one process; engine {calibration['threads']['engine']} thread(s), trainer "
        f"{calibration['threads']['trainer']} (the real actors' counts); contention load: a second process"
    }
    setup = {p.name: vars(p.work) | {"mode_overrides": list(p.variant.overrides)} for p in chosen}
    extra = {
        "calibration": {k: v for k, v in calibration.items() if k != "response_lengths"},
        "predictions": scored,
        "speedups_simulated": simulated_speedups,
        "table": table(scored, simulated_speedups, real_speedups),
    }
    harness.write_result(
        args, "sim_vs_real", raw, ratios=real_speedups, resources=resources, setup=setup, extra=extra
    )


if __name__ == "__main__":
    main()
