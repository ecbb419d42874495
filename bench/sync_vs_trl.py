"""Benchmark: asyncrl's synchronous mode against TRL's ``GRPOTrainer`` on the same RL work, side by side.

Both train the same starting checkpoint (default: the shipped warm-start model) on the same prompts of the same
task, in the same order, with the same batch shape (prompts per step × group size), generation cap, sampling
(temperature 1, no top-k/top-p), optimiser (AdamW, constant lr, no weight decay, gradient clipping at 1.0),
loss (PPO-clip ε=0.2, token-mean over the batch, no KL), advantages (group mean and std) and number of steps.
Samples/s is trained samples over the wall time of the training loop (generation, reward, training and, for
asyncrl, the weight copy into its engine); model loading and evaluation are outside it. Samples per process
CPU-second (end of step 1 to end of the last step) is reported too: on a shared machine it depends far less
on other jobs than wall time does.

Held-out reward is measured by one piece of code for the start model and both results: Hugging Face
``generate`` at temperature 1, ``--eval-k`` samples per held-out prompt, scored by the task's own reward
(``asyncrl.models.sft.evaluate_by_sampling``), with the same seed.

    python bench/sync_vs_trl.py [--quick] [--repeats 2] [--profile-engine] [--out bench/results/sync_vs_trl.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402

import asyncrl.app.train as training_module  # noqa: E402
from asyncrl.app.train import train  # noqa: E402
from asyncrl.config.reward import RewardConfig  # noqa: E402
from asyncrl.config.run import load_run_config  # noqa: E402
from asyncrl.config.task import TaskConfig  # noqa: E402
from asyncrl.data.base import TaskSample, render_prompt  # noqa: E402
from asyncrl.data.registry import make_task  # noqa: E402
from asyncrl.metrics.tracker import MetricsTracker  # noqa: E402
from asyncrl.models.loading import load_model_and_tokenizer, resolve_model_path  # noqa: E402
from asyncrl.models.sft import evaluate_by_sampling  # noqa: E402
from asyncrl.rewards.service import make_reward_fn  # noqa: E402
from asyncrl.rollout.prompt_source import PromptSource  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class Setup:
    """The shared shape of both runs."""

    model_path: str
    task_type: str
    steps: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    lr: float
    seed: int
    workdir: Path

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """One framework's run: throughput, phase times and the trained model."""

    name: str
    samples: int
    train_wall_s: float
    phases_s: dict[str, float]
    step_s: list[float]
    step_ends: list[tuple[float, float]]
    model: Any
    load_before: float
    load_after: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.train_wall_s


def clocks() -> tuple[float, float]:
    """(wall, CPU time of the whole process: every thread) now, in seconds."""
    return time.perf_counter(), time.process_time()


@contextlib.contextmanager
def recording_step_ends(ends: list[tuple[float, float]]) -> Iterator[None]:
    """Record ``clocks()`` whenever asyncrl logs a step (a bench-only wrapper; asyncrl itself is unchanged)."""

    class RecordingTracker(MetricsTracker):
        def log(self, step: int, metrics: Any) -> None:
            ends.append(clocks())
            super().log(step, metrics)

    training_module.MetricsTracker = RecordingTracker
    try:
        yield
    finally:
        training_module.MetricsTracker = MetricsTracker


def load() -> float:
    """The 1-minute load average (the machine is shared; the number says how quiet it was)."""
    return os.getloadavg()[0]


def fresh_dir(path: Path) -> Path:
    """``path`` emptied: a run's metrics.jsonl is appended to, so a rerun must not find the last one's."""
    shutil.rmtree(path, ignore_errors=True)
    return path


def ordered_prompts(train_split: list[TaskSample], setup: Setup) -> list[TaskSample]:
    """The prompts asyncrl's sync mode trains on, in its order, so TRL gets exactly the same ones."""
    source = PromptSource(train_split, seed=setup.seed)
    return [source.next().sample for _ in range(setup.steps * setup.prompts_per_step)]


