"""Benchmark: asyncrl's synchronous mode against TRL's ``GRPOTrainer`` on the same RL work, both learning.

Arms ``asyncrl_sync`` (``controller.mode=sync``, inline runtime) and ``trl_grpo`` (TRL 1.16, ``use_cpu=True``,
Hugging Face ``generate`` for rollouts) train the same start checkpoint on the same prompts in the same order
(TRL's dataset is asyncrl's own ``PromptSource`` order, ``shuffle_dataset=False``), with the same batch
(prompts per step × group size), generation cap, sampling (temperature 1, no top-k/top-p), optimiser (AdamW,
constant lr, no weight decay, clipping at 1.0), loss (PPO-clip ε = 0.2, token-mean, no KL: TRL
``loss_type="dapo"``, ``beta=0``), group-normalised advantages and reward (asyncrl's configured reward, called
by a TRL reward function). Both run in this one process with the same torch thread count, set before each run.
Repeat i uses seed i on both sides (data order, sampling, TRL's seed); arms interleave A B, B A, ...

Workload, and why: the shipped warm start ``tiny-copy`` on the ``copy`` task (the default run's pair, built to
leave RL something it can learn in minutes), 40 steps of 16 prompts × 8 = 5,120 samples, lr 5e-4 (5× the
default run's), at most 64 new tokens. The earlier version of this benchmark (``tiny-count`` on ``count``, lr
1e-4, 20 steps of 64) moved neither side's held-out reward beyond the evaluation's noise, so it timed two
runs that did not learn. In two short exploratory runs here (seeds 0 and 1, one run per side each, on a
loaded machine) the chosen settings took the held-out reward from 0.32–0.33 to 0.55–0.60 on both sides
(gains +0.21 to +0.27, against an evaluation noise of 0.03–0.04), most of it in the first 15 steps, with the
two sides' curves step for step within the noise; the default's lr 1e-4 needs ~150 steps for as much. The 64-token
cap is above every copy answer of the task (at most 40 tokens and EOS), so it cuts nothing that could be
right. The held-out split is the task's own, 512 prompts × 2 samples, as in the default run.

Metrics per run: samples/s over the training loop (start of the loop to the end of the last step:
generation, reward, training, asyncrl's weight copy; loading and evaluation outside), samples per process
CPU-second (end of step 1 to the end of the last step, all threads: far less sensitive to other jobs on a
shared machine than wall time), the phases (``rollout_s``: generating and scoring a step's samples;
``generate_s``: of that, in the generator itself; ``train_s``: the rest of the loop for TRL, the trainer's
step for asyncrl; ``other_s``: asyncrl's weight copy and controller, 0 for TRL where it is inside
``train_s``), and held-out reward before, after and at a few checkpoint steps with the wall time of the loop
at each. Held-out reward is measured by one piece of code for every model
(``asyncrl.models.sft.evaluate_by_sampling``: HF ``generate`` at temperature 1, ``eval_k`` samples per
prompt, scored by the task's reward, always seed 0); the weights at a checkpoint are a copy taken in the loop
(a few ms for this 1 M-parameter model, on both sides) and evaluated after it.

Paired per repeat: asyncrl / TRL samples/s and samples per CPU-second, and "speedup to TRL's final reward":
TRL's loop time to its first checkpoint at or above TRL's own final held-out reward, over asyncrl's time to
its first checkpoint at or above that same reward, both allowing the evaluation's noise (two standard
errors, ``1/sqrt(eval_prompts × eval_k)``), since both runs flatten out near the same reward. The headline is
that ratio on the seed-mean curves, every repeat's beside it; a repeat where asyncrl never reaches the reward is
censored (its time at least its run's length), never dropped. Checkpoints (every 5 steps) make this coarse: a
side is credited only at the first checkpoint it is seen there. ``--rederive RESULT`` derives the ratio again
from a result's stored checkpoints.

    python bench/sync_vs_trl.py [--quick] [--repeats 3] [--out bench/results/sync_vs_trl.json]
    python bench/sync_vs_trl.py --rederive bench/results/sync_vs_trl.json
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/sync_vs_trl.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import contextlib
import itertools
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
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
from asyncrl.runtime.inline import LocalTrainer  # noqa: E402
from bench import harness  # noqa: E402

EVAL_SEED = 0
"""Every evaluation samples with this seed, so two models' numbers differ by the model, not the dice."""


@dataclass(frozen=True, kw_only=True)
class Setup:
    """The shared shape of both arms' runs."""

    model_path: str
    task_type: str
    steps: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    lr: float
    threads: int
    eval_prompts: int
    eval_k: int
    checkpoints: tuple[int, ...]
    """Steps after which the weights are copied for evaluation; always includes the last step."""

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


