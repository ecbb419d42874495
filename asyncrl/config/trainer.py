"""Configuration of the trainer: optimiser, schedule, PPO epochs and mini-batches, micro-batching, checkpoints.

Key decision: the learning-rate schedule counts train steps (policy versions), not optimizer steps, so changing
``ppo_epochs`` or ``num_mini_batches`` does not stretch the warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SCHEDULES = ("constant", "cosine")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
ALL_LINEAR = "all-linear"
FSDP_GRAD_ACCUMULATIONS = ("sharded", "unsharded")


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """LoRA through ``peft``: low-rank adapters on the chosen linear layers train, the base weights stay frozen.

    Only the adapters hold gradients and optimizer state; the reference model (KL) is the base with the
    adapters switched off (no second copy of the weights); checkpoints hold the adapters (``adapter/``, peft's
    format) and ``asyncrl export`` writes merged weights; weight sync ships the adapters alone (kind ``lora``).
    """

    rank: int = 16
    """Rank r of each adapter pair (A: [r, in], B: [out, r])."""
    alpha: float = 32.0
    """Scale numerator: the adapter adds (alpha / r) · B @ A to a layer's weight."""
    dropout: float = 0.0
    """Dropout on the adapters' input in the gradient forward passes (never in the no-grad log-prob passes,
    so the step-start log-probs stay those of the weights)."""
    target_modules: tuple[str, ...] = (ALL_LINEAR,)
    """Names (last component, e.g. ``q_proj``, ``v_proj``) of the linear layers that get adapters;
    ``[all-linear]``: every linear layer of the decoder, not the output layer."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"trainer.lora.rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"trainer.lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"trainer.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or any(not name for name in self.target_modules):
            raise ValueError(
                f"trainer.lora.target_modules must name at least one layer, got {list(self.target_modules)}"
            )
        if ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            raise ValueError(
                f"trainer.lora.target_modules: '{ALL_LINEAR}' stands alone, got {list(self.target_modules)}"
            )


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """How the trainer turns a batch of groups into optimizer steps."""

    lr: float = 1e-5
    """Peak learning rate of AdamW (reached at the end of the warm-up)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay; biases and normalisation weights (1-D parameters) never decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 0
    """Train steps over which the learning rate rises linearly from lr/(warmup_steps+1) to lr."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: keep lr constant, or decay it along a half cosine to min_lr_ratio·lr at total_steps."""
    total_steps: int | None = None
    """Train steps of the whole run; required by the cosine schedule (its end point)."""
    min_lr_ratio: float = 0.0
    """Final learning rate of the cosine schedule as a fraction of lr."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this before each optimizer step; None only measures it."""
    max_consecutive_skipped_updates: int = 5
    """An optimizer update whose global gradient norm is not finite (inf or NaN) is skipped: weights and AdamW
    state stay as they were, on every rank alike (the norm is global). After this many skipped updates in a row
    the next one fails the run (``NonFiniteGradientError``); 0 fails at the first. The count restarts at a
    resume."""
    ppo_epochs: int = 1
    """Passes over each batch; every pass does num_mini_batches optimizer steps."""
    num_mini_batches: int = 1
    """Optimizer steps per pass: the batch's samples are split into this many mini-batches."""
    shuffle_mini_batches: bool = True
    """Shuffle samples before splitting them into mini-batches (seeded by seed, step and epoch)."""
    max_tokens_per_microbatch: int = 8192
    """Token budget of one forward/backward: its real tokens when packing, else rows × longest row (a single
    longer sample gets a micro-batch of its own). Gradients accumulate over the micro-batches."""
    sequence_packing: bool = True
    """Run the model on each micro-batch's real tokens concatenated into rows (per-sample position ids,
    attention never crossing a sample) instead of right-padded rows: same log-probs and gradients, no compute
    spent on padding. ``false`` keeps the padded path (for comparison, or a model whose attention does not
    honour restarting position ids)."""
    packed_row_tokens: int = 512
    """Longest packed row; a longer sample widens every row of its micro-batch to its own length
    (``packing.plan_rows``: rows are filled up to the larger of the two). Under sdpa and eager attention
    (``model.attn_implementation``) each row gets a dense block-diagonal mask that costs row² per layer in time
    and memory, so shorter rows are faster: 512 beat 1,024 and 2,048 on CPU on the generation-bound workload's
    batches (one rough run, docs/benchmarks.md). Under flash-attn the whole micro-batch is one row (its kernels
    separate packed samples only then) and this is not used; under flex_attention rows still hold this many."""
    logprob_chunk_size: int = 1024
    """Token positions whose vocabulary log-softmax is computed at once; bounds the [tokens, vocab] buffer."""
    temperature: float = 1.0
    """Logits are divided by this before the log-softmax; set it to the rollout sampling temperature so the
    trainer's log-probs describe the same distribution as the behaviour log-probs."""
    compute_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Forward passes run under torch.autocast in this dtype (float32: no autocast). The vocabulary projection
    and a value head multiply their inputs in this dtype but accumulate and return float32
    (``models/float32_projection.py``), so logits, log-probs, entropies and values are never rounded to it."""
    num_workers: int = 1
    """Trainer ranks (Ray runtimes): the model is sharded over them with FSDP2 (gloo on CPU, NCCL on CUDA) and
    each trains its share of every mini-batch. 1 keeps the whole model in one process."""
    activation_checkpointing: bool = False
    """Keep only each decoder layer's input in forward and recompute the layer in backward: less memory for
    about one more forward of compute."""
    mixed_precision: Literal["none", "bf16"] = "none"
    """With num_workers > 1: FSDP2 computes forward and backward in bfloat16 from float32 shards and reduces
    gradients in float32 (one process: use compute_dtype). The logits are still float32, from the bf16 head
    (``models/float32_projection.py``)."""
    fsdp_grad_accumulation: Literal["sharded", "unsharded"] = "sharded"
    """With num_workers > 1, how gradients accumulate over a mini-batch's micro-batches. ``sharded``:
    reduce-scatter after every micro-batch, so each rank holds only its 1/num_workers shard of the gradient
    (in the master dtype) at any time, for one reduce-scatter of the whole gradient per micro-batch.
    ``unsharded``: skip the reduction until the mini-batch's last micro-batch, so communication is one
    reduce-scatter per mini-batch but every rank holds a full-size gradient in the reduction dtype (float32
    under mixed precision: 4 bytes x every parameter per rank, 32.8 GB for an 8B model). Choose ``unsharded``
    only where the interconnect is slow and the full gradient fits."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many train steps; 0 never saves periodically."""
    keep_last_checkpoints: int | None = 3
    """Older checkpoints beyond this many are deleted after a save; None keeps all."""
    seed: int = 0
    """Seed of the mini-batch shuffling and of LoRA's initial adapters."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight (``LoraConfig``); null trains the full model."""

    def __post_init__(self) -> None:
        self._check_optimizer()
        self._check_schedule()
        self._check_batching()

    def _check_optimizer(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"trainer.lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"trainer.weight_decay must be >= 0, got {self.weight_decay}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"trainer.betas must both be in [0, 1), got {self.betas}")
        if self.eps <= 0:
            raise ValueError(f"trainer.eps must be > 0, got {self.eps}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"trainer.max_grad_norm must be > 0 or null, got {self.max_grad_norm}")
        if self.max_consecutive_skipped_updates < 0:
            raise ValueError(
                "trainer.max_consecutive_skipped_updates must be >= 0, "
                f"got {self.max_consecutive_skipped_updates}"
            )

    def _check_schedule(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"trainer.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"trainer.schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {self.schedule!r}"
            )
        if self.schedule == "cosine" and (self.total_steps is None or self.total_steps <= self.warmup_steps):
            raise ValueError(
                "trainer.total_steps must be set and > trainer.warmup_steps for schedule 'cosine', "
                f"got {self.total_steps}"
            )
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"trainer.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")

    def _check_batching(self) -> None:
        for name in (
            "ppo_epochs",
            "num_mini_batches",
            "max_tokens_per_microbatch",
            "logprob_chunk_size",
            "packed_row_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature <= 0:
            raise ValueError(f"trainer.temperature must be > 0, got {self.temperature}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"trainer.compute_dtype must be one of {', '.join(map(repr, COMPUTE_DTYPES))}, "
                f"got {self.compute_dtype!r}"
            )
        if self.num_workers < 1:
            raise ValueError(f"trainer.num_workers must be >= 1, got {self.num_workers}")
        if self.mixed_precision not in ("none", "bf16"):
            raise ValueError(
                f"trainer.mixed_precision must be 'none' or 'bf16', got {self.mixed_precision!r}"
            )
        if self.mixed_precision != "none" and self.num_workers == 1:
            raise ValueError(
                "trainer.mixed_precision applies to the sharded trainer (num_workers > 1); "
                "with one worker use trainer.compute_dtype"
            )
        if self.fsdp_grad_accumulation not in FSDP_GRAD_ACCUMULATIONS:
            raise ValueError(
                "trainer.fsdp_grad_accumulation must be one of "
                f"{', '.join(map(repr, FSDP_GRAD_ACCUMULATIONS))}, got {self.fsdp_grad_accumulation!r}"
            )
        if self.checkpoint_every < 0:
            raise ValueError(f"trainer.checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.keep_last_checkpoints is not None and self.keep_last_checkpoints < 1:
            raise ValueError(
                f"trainer.keep_last_checkpoints must be >= 1 or null, got {self.keep_last_checkpoints}"
            )
