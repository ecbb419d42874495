"""Configuration of the supervised warm start (``asyncrl sft``): task, tiny model shape, budget, evaluation.

Key decision: the warm start must leave RL something to do that RL can do. The shipped checkpoint should
solve roughly 10-60 % of held-out prompts when sampling at temperature 1, and its mistakes should be ones
the reward can fix quickly. Label smoothing gives exactly that: trained long enough, the model's argmax is
right on most prompts while temperature-1 samples slip (the default ``copy`` warm start: 0.35 mean reward
sampled, 0.67 pass@8), so RL sharpens what the model knows. A warm start that never learned a skill (the
``count`` task's stopping rule, which the 1.1 M-parameter model does not learn in 1,500 steps) leaves RL a
search it cannot finish in minutes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config.task import TaskConfig


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """Tokenizer, tiny model and training budget of a warm start on task demonstrations."""

    task: TaskConfig = field(default_factory=TaskConfig)
    """The task whose demonstrations (prompt + correct response + EOS) are trained on (default: copy)."""
    output_dir: str = "asyncrl/assets/tiny-copy"
    """Where the checkpoint (safetensors, config, tokenizer) and its README are written."""
    seed: int = 0
    """Seed of model initialisation, data order and evaluation sampling."""
    vocab_size: int = 384
    """Target vocabulary of the byte-level BPE trained on the built-in tasks' texts."""
    architecture: Literal["qwen2", "qwen3"] = "qwen2"
    """Model family: qwen2 (the shipped checkpoints) or qwen3 (per-head q/k norms, explicit head_dim)."""
    hidden_size: int = 128
    """Model width."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads (hidden_size must be divisible by it)."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention when fewer than num_heads); null: num_heads."""
    intermediate_size: int | None = None
    """MLP width; null: 4 × hidden_size."""
    head_dim: int | None = None
    """qwen3 only: width of each attention head; null: hidden_size / num_heads."""
    max_position_embeddings: int = 2048
    """Longest sequence (prompt + response) the model's rotary table is sized for."""
    max_steps: int = 2000
    """Optimizer steps of training (the budget that sets how good the warm start gets)."""
    max_minutes: float = 30.0
    """Wall-clock cap on training, in minutes; training stops at whichever of the two comes first."""
    batch_size: int = 32
    """Demonstrations per optimizer step."""
    max_tokens_per_microbatch: int = 8192
    """Token budget of one forward/backward (rows × longest row; a longer demonstration gets a micro-batch of
    its own). A step's micro-batches accumulate into its batch's mean loss, so this bounds memory, not the
    recipe: long-tailed demonstrations batched by length put 32 rows of ~2,000 tokens in one batch, ~20 GB of
    activations at 18 M parameters."""
    lr: float = 2e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 50
    """Linear warm-up steps; the rate then decays along a half cosine to 10 % at max_steps."""
    weight_decay: float = 0.01
    """AdamW weight decay on matrices."""
    label_smoothing: float = 0.2
    """Share of each target's probability spread over the vocabulary. A converged model then puts about
    1 - label_smoothing on the right token at every step: its argmax is right but temperature-1 samples of
    long responses often slip, which is exactly the headroom RL sharpening removes."""
    log_every: int = 50
    """Print the training loss every this many steps."""
    eval_prompts: int = 128
    """Held-out prompts sampled after training to measure mean reward and pass@k; 0 skips evaluation."""
    eval_samples_per_prompt: int = 8
    """Samples per held-out prompt (k of pass@k); mean reward averages over all of them."""
    max_new_tokens: int = 192
    """Generation limit of evaluation samples."""

    def __post_init__(self) -> None:
        if self.architecture not in ("qwen2", "qwen3"):
            raise ValueError(f"sft.architecture must be 'qwen2' or 'qwen3', got {self.architecture!r}")
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "max_steps",
            "batch_size",
            "max_tokens_per_microbatch",
            "max_position_embeddings",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"sft.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"sft.hidden_size ({self.hidden_size}) must be divisible by sft.num_heads")
        for name in ("num_kv_heads", "intermediate_size", "head_dim"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"sft.{name} must be >= 1 or null, got {getattr(self, name)}")
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"sft.num_heads ({self.num_heads}) must be divisible by sft.num_kv_heads")
        if self.head_dim is not None and self.architecture != "qwen3":
            raise ValueError(
                "sft.head_dim is a qwen3 setting (qwen2 derives it from hidden_size / num_heads)"
            )
        if self.max_minutes <= 0 or self.lr <= 0:
            raise ValueError("sft.max_minutes and sft.lr must be > 0")
        for name in ("warmup_steps", "eval_prompts", "log_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"sft.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"sft.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.eval_samples_per_prompt < 1 or self.max_new_tokens < 1:
            raise ValueError("sft.eval_samples_per_prompt and sft.max_new_tokens must be >= 1")
        if not self.output_dir:
            raise ValueError("sft.output_dir must not be empty")