@dataclass
class Trace:
    """What one training loop recorded: step ends on both clocks, weight copies and phase times."""

    loop_start: float = 0.0
    """When TRL's loop began (asyncrl reports loop times itself, in metrics.jsonl)."""
    step_ends: list[tuple[float, float]] = field(default_factory=list)
    """(wall, process CPU) at the end of every step."""
    snapshots: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    elapsed_at: dict[int, float] = field(default_factory=dict)
    """Loop seconds at the end of each checkpoint step."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """Loop seconds (``loop_s``) and their split into phases, as the module docstring defines them."""


def clocks() -> tuple[float, float]:
    """(wall, CPU time of the whole process: every thread) now, in seconds."""
    return time.perf_counter(), time.process_time()


def weights(model: Any) -> dict[str, torch.Tensor]:
    """A copy of every weight (the same code on both sides, taken inside the timed loop)."""
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


# ---------------------------------------------------------------- asyncrl


@contextlib.contextmanager
def tracing_asyncrl(trace: Trace, checkpoints: tuple[int, ...]) -> Iterator[None]:
    """Record step ends (a ``MetricsTracker`` subclass) and copy the weights at checkpoint steps (after the
    weight sync of the step); bench-only wrappers, removed on exit, so asyncrl itself is unchanged."""

    class RecordingTracker(MetricsTracker):
        def log(self, step: int, metrics: Any) -> None:
            trace.step_ends.append(clocks())
            super().log(step, metrics)

    original_sync = LocalTrainer.state_for_sync

    def state_for_sync(self: LocalTrainer) -> Any:
        update = original_sync(self)
        if self.trainer.step in checkpoints:
            trace.snapshots[self.trainer.step] = weights(self.trainer.model)
        return update

    training_module.MetricsTracker = RecordingTracker
    LocalTrainer.state_for_sync = state_for_sync
    try:
        yield
    finally:
        training_module.MetricsTracker = MetricsTracker
        LocalTrainer.state_for_sync = original_sync


def asyncrl_overrides(setup: Setup, seed: int, output_dir: str) -> list[str]:
    """asyncrl's sync mode with the shared settings (its own evaluation off: both use the common one)."""
    return [
        f"model.path={setup.model_path}",
        f"task.type={setup.task_type}",
        f"task.num_eval={setup.eval_prompts}",
        "model.device=cpu",
        f"output_dir={output_dir}",
        f"seed={seed}",
        "runtime.type=inline",
        # sync colocates the roles on rollout + train CPUs = ``threads`` (the engine leaves one to the driver)
        f"runtime.rollout_num_cpus={setup.threads / 2}",
        f"runtime.train_num_cpus={setup.threads / 2}",
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


def run_asyncrl(setup: Setup, seed: int) -> Trace:
    """One asyncrl sync run; loop times and phases come from its metrics.jsonl."""
    trace = Trace()
    with tempfile.TemporaryDirectory() as out:
        config = load_run_config(None, asyncrl_overrides(setup, seed, out))
        with tracing_asyncrl(trace, setup.checkpoints):
            summary = asyncio.run(train(config, console=None))
        rows = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines() if line]
    rows = [row for row in rows if "time/elapsed_s" in row]
    trace.elapsed_at = {step: rows[step - 1]["time/elapsed_s"] for step in trace.snapshots}
    loop_s = rows[-1]["time/elapsed_s"]
    rollout_s = sum(row["time/wait_s"] for row in rows)
    train_s = sum(row["time/train_s"] for row in rows)
    trace.phases_s = {
        "loop_s": loop_s,
        "rollout_s": rollout_s,
        "generate_s": summary.phase_busy_s["generation"],
        "train_s": train_s,
        "other_s": loop_s - rollout_s - train_s,
    }
    return trace


# ---------------------------------------------------------------- TRL


class TrlTracer(transformers.TrainerCallback):
    """Step ends on both clocks and weight copies at checkpoint steps, from TRL's own callback hooks."""

    def __init__(self, trace: Trace, checkpoints: tuple[int, ...]) -> None:
        self.trace = trace
        self.checkpoints = checkpoints

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trace.loop_start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step in self.checkpoints:
            self.trace.snapshots[state.global_step] = weights(kwargs["model"])
        now = clocks()
        self.trace.step_ends.append(now)
        if state.global_step in self.checkpoints:
            self.trace.elapsed_at[state.global_step] = now[0] - self.trace.loop_start