def asyncrl_overrides(setup: Setup, output_dir: Path) -> list[str]:
    """asyncrl's sync mode with the shared settings (its own evaluation off: both use the common one)."""
    return [
        f"model.path={setup.model_path}",
        f"task.type={setup.task_type}",
        "model.device=cpu",
        f"output_dir={output_dir}",
        f"seed={setup.seed}",
        "runtime.type=inline",
        "controller.mode=sync",
        f"controller.num_steps={setup.steps}",
        "controller.eval_prompts=0",
        f"rollout.rollout_batch_size={setup.prompts_per_step}",
        f"rollout.num_return_sequences={setup.group_size}",
        f"rollout.max_new_tokens={setup.max_new_tokens}",
        "rollout.temperature=1.0",
        f"trainer.lr={setup.lr}",
        "trainer.weight_decay=0.0",
        "trainer.schedule=constant",
        "trainer.max_grad_norm=1.0",
        "trainer.ppo_epochs=1",
        "trainer.num_mini_batches=1",
        "loss.name=ppo",
        "loss.aggregation=token-mean",
        "advantage.name=grpo",
    ]


def run_asyncrl(setup: Setup, tag: str) -> RunResult:
    """One asyncrl sync run; phase times come from its metrics.jsonl."""
    output_dir = fresh_dir(setup.workdir / f"asyncrl-{tag}")
    config = load_run_config(None, asyncrl_overrides(setup, output_dir))
    load_before, step_ends = load(), []
    with recording_step_ends(step_ends):
        summary = asyncio.run(train(config, console=None))
    rows = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines() if line.strip()]
    phases = {phase: sum(row[f"time/{phase}_s"] for row in rows) for phase in ("wait", "train", "sync")}
    model = transformers.AutoModelForCausalLM.from_pretrained(Path(summary.checkpoint) / "model")
    return RunResult(
        name="asyncrl sync",
        samples=summary.trained_samples,
        train_wall_s=summary.train_wall_s,
        phases_s=phases,
        step_s=[row["time/step_s"] for row in rows],
        step_ends=step_ends,
        model=model.eval(),
        load_before=load_before,
        load_after=load(),
    )


def trl_reward(reward_fn: Any, by_uid: dict[str, TaskSample]) -> Any:
    """A TRL reward function calling asyncrl's configured reward on each completion's own sample."""

    def asyncrl_reward(prompts: list[str], completions: list[str], uid: list[str], **_: Any) -> list[float]:
        return [reward_fn(text, by_uid[u])[0] for text, u in zip(completions, uid, strict=True)]

    return asyncrl_reward


class StepTimer(transformers.TrainerCallback):
    """Wall time of each TRL optimiser step (generation, reward and training together)."""

    def __init__(self) -> None:
        self.step_s: list[float] = []
        self.step_ends: list[tuple[float, float]] = []
        self._start = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step_s.append(time.perf_counter() - self._start)
        self.step_ends.append(clocks())


def timed_generate(model: Any, spent: list[float]) -> None:
    """Wrap ``model.generate`` on this instance so the time TRL spends generating is measured."""
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    model.generate = generate


def trl_config(setup: Setup, output_dir: Path) -> Any:
    """GRPOConfig matching asyncrl's settings: one optimiser step per prompts×group samples, no KL."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        report_to="none",
        seed=setup.seed,
        max_steps=setup.steps,
        per_device_train_batch_size=setup.samples_per_step,
        gradient_accumulation_steps=1,
        num_generations=setup.group_size,
        max_completion_length=setup.max_new_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        learning_rate=setup.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        shuffle_dataset=False,
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        disable_dropout=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def run_trl(setup: Setup, prompts: list[TaskSample], tag: str) -> RunResult:
    """One TRL GRPOTrainer run on exactly ``prompts`` (in order), rewarded by asyncrl's reward function."""
    from datasets import Dataset
    from trl import GRPOTrainer

    model, tokenizer = load_model_and_tokenizer(setup.model_path, device="cpu")
    rows = {"prompt": [render_prompt(s, tokenizer) for s in prompts], "uid": [s.uid for s in prompts]}
    reward = trl_reward(make_reward_fn(RewardConfig()), {s.uid: s for s in prompts})
    trainer = GRPOTrainer(
        model=model.train(),
        reward_funcs=[reward],
        args=trl_config(setup, fresh_dir(setup.workdir / f"trl-{tag}")),
        train_dataset=Dataset.from_dict(rows),
        processing_class=tokenizer,
    )
    timer, generate_s = StepTimer(), []
    trainer.add_callback(timer)
    timed_generate(trainer.model, generate_s)
    load_before = load()
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    samples = trainer.state.global_step * setup.samples_per_step
    return RunResult(
        name="TRL GRPOTrainer",
        samples=samples,
        train_wall_s=wall,
        phases_s={"generate": sum(generate_s), "rest": wall - sum(generate_s)},
        step_s=timer.step_s,
        step_ends=timer.step_ends,
        model=trainer.model.eval(),
        load_before=load_before,
        load_after=load(),
    )


