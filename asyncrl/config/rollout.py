"""Configuration of the RLVR rollout: batch shape, sampling, queue scheduling, replication and filtering."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BUILTIN_FILTERS = ("none", "zero_variance")


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How prompts become groups of scored responses."""

    rollout_batch_size: int = 8
    """Prompts (groups) per training step; the trainer consumes rollout_batch_size × num_return_sequences
    samples per step."""
    num_return_sequences: int = 8
    """Responses per prompt (the GRPO group size)."""
    prompt_replication: bool = True
    """True: the n responses of a prompt are n independent requests that may land on different engines and
    finish at their own pace. False: the n responses are submitted together to one engine (grouped decoding)."""
    generation: Literal["queue", "batch"] = "queue"
    """queue: each response is scored the moment it finishes and a group is buffered when its last member
    is scored. batch: the naive baseline — the step's responses are all generated first, then all scored."""
    filter: str = "none"
    """Dynamic filtering of finished groups: 'none', 'zero_variance' (drop groups whose rewards are all
    equal: they carry no GRPO signal), or a dotted path 'pkg.module:function' taking a Group and returning
    True to keep it."""
    max_additional_running_prompts: int = 0
    """Redundant prompts kept in flight beyond what the batch needs, so filtered groups are replaced without
    waiting; once the batch is full the surplus is aborted and recorded, never silently lost. With
    ``generation: batch`` they over-sample each round (a round admits the batch plus these), so a round whose
    groups are partly filtered can still fill the batch without another round."""
    max_new_tokens: int = 256
    """Longest response in tokens."""
    temperature: float = 1.0
    """Sampling temperature; training rollouts keep 1 so behaviour log-probs are the model's own."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1 disables it. Held-out evaluation samples with it too."""
    top_k: int = 0
    """Top-k sampling; 0 disables it. Held-out evaluation samples with it too."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a response (EOS always does); held-out evaluation's answers end at them too, so the
    reward parses them cut as in training."""
    num_engines: int = 1
    """Engine replicas serving rollouts."""

    def __post_init__(self) -> None:
        for name in ("rollout_batch_size", "num_return_sequences", "max_new_tokens", "num_engines"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_additional_running_prompts < 0:
            raise ValueError(
                f"rollout.max_additional_running_prompts must be >= 0, got {self.max_additional_running_prompts}"
            )
        if self.generation not in ("queue", "batch"):
            raise ValueError(f"rollout.generation must be one of 'queue', 'batch', got {self.generation!r}")
        if self.filter not in BUILTIN_FILTERS and ":" not in self.filter:
            raise ValueError(
                f"rollout.filter must be one of {', '.join(map(repr, BUILTIN_FILTERS))} or a dotted path "
                f"'pkg.module:function', got {self.filter!r}"
            )
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(
                "rollout sampling: temperature must be >= 0, top_p in (0, 1], top_k >= 0; got "
                f"{self.temperature}, {self.top_p}, {self.top_k}"
            )