def timed(obj: Any, name: str, spent: list[float]) -> None:
    """Wrap ``obj.name`` (on this instance only) so the seconds spent in it are appended to ``spent``."""
    original = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    setattr(obj, name, wrapper)


def trl_reward(by_uid: dict[str, TaskSample]) -> Callable[..., list[float]]:
    """A TRL reward function calling asyncrl's configured reward on each completion's own sample."""
    reward_fn = make_reward_fn(RewardConfig())

    def asyncrl_reward(prompts: list[str], completions: list[str], uid: list[str], **_: Any) -> list[float]:
        return [reward_fn(text, by_uid[u])[0] for text, u in zip(completions, uid, strict=True)]

    return asyncrl_reward


def trl_config(setup: Setup, seed: int, output_dir: str) -> Any:
    """GRPOConfig matching asyncrl's settings: one optimiser step per prompts × group samples, no KL."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        report_to="none",
        seed=seed,
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


def run_trl(setup: Setup, seed: int, prompts: list[TaskSample]) -> Trace:
    """One TRL ``GRPOTrainer`` run on exactly ``prompts`` (in order)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    model, tokenizer = load_model_and_tokenizer(setup.model_path, device="cpu")
    rows = {"prompt": [render_prompt(s, tokenizer) for s in prompts], "uid": [s.uid for s in prompts]}
    trace = Trace()
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=model.train(),
            reward_funcs=[trl_reward({s.uid: s for s in prompts})],
            args=trl_config(setup, seed, out),
            train_dataset=Dataset.from_dict(rows),
            processing_class=tokenizer,
        )
        trainer.add_callback(TrlTracer(trace, setup.checkpoints))
        rollout_s: list[float] = []
        generate_s: list[float] = []
        timed(trainer, "_generate_and_score_completions", rollout_s)
        timed(trainer.model, "generate", generate_s)
        trainer.train()
    loop_s = trace.step_ends[-1][0] - trace.loop_start
    trace.phases_s = {
        "loop_s": loop_s,
        "rollout_s": sum(rollout_s),
        "generate_s": sum(generate_s),
        "train_s": loop_s - sum(rollout_s),
        "other_s": 0.0,
    }
    return trace


# ---------------------------------------------------------------- the common part


class Evaluator:
    """The one evaluation every model gets: the start model's architecture with the weights to judge."""

    def __init__(self, setup: Setup, held_out: list[TaskSample]) -> None:
        self.setup = setup
        self.held_out = held_out
        self.model, self.tokenizer = load_model_and_tokenizer(setup.model_path, device="cpu")
        self.model.eval()

    def reward(self, state: dict[str, torch.Tensor] | None = None) -> float:
        """Mean held-out reward of ``state`` (None: the start model)."""
        if state is not None:
            self.model.load_state_dict(state)
        torch.set_num_threads(self.setup.threads)
        result = evaluate_by_sampling(
            self.model,
            self.tokenizer,
            self.held_out,
            k=self.setup.eval_k,
            max_new_tokens=self.setup.max_new_tokens,
            seed=EVAL_SEED,
        )
        return result.mean_reward


def run_metrics(setup: Setup, trace: Trace, evaluator: Evaluator, reward_before: float) -> dict[str, float]:
    """One run's metrics: throughput on both clocks, phases, held-out reward at every checkpoint."""
    cpu0, cpu1 = trace.step_ends[0][1], trace.step_ends[-1][1]
    steady_samples = setup.samples_per_step * (len(trace.step_ends) - 1)
    metrics = {
        "samples_per_s": setup.samples_per_step * len(trace.step_ends) / trace.phases_s["loop_s"],
        "samples_per_cpu_s": steady_samples / max(cpu1 - cpu0, 1e-9),
        **trace.phases_s,
    }
    for step in sorted(trace.snapshots):
        metrics[f"reward_at_step_{step}"] = evaluator.reward(trace.snapshots[step])
        metrics[f"elapsed_at_step_{step}"] = trace.elapsed_at[step]
    after = metrics[f"reward_at_step_{setup.steps}"]
    return metrics | {
        "reward_before": reward_before,
        "reward_after": after,
        "reward_gain": after - reward_before,
    }


