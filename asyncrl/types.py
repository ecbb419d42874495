"""The records that flow between asyncrl's parts (DESIGN.md §2).

They are plain dataclasses with no torch import, so the scheduler, buffer, controller and simulator can use
them without touching tensors; only ``TrainBatch`` holds tensors, and it is built by the trainer.
Lifecycles are enums whose allowed transitions are stated in their docstrings.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class FinishReason(str, enum.Enum):
    """Why a generation ended: a stop token/string, the token limit, or an abort (partial output)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Per-request sampling parameters.

    Log-probs reported by the engine are those of the distribution actually sampled from: logits divided by
    ``temperature``, then restricted to top-k / top-p and renormalised. With the training defaults
    (temperature 1, top_p 1, top_k 0) that is the model's own distribution.
    """

    max_new_tokens: int = 256
    """Upper bound on generated tokens; reaching it ends the request with ``finish_reason="length"``."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (log-probs then describe the temperature-1 distribution)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables it."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the request (included in the output), in addition to the model's EOS."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end the request once the decoded output contains them (needs a tokenizer)."""
    seed: int | None = None
    """Seed of this request's own generator; None draws from the engine's seed and the request id."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks use it to impose exact lengths)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")


@dataclass(kw_only=True)
class Request:
    """One generation request: a prompt and how to sample its continuation.

    ``version`` pins the request to engines serving that policy version (multi-version mode); None lets it
    run on any. ``affinity_key`` (e.g. the prompt uid) lets the proxy send requests sharing a prompt to the same
    engine when that costs little balance, so its prefix cache can help. ``prefix_token_ids`` holds output already generated before an interruption, so a continued
    partial rollout resumes where it stopped (partial-rollout mode).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    version: int | None = None
    affinity_key: str | None = None
    prefix_token_ids: list[int] = field(default_factory=list)
    prefix_logprobs: list[float] = field(default_factory=list)
    prefix_versions: list[int] = field(default_factory=list)


@dataclass(kw_only=True)
class Generation:
    """The output of one request: tokens, each token's behaviour log-prob and the policy version that made it.

    The sequences are lists from the real engines and ``asyncrl.rle.RleSequence`` from the simulator's (read-only
    either way); consumers use them as sequences, and ``list + sequence`` concatenates both kinds.
    """

    request_id: str
    prompt_token_ids: Sequence[int]
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    versions: Sequence[int]
    finish_reason: FinishReason
    text: str | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class TrajectoryStatus(str, enum.Enum):
    """Terminal state of a trajectory.

    running → completed | truncated (hit the length limit) | aborted (cut off, e.g. a redundant request once the
    batch is full) | failed (env or reward error) | filtered (dropped by dynamic filtering).
    Only ``completed`` and ``truncated`` trajectories are trainable.
    """

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"
    FILTERED = "filtered"

    @property
    def trainable(self) -> bool:
        return self in (TrajectoryStatus.COMPLETED, TrajectoryStatus.TRUNCATED)


@dataclass(kw_only=True)
class Trajectory:
    """One response (RLVR) or one multi-turn episode (agentic), flattened to a token sequence.

    ``token_ids`` is the whole sequence, prompt included; ``loss_mask`` is 1 on model-generated tokens and 0 on
    prompt and environment tokens; ``logprobs`` and ``versions`` are aligned with ``token_ids`` (0.0 and -1 where
    the mask is 0). ``start_version`` is the policy version that began the trajectory: staleness is measured
    from it. The sequences are lists, or ``RleSequence`` in the simulator (see ``Generation``).
    """

    prompt_uid: str
    sample_index: int
    token_ids: Sequence[int]
    loss_mask: Sequence[int]
    logprobs: Sequence[float]
    versions: Sequence[int]
    start_version: int
    num_prompt_tokens: int
    reward: float = 0.0
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED
    reason: str = ""
    response_text: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return f"{self.prompt_uid}#{self.sample_index}"

    @property
    def num_response_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def version_span(self) -> tuple[int, int]:
        """(oldest, newest) version among the model-generated tokens; start_version if there are none."""
        model_versions = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        if not model_versions:
            return (self.start_version, self.start_version)
        return (min(model_versions), max(model_versions))


@dataclass(kw_only=True)
class Group:
    """The trajectories of one prompt: the unit of GRPO normalisation, filtering and buffering."""

    prompt_uid: str
    trajectories: list[Trajectory]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def start_version(self) -> int:
        """The oldest start version of any member: a group is as stale as its stalest trajectory."""
        return min(t.start_version for t in self.trajectories)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    def __len__(self) -> int:
        return len(self.trajectories)


@dataclass(kw_only=True)
class TrainBatch:
    """Right-padded tensors built from groups, ready for the trainer.

    Shapes: ``[B, T]`` for every tensor but ``advantages_or_rewards`` style per-sample ones, which are ``[B]``.
    ``behaviour_logprobs[b, t]`` is the engine's log-prob of ``input_ids[b, t]`` (0 where the mask is 0).
    """

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    loss_mask: torch.Tensor  # [B, T] float, 1 on model-generated tokens
    behaviour_logprobs: torch.Tensor  # [B, T] float
    token_versions: torch.Tensor  # [B, T] long, -1 where loss_mask is 0
    rewards: torch.Tensor  # [B] float
    advantages: torch.Tensor  # [B, T] float, broadcast over the sample's tokens
    start_versions: torch.Tensor  # [B] long
    group_ids: torch.Tensor  # [B] long, index of the sample's group within the batch
    sample_uids: list[str] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return int(self.input_ids.shape[0])