def held_out_reward(model: Any, tokenizer: Any, held_out: list[TaskSample], args: argparse.Namespace) -> dict:
    """The common evaluation: mean reward and pass@k of temperature-1 HF ``generate`` samples."""
    result = evaluate_by_sampling(
        model, tokenizer, held_out, k=args.eval_k, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    return {
        "reward_mean": result.mean_reward,
        f"pass_at_{result.k}": result.pass_at_k,
        "response_tokens_mean": result.mean_response_tokens,
        "eval_s": result.seconds,
    }


def after_first_step(run: RunResult) -> dict:
    """Samples per wall second and per process-CPU second from the end of step 1 to the end of the last step.

    CPU seconds are what the run itself consumed (all its threads), so they say little about how busy the
    shared machine was; wall seconds include waiting for a core.
    """
    (wall0, cpu0), (wall1, cpu1) = run.step_ends[0], run.step_ends[-1]
    samples = run.samples * (len(run.step_ends) - 1) / len(run.step_ends)
    return {
        "steady_samples_per_s": round(samples / (wall1 - wall0), 3),
        "steady_samples_per_cpu_s": round(samples / (cpu1 - cpu0), 3),
        "steady_cpu_s": round(cpu1 - cpu0, 3),
    }


def describe(run: RunResult, evaluation: dict) -> dict:
    """The JSON record of one run."""
    steady = run.step_s[1:] or run.step_s
    return {
        "framework": run.name,
        "samples": run.samples,
        "train_wall_s": round(run.train_wall_s, 3),
        "samples_per_s": round(run.samples_per_s, 3),
        "step_s_median": round(statistics.median(steady), 3),
        "first_step_s": round(run.step_s[0], 3) if run.step_s else None,
        "phases_s": {k: round(v, 3) for k, v in run.phases_s.items()},
        **after_first_step(run),
        "load_before": run.load_before,
        "load_after": run.load_after,
        "held_out": evaluation,
    }


@contextlib.contextmanager
def timing_model_runner(spent: dict[str, list[float]]) -> Iterator[None]:
    """Time each prefill and decode forward of asyncrl's engine (a bench-only wrapper, removed on exit)."""
    from asyncrl.engine.model_runner import ModelRunner

    originals = {name: getattr(ModelRunner, name) for name in ("_prefill", "_decode")}

    def timed(name: str) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return originals[name](self, *args, **kwargs)
            finally:
                spent.setdefault(name, []).append(time.perf_counter() - start)

        return wrapper

    for name in originals:
        setattr(ModelRunner, name, timed(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(ModelRunner, name, original)


def profile_generation(setup: Setup, prompts: list[TaskSample]) -> dict:
    """One step's rollout (the first batch of prompts × group) through asyncrl's engine and HF ``generate``.

    Splits the engine's time into prefill (one forward per request) and batched decode forwards.
    """
    from asyncrl.engine.llm_engine import LLMEngine
    from asyncrl.types import Request, SamplingParams

    model, tokenizer = load_model_and_tokenizer(setup.model_path, device="cpu")
    batch = [s for s in prompts[: setup.prompts_per_step] for _ in range(setup.group_size)]
    engine, spent = LLMEngine(model, tokenizer), {}
    for index, sample in enumerate(batch):
        sampling = SamplingParams(max_new_tokens=setup.max_new_tokens, temperature=1.0, seed=index)
        engine.add_request(
            Request(
                request_id=str(index), prompt_token_ids=tokenizer.encode(sample.prompt), sampling=sampling
            )
        )
    start, steps = time.perf_counter(), 0
    with timing_model_runner(spent), torch.inference_mode():
        while engine.has_work():
            engine.step()
            steps += 1
    engine_s = time.perf_counter() - start
    inputs = tokenizer([s.prompt for s in batch], return_tensors="pt", padding=True)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(**inputs, max_new_tokens=setup.max_new_tokens, do_sample=True, top_k=0, pad_token_id=0)
    return {
        "requests": len(batch),
        "engine_s": round(engine_s, 3),
        "engine_steps": steps,
        "prefill_s": round(sum(spent.get("_prefill", [])), 3),
        "prefill_forwards": len(spent.get("_prefill", [])),
        "decode_s": round(sum(spent.get("_decode", [])), 3),
        "decode_forwards": len(spent.get("_decode", [])),
        "hf_generate_s": round(time.perf_counter() - start, 3),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of seconds (tiny shapes)")
    parser.add_argument(
        "--model",
        default="tiny-count",
        help="start checkpoint (a directory or a shipped name; '': the default)",
    )
    parser.add_argument("--task", default="count", help="built-in task type (the measured run: count)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--eval-prompts", type=int, default=128)
    parser.add_argument("--eval-k", type=int, default=4, help="samples per held-out prompt")
    parser.add_argument("--repeats", type=int, default=2, help="alternate the two frameworks this many times")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: robust on the shared 2-core VM)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile-engine", action="store_true", help="also time one rollout batch in detail")
    parser.add_argument("--workdir", default="/tmp/bench_sync_vs_trl")
    parser.add_argument("--out", default="bench/results/sync_vs_trl.json")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.prompts_per_step, args.group_size = 2, 2, 4
        args.max_new_tokens, args.eval_prompts, args.eval_k, args.repeats = 32, 8, 1, 1
    return args


def summarise(runs: list[dict]) -> dict:
    """Medians over repeats per framework, and the headline ratio."""
    by_name: dict[str, list[dict]] = {}
    for run in runs:
        by_name.setdefault(run["framework"], []).append(run)
    medians = {
        name: {
            "samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
            "samples_per_cpu_s": statistics.median(r["steady_samples_per_cpu_s"] for r in rs),
            "held_out_reward": statistics.median(r["held_out"]["reward_mean"] for r in rs),
        }
        for name, rs in by_name.items()
    }
    ours, theirs = medians["asyncrl sync"], medians["TRL GRPOTrainer"]
    return {
        "medians": medians,
        "samples_per_s_ratio": ours["samples_per_s"] / theirs["samples_per_s"],
        "samples_per_cpu_s_ratio": ours["samples_per_cpu_s"] / theirs["samples_per_cpu_s"],
        "reward_difference": ours["held_out_reward"] - theirs["held_out_reward"],
    }


def setup_from(args: argparse.Namespace) -> Setup:
    return Setup(
        model_path=str(resolve_model_path(args.model)),
        task_type=args.task,
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        lr=args.lr,
        seed=args.seed,
        workdir=Path(args.workdir),
    )


def evaluated(run: RunResult, tokenizer: Any, held_out: list[TaskSample], args: argparse.Namespace) -> dict:
    """The run's JSON record with its held-out reward, printed as it lands."""
    record = describe(run, held_out_reward(run.model, tokenizer, held_out, args))
    print(json.dumps(record), flush=True)
    return record


def report(args: argparse.Namespace, setup: Setup, held_out: list, before: dict, runs: list[dict]) -> dict:
    """The whole JSON result: setup, machine, start model, every run and the summary."""
    return {
        "benchmark": "sync_vs_trl",
        "quick": args.quick,
        "setup": {
            "model": setup.model_path,
            "task": args.task,
            "steps": setup.steps,
            "prompts_per_step": setup.prompts_per_step,
            "group_size": setup.group_size,
            "samples_per_step": setup.samples_per_step,
            "max_new_tokens": setup.max_new_tokens,
            "lr": setup.lr,
            "seed": setup.seed,
            "eval_prompts": len(held_out),
            "eval_k": args.eval_k,
            "threads": args.threads,
            "repeats": args.repeats,
        },
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": __import__("trl").__version__,
        },
        "start_model_held_out": before,
        "runs": runs,
        "summary": summarise(runs),
    }


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    setup = setup_from(args)
    task = make_task(TaskConfig(type=setup.task_type))
    prompts = ordered_prompts(list(task.split("train")), setup)
    held_out = list(task.split("eval"))[: args.eval_prompts]
    start_model, tokenizer = load_model_and_tokenizer(setup.model_path, device="cpu")
    before = held_out_reward(start_model, tokenizer, held_out, args)
    print(f"start model: held-out reward {before['reward_mean']:.3f}", flush=True)
    runs = []
    for repeat in range(args.repeats):
        runs.append(evaluated(run_asyncrl(setup, str(repeat)), tokenizer, held_out, args))
        runs.append(evaluated(run_trl(setup, prompts, str(repeat)), tokenizer, held_out, args))
    result = report(args, setup, held_out, before, runs)
    if args.profile_engine:
        result["generation_profile"] = profile_generation(setup, prompts)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