def arms(setup: Setup, task: Any, evaluator: Evaluator, reward_before: float) -> dict[str, harness.Arm]:
    """The two arms; each counts its own repeats, and repeat i runs seed i."""
    train_split = list(task.split("train"))
    seeds = {"asyncrl_sync": itertools.count(), "trl_grpo": itertools.count()}

    def asyncrl_sync() -> dict[str, float]:
        trace = run_asyncrl(setup, next(seeds["asyncrl_sync"]))
        return run_metrics(setup, trace, evaluator, reward_before)

    def trl_grpo() -> dict[str, float]:
        seed = next(seeds["trl_grpo"])
        source = PromptSource(train_split, seed=seed)
        prompts = [source.next().sample for _ in range(setup.steps * setup.prompts_per_step)]
        torch.set_num_threads(setup.threads)
        trace = run_trl(setup, seed, prompts)
        return run_metrics(setup, trace, evaluator, reward_before)

    return {"asyncrl_sync": asyncrl_sync, "trl_grpo": trl_grpo}


def checkpoint_curve(run: dict[str, float], steps: Sequence[int]) -> list[tuple[float, float]]:
    """(loop seconds, held-out reward) at each checkpoint of one run."""
    return [(run[f"elapsed_at_step_{step}"], run[f"reward_at_step_{step}"]) for step in steps]


