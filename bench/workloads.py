"""The workloads benchmarks run, named by what bounds them, so nobody reads one as the other.

- ``training_bound``: the shipped 1.1 M ``tiny-count`` checkpoint on the ``count`` task (responses average
  ~11 tokens): the trainer is the bottleneck, so asynchrony has little generation to hide. Kept because it is
  what ``asyncrl train`` runs by default.
- ``generation_bound``: the situation the seeds' asynchrony exists for. A ~21 M-parameter Qwen2-shaped model
  (compute-heavy decode on CPU), response lengths lognormal with p99/median ≈ 10, N = 8 prompts × 8 samples =
  64 per step with more decode slots than one step's prompts need (K > N: several groups per prompt can be in
  flight), so queue scheduling and redundancy matter.

- ``long_tail`` (``LONG_TAIL``, bench/long_tail.py): the async-vs-sync workload that *learns*. An ~18 M-parameter
  Qwen3-shaped model warm-started by the project's own SFT (a recipe, built by one command into the cache),
  trained by RL on a task whose response lengths are long-tailed, at a normal learning rate, for over a
  hundred steps. Every choice and its grounds are written beside it below; it was fixed (committed and landed)
  before any of its arms ran, and is not to be changed after seeing which side wins.

The random models are built with the project's tiny-model tooling (``asyncrl.models.tiny.build_tiny_model``,
random weights, no download) into a cache directory on first use, never committed.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A Qwen2 shape for ``build_tiny_model``."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


@dataclass(frozen=True, kw_only=True)
class LengthDistribution:
    """Lognormal response lengths, clipped: ``median·exp(σ·z)`` with ``z`` standard normal."""

    median: float
    sigma: float
    min_tokens: int
    max_tokens: int

    @property
    def p99_over_median(self) -> float:
        """Of the unclipped distribution: exp(σ·2.326)."""
        return math.exp(self.sigma * 2.3263)

    def sample(self, count: int, seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        raw = rng.lognormal(mean=math.log(self.median), sigma=self.sigma, size=count)
        return np.clip(raw, self.min_tokens, self.max_tokens).astype(int).tolist()


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One benchmark workload: model, prompt and response lengths, batch shape."""

    name: str
    bound: str  # what limits a sync step: "generation" or "training"
    model: ModelShape
    prompt_tokens: int
    lengths: LengthDistribution
    prompts_per_step: int
    samples_per_prompt: int
    max_running_requests: int  # the engine's decode slots K

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt


GENERATION_BOUND = Workload(
    name="generation_bound",
    bound="generation",
    model=ModelShape(hidden=512, layers=6, heads=8, kv_heads=4, intermediate=1536, vocab=4096),
    prompt_tokens=32,
    lengths=LengthDistribution(median=48, sigma=1.0, min_tokens=4, max_tokens=1024),
    prompts_per_step=8,
    samples_per_prompt=8,
    max_running_requests=128,
)

QWEN2_0_5B = ModelShape(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936)
"""Qwen2-0.5B's shape (random weights): the engine and trainer benchmarks' model on a GPU, where the
generation-bound workload's ~21 M model would only measure kernel launches."""

QUICK = Workload(
    name="generation_bound_quick",
    bound="generation",
    model=ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512),
    prompt_tokens=8,
    lengths=LengthDistribution(median=8, sigma=1.0, min_tokens=2, max_tokens=64),
    prompts_per_step=2,
    samples_per_prompt=4,
    max_running_requests=16,
)
"""The same shape scaled to seconds, for ``--quick``."""


def cache_dir() -> Path:
    """Where built benchmark models live (``ASYNCRL_BENCH_CACHE`` or ``~/.cache/asyncrl/bench``)."""
    return Path(os.environ.get("ASYNCRL_BENCH_CACHE", Path.home() / ".cache" / "asyncrl" / "bench"))


def model_shape(device: str, quick: bool) -> ModelShape:
    """The engine and trainer benchmarks' model: the generation-bound workload's on CPU, Qwen2-0.5B's on a GPU,
    the quick twin in ``--quick``."""
    if quick:
        return QUICK.model
    return QWEN2_0_5B if device == "cuda" else GENERATION_BOUND.model


def synchronize(device: str) -> None:
    """Wait for the GPU's queued work, so a timed section ends when its kernels do (a no-op on CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def build_model(shape: ModelShape, seed: int = 0):
    """The workload's random Qwen2 (float32, eval mode), same weights for the same shape and seed."""
    from asyncrl.models.tiny import build_tiny_model

    return build_tiny_model(
        hidden_size=shape.hidden,
        num_layers=shape.layers,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        vocab_size=shape.vocab,
        max_position_embeddings=4096,
        seed=seed,
    )


