"""The two workloads benchmarks run, named by what bounds them, so nobody reads one as the other.

- ``training_bound``: the shipped 1.1 M ``tiny-count`` checkpoint on the ``count`` task (responses average
  ~11 tokens): the trainer is the bottleneck, so asynchrony has little generation to hide. Kept because it is
  what ``asyncrl train`` runs by default.
- ``generation_bound``: the situation the seeds' asynchrony exists for. A ~21 M-parameter Qwen2-shaped model
  (compute-heavy decode on CPU), response lengths lognormal with p99/median ≈ 10, N = 8 prompts × 8 samples =
  64 per step with more decode slots than one step's prompts need (K > N: several groups per prompt can be in
  flight), so queue scheduling and redundancy matter.

The model is built with the project's tiny-model tooling (``asyncrl.models.tiny.build_tiny_model``, random
weights, no download) into a cache directory on first use, never committed.
"""

from __future__ import annotations

import math
import os
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