def first_reaching(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """Loop seconds at the first checkpoint whose held-out reward is at least ``target``; None if none."""
    return next((elapsed for elapsed, reward in curve if reward >= target), None)


def times_to_trl_final(
    theirs: Sequence[tuple[float, float]], ours: Sequence[tuple[float, float]], noise: float
) -> harness.TimeToReward:
    """TRL's time to its own final reward (less the noise) and asyncrl's time to the same reward; asyncrl's run
    length where it never got there (censored)."""
    target = theirs[-1][1] - noise
    reference = first_reaching(theirs, target)
    assert reference is not None  # TRL's last checkpoint is its final reward, above the target
    return harness.TimeToReward(reference, first_reaching(ours, target), ours[-1][0])


def eval_noise(setup: Setup) -> float:
    """Two standard errors of one evaluation's mean reward at worst (rate 1/2), as if its ``eval_prompts ×
    eval_k`` 0/1 outcomes were independent: ``1 / sqrt(n)``."""
    return noise_of(setup.eval_prompts, setup.eval_k)


def noise_of(eval_prompts: int, eval_k: int) -> float:
    """:func:`eval_noise` of an evaluation of ``eval_prompts`` × ``eval_k`` samples."""
    return 1 / math.sqrt(eval_prompts * eval_k)


def speedup_to_trl_final(
    raw: dict[str, list[dict[str, float]]], checkpoints: Sequence[int], noise: float
) -> dict[str, Any]:
    """TRL's loop time to its own final held-out reward over asyncrl's time to it: per paired repeat, and on the
    seed-mean curves (the headline), a repeat where asyncrl never got there kept as censored.

    "Reaching" allows the evaluation's noise (:func:`eval_noise`) on both sides: both runs flatten out near the
    same reward, so a strict threshold would turn a 0.01 difference at the end, well inside the noise, into
    "never reached"."""
    curves = {
        arm: [checkpoint_curve(run, checkpoints) for run in raw[arm]] for arm in ("trl_grpo", "asyncrl_sync")
    }
    seeds = [
        times_to_trl_final(theirs, ours, noise)
        for theirs, ours in zip(curves["trl_grpo"], curves["asyncrl_sync"], strict=True)
    ]
    mean = times_to_trl_final(mean_curve(curves["trl_grpo"]), mean_curve(curves["asyncrl_sync"]), noise)
    return harness.time_to_reward_ratio(
        "trl_grpo",
        "asyncrl_sync",
        "loop s to TRL's final held-out reward, within eval noise: the seed-mean curves' ratio, every repeat "
        "beside it (a censored one never reached it: its ratio is an upper bound)",
        seeds,
        mean,
    )


def mean_curve(curves: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Point-wise mean over seeds of curves taken at the same checkpoints."""
    return [
        (statistics.fmean(point[0] for point in points), statistics.fmean(point[1] for point in points))
        for points in zip(*curves, strict=True)
    ]


def rederive(path: Path) -> None:
    """Derive ``path``'s time-to-reward ratio again from the checkpoints its runs store, re-running nothing:
    the measurements and their commit stay, ``rederived`` names the commit whose code derived it."""
    result = json.loads(path.read_text())
    raw = {
        arm: [
            {metric: stats["runs"][i] for metric, stats in metrics.items()} for i in range(result["repeats"])
        ]
        for arm, metrics in result["arms"].items()
    }
    noise = noise_of(result["setup"]["eval_prompts"], result["setup"]["eval_k"])
    result["ratios"]["speedup_to_trl_final_reward"] = speedup_to_trl_final(
        raw, result["setup"]["checkpoints"], noise
    )
    result["rederived"] = {
        "commit": harness.run_commit(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "what": "the time-to-reward ratio derived again from the stored runs; nothing re-measured",
    }
    path.write_text(json.dumps(result, indent=1) + "\n")


def learning_check(raw: dict[str, list[dict[str, float]]], setup: Setup) -> dict[str, Any]:
    """Per arm: did held-out reward rise beyond the noise? Its smallest gain over the seeds against the seeds'
    spread of the final reward and against the evaluation's noise (:func:`eval_noise`): a benchmark of runs
    that do not learn compares nothing."""
    checks = {}
    for arm, runs in raw.items():
        gains, finals = [r["reward_gain"] for r in runs], [r["reward_after"] for r in runs]
        spread = max(finals) - min(finals)
        checks[arm] = {
            "min_gain": min(gains),
            "seed_spread_of_reward_after": spread,
            "eval_noise": eval_noise(setup),
            "learns": min(gains) > max(spread, eval_noise(setup)),
        }
    return checks


def parse_args() -> Any:
    parser = harness.parser(__doc__.splitlines()[0], "sync_vs_trl")
    parser.add_argument(
        "--model", default="tiny-copy", help="start checkpoint (a directory or a shipped name)"
    )
    parser.add_argument("--task", default="copy", help="built-in task type")
    parser.add_argument(
        "--rederive",
        metavar="RESULT",
        help="derive RESULT's time-to-reward ratio again from its stored runs, re-running nothing",
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument(
        "--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads, both"
    )
    parser.add_argument("--eval-prompts", type=int, default=512, help="the task's held-out split size")
    parser.add_argument("--eval-k", type=int, default=2, help="samples per held-out prompt")
    parser.add_argument("--num-checkpoints", type=int, default=8, help="evenly spaced, the last at the end")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.prompts_per_step, args.group_size = 2, 2, 4
        args.max_new_tokens, args.eval_prompts, args.eval_k, args.num_checkpoints = 32, 8, 1, 2
    return args


def setup_from(args: Any) -> Setup:
    every = max(1, args.steps // args.num_checkpoints)
    checkpoints = tuple(sorted({*range(every, args.steps + 1, every), args.steps}))
    return Setup(
        model_path=str(resolve_model_path(args.model)),
        task_type=args.task,
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        lr=args.lr,
        threads=args.threads,
        eval_prompts=args.eval_prompts,
        eval_k=args.eval_k,
        checkpoints=checkpoints,
    )


def resources(setup: Setup) -> dict[str, Any]:
    """How the cores were used: one process each side, one phase at a time; asyncrl's threads per role as its
    sync placement plans them (the engine leaves a core to the driver), TRL's as set."""
    config = load_run_config(None, asyncrl_overrides(setup, 0, "unused"))
    return {
        "asyncrl_sync": {"how": "one process: engine and trainer threads, one phase at a time (sync)"}
        | harness.placement(config),
        "trl_grpo": f"one process (the same one), {setup.threads} torch threads",
    }


def described(setup: Setup) -> dict[str, Any]:
    """The workload as the result JSON records it."""
    return asdict(setup) | {
        "seeds": "repeat i runs seed i on both sides",
        "eval_seed": EVAL_SEED,
        "target": "asyncrl_sync >= 1.5x trl_grpo samples/s; both rewards rising beyond the noise",
    }


def main() -> None:
    args = parse_args()
    if args.rederive:
        rederive(Path(args.rederive))
        return
    setup = setup_from(args)
    torch.set_num_threads(setup.threads)
    task = make_task(TaskConfig(type=setup.task_type, num_eval=setup.eval_prompts))
    evaluator = Evaluator(setup, list(task.split("eval")))
    reward_before = evaluator.reward()
    print(f"start model: held-out reward {reward_before:.3f}", flush=True)
    raw = harness.run_arms(
        arms(setup, task, evaluator, reward_before), harness.repeats_for(args), harness.print_run
    )
    ratios = {
        "samples_per_s": harness.paired_ratio(raw, "asyncrl_sync", "trl_grpo", "samples_per_s"),
        "samples_per_cpu_s": harness.paired_ratio(raw, "asyncrl_sync", "trl_grpo", "samples_per_cpu_s"),
        "speedup_to_trl_final_reward": speedup_to_trl_final(raw, setup.checkpoints, eval_noise(setup)),
    }
    harness.write_result(
        args,
        "sync_vs_trl",
        raw,
        ratios=ratios,
        resources=resources(setup),
        setup=described(setup),
        extra={"learning": learning_check(raw, setup)},
    )


if __name__ == "__main__":
    main()