def cached_model_dir(workload: Workload, seed: int = 0) -> Path:
    """A saved copy of the workload's model with a tokenizer (``asyncrl tiny build``), built on first use, for
    runs that load a checkpoint directory (the engine and trainer actors of ``asyncrl train``)."""
    shape = workload.model
    out = cache_dir() / f"qwen2-h{shape.hidden}-l{shape.layers}-v{shape.vocab}-s{seed}"
    if (out / "config.json").exists():
        return out
    from asyncrl.models.corpus import sample_texts
    from asyncrl.models.loading import save_tiny
    from asyncrl.models.tiny import build_tiny

    model, tokenizer = build_tiny(
        sample_texts(seed=seed),
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_layers=shape.layers,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=4096,
        seed=seed,
    )
    save_tiny(model, tokenizer, out)
    return out


@dataclass(frozen=True, kw_only=True)
class WarmStart:
    """An RL starting point made by ``asyncrl sft`` from a recipe (its overrides), built once into the cache.

    Why a recipe and not a committed checkpoint: ~70 MB of weights do not belong in git, while the recipe is
    a few lines that anyone can rebuild with one command (:meth:`command`). The directory is named by a hash
    of the recipe, so a changed recipe can never be mistaken for the old checkpoint."""

    name: str
    sft: tuple[str, ...]
    """``asyncrl sft`` overrides (everything but ``output_dir``)."""

    def directory(self) -> Path:
        digest = hashlib.sha256("\n".join(self.sft).encode()).hexdigest()[:12]
        return cache_dir() / f"{self.name}-{digest}"

    def command(self) -> list[str]:
        """The command that builds it (what :meth:`build` runs)."""
        return [sys.executable, "-m", "asyncrl.cli.main", "sft", *self.sft, f"output_dir={self.directory()}"]

    def build(self) -> Path:
        """The checkpoint directory, built by :meth:`command` unless an earlier build finished (its README is
        written last, so a build that died half-way is redone)."""
        out = self.directory()
        if not (out / "README.md").exists():
            print("building the warm start:", " ".join(self.command()), flush=True)
            subprocess.run(self.command(), check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        return out


@dataclass(frozen=True, kw_only=True)
class RLWorkload:
    """An RL workload every arm of a benchmark shares: warm start, task, batch, optimiser and schedule.

    ``run`` holds the ``RunConfig`` overrides every arm shares; arms add only their mode and scheduling."""

    name: str
    warm_start: WarmStart
    run: tuple[str, ...]
    prompts_per_step: int
    group_size: int
    steps: int
    """Steps of a full (time-to-reward) run."""
    warmup: int
    """Steps not counted in steady-state throughput (the first weight syncs, an async pipeline filling)."""
    measured_steps: int
    """Steps after ``warmup`` of a steady-state (throughput) run."""
    sweep_measured_steps: int
    """The same for the sync tuning sweep."""
    eval_every: int
    """Steps between the held-out evaluations of a full run (weights snapshotted then, evaluated after it)."""
    eval_prompts: int
    """Held-out prompts per evaluation (one temperature-1 sample each, the same seeds at every evaluation)."""
    seeds: tuple[int, ...]
    """Seeds of the full runs (repeat i runs seed ``seeds[i]``)."""

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def overrides(self) -> list[str]:
        """``run`` with the warm start's directory as the model (built if missing)."""
        return [f"model.path={self.warm_start.build()}", *self.run]


LONG_TAIL_SHAPE = (
    "architecture=qwen3",
    "hidden_size=512",
    "num_layers=6",
    "num_heads=8",
    "num_kv_heads=2",
    "intermediate_size=1536",
    "max_position_embeddings=2048",
)
"""18.3 M parameters in Qwen3's layout: per-head q/k norms, grouped-query attention at Qwen3-4B/8B's 4:1, an MLP
3x the width as in Qwen3-0.6B, tied embeddings as in Qwen3 up to 4B, head_dim 64. Grounds: 70 MiB of float32
weights, over twice this CPU's 32 MiB L3, so every decode step streams the weights from memory as a real
model's does (tens of millions of parameters, as the issue asks); and about the largest shape whose suite
(bench/long_tail.py) fits in about two hours on 2 cores, by the engine and trainer benchmarks' measurements of
the ~21 M model (training ~1 k tokens/s, decoding at batch 64 ~1.5 k tokens/s on 2 cores)."""

LONG_TAIL_TASK = (
    "task.type=copy",
    "task.median_items=12",
    "task.length_sigma=1.2",
    "task.max_items=1000",
)
"""The built-in ``copy`` task (copy a list of letters; one token per letter, then EOS) with log-normal list
lengths: median 12, σ = 1.2, at most 1,000 items. Grounds: the response length is set by the prompt, so the
length distribution is a stated property of the workload that RL cannot drift (a learned length would make
the modes generate different amounts of work, which is why the old benchmark froze learning); it is the task
of the project's default example, whose label-smoothed warm start RL improves within a hundred steps. Response
tokens: median 13, mean ~25, p99/median ≈ 16 (exp(1.2·2.326); ≥ 10 as the issue asks for reasoning-like
traces), the longest prompts asking for ~1,000; responses reach ``max_new_tokens`` = 1,024 when the policy
misses the stop at the end of the list and runs on (a per-sample chance of a few in a thousand for the shipped
warm start's recipe), as reasoning traces that never conclude reach theirs. What it is not: a reasoning task;
its answers are verified exactly and cost one token per item, so the workload is reasoning-shaped in its
lengths, its warm start's headroom and its filter statistics, not in content."""

LONG_TAIL = RLWorkload(
    name="long_tail",
    warm_start=WarmStart(
        name="long-tail-qwen3",
        sft=(
            *LONG_TAIL_TASK,
            *LONG_TAIL_SHAPE,
            # The shipped warm start's recipe scaled to the model and lengths. Label smoothing 0.1 leaves each
            # token right with p ~ 0.9 at temperature 1, so a 13-token answer is right ~30 % of the time and
            # pass@8 is about twice the mean (by that arithmetic over the length distribution: mean ~0.30,
            # pass@8 ~0.69, ~1/3 of the groups of 8 all-equal), the headroom the default example's warm start
            # has (0.35 mean, 0.67 pass@8) and that RL sharpens away. 800 steps of 32 demonstrations at the
            # SFT defaults' schedule (lr 1e-3 for the wider model, 50 warm-up steps, cosine decay).
            "label_smoothing=0.1",
            "lr=1e-3",
            "max_steps=800",
            "max_minutes=600",  # a cap that never binds: the recipe is its steps, whatever the machine's load
            "batch_size=32",
            "eval_prompts=64",
            "max_new_tokens=256",
            "seed=0",
        ),
    ),
    run=(
        *LONG_TAIL_TASK,
        "task.num_eval=256",
        # 4 prompts x 8 samples: group size 8 as the issue asks; 4 prompts is the most that keeps a full run of
        # the slower mode near ten minutes (the suite's budget), with the project's default of 2 redundant
        # prompts per 4 (its default example: 8 per 16)
        "rollout.rollout_batch_size=4",
        "rollout.num_return_sequences=8",
        "rollout.max_new_tokens=1024",
        # DAPO's dynamic sampling, as in the project's default example: groups whose 8 rewards are equal carry
        # no GRPO signal and are dropped, so a step generates more than it trains (about 1.5x at this warm
        # start's pass rates); the redundant prompts replace dropped groups without a second round
        "rollout.filter=zero_variance",
        "rollout.max_additional_running_prompts=2",
        # a normal RL rate: the default example's 1e-4 at width 128, scaled by 128/512 (μP's Adam rule for hidden
        # matrices): 2.5e-5, taken as 3e-5; the loss (PPO clip) and everything else at the project's defaults
        "trainer.lr=3e-5",
        "controller.eval_prompts=0",  # the benchmark evaluates weight snapshots itself, outside the timed loop
        "model.device=cpu",
        "runtime.type=inline",  # the default runtime: one process, a thread per role, threads by the planner
    ),
    prompts_per_step=4,
    group_size=8,
    steps=110,
    warmup=3,
    measured_steps=20,
    sweep_measured_steps=12,
    eval_every=10,
    eval_prompts=256,
    seeds=(0, 1, 2),
)
"""The long-tail RL workload of bench/long_tail.py; lengths: ``LONG_TAIL_TASK``; model: ``LONG_TAIL_SHAPE``.
Schedule: 110 steps, over 100 after the 3 warm-up steps (an async pipeline filling, the first weight syncs),
held-out reward every 10 steps on 256 prompts (about ±0.03 each; the same prompts and sampling seeds every
time, so checkpoints differ by their weights, not their draws); three seeds. Steady-state arms measure 20
steps after the warm-up, as the issue allows; the sync sweep 12 (a sync step carries no pipeline state, so its
steps are alike, and the sweep has seven arms)."""

QUICK_LONG_TAIL = RLWorkload(
    name="long_tail_quick",
    warm_start=WarmStart(
        name="long-tail-quick",
        sft=(
            "task.type=copy",
            "task.median_items=3",
            "task.length_sigma=1.0",
            "task.max_items=24",
            "task.num_train=500",
            "architecture=qwen3",
            "hidden_size=64",
            "num_layers=2",
            "num_heads=4",
            "num_kv_heads=2",
            "intermediate_size=192",
            "max_position_embeddings=256",
            "max_steps=30",
            "eval_prompts=0",
        ),
    ),
    run=(
        "task.type=copy",
        "task.median_items=3",
        "task.length_sigma=1.0",
        "task.max_items=24",
        "task.num_train=500",
        "task.num_eval=16",
        "rollout.rollout_batch_size=2",
        "rollout.num_return_sequences=4",
        "rollout.max_new_tokens=32",
        "rollout.filter=none",  # a 30-step warm start is right too rarely for the filter to fill a batch
        "rollout.max_additional_running_prompts=1",
        "trainer.lr=5e-5",
        "controller.eval_prompts=0",
        "model.device=cpu",
        "runtime.type=inline",
    ),
    prompts_per_step=2,
    group_size=4,
    steps=4,
    warmup=1,
    measured_steps=2,
    sweep_measured_steps=2,
    eval_every=2,
    eval_prompts=8,
    seeds=(0,),
)
"""The same workload scaled to seconds, for ``--quick`` (no group filter: its warm start learns nothing)."""
