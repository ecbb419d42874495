"""The records that flow between asyncrl's parts (DESIGN.md §2).

They are plain dataclasses with no torch import, so the scheduler, buffer, controller and simulator can use
them without touching tensors; only ``TrainBatch`` holds tensors, and it is built by the trainer.
Lifecycles are enums whose allowed transitions are stated in their docstrings.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
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
        _check_types(self)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be >= 0, got {self.stop_token_ids}")
        if not all(self.stop_strings):
            raise ValueError(f"stop_strings must be non-empty strings, got {self.stop_strings}")


def _check_types(params: SamplingParams) -> None:
    """TypeError naming the field for a value of the wrong type; lists of stops become tuples."""
    for name in ("stop_token_ids", "stop_strings"):
        value = getattr(params, name)
        if not isinstance(value, list | tuple):
            raise TypeError(f"{name} must be a list of {_ITEM_TYPE[name].__name__}, got {value!r}")
        if not all(_is_a(item, _ITEM_TYPE[name]) for item in value):
            raise TypeError(f"{name} must be a list of {_ITEM_TYPE[name].__name__}, got {value!r}")
        object.__setattr__(params, name, tuple(value))
    for name, expected in _FIELD_TYPES.items():
        value = getattr(params, name)
        if not any(_is_a(value, t) for t in expected):
            allowed = " or ".join("None" if t is type(None) else t.__name__ for t in expected)
            raise TypeError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")


def _is_a(value: Any, expected: type) -> bool:
    """isinstance, except that a bool is not a number (True never means 1 token)."""
    if isinstance(value, bool):
        return expected is bool
    return isinstance(value, expected)


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "max_new_tokens": (int,),
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": (int,),
    "seed": (int, type(None)),
    "ignore_eos": (bool,),
}
_ITEM_TYPE: dict[str, type] = {"stop_token_ids": int, "stop_strings": str}


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


class InvalidRequest(ValueError):
    """A request that cannot be served as given; the message names the request and the field.

    The caller's fault, never the engine's: the proxy passes it through without counting it against the
    engine's health or retrying it elsewhere.
    """


def sampling_params_from_dict(params: Mapping[str, Any], *, request_id: str) -> SamplingParams:
    """Build ``SamplingParams`` from a plain dict; an unknown key or bad value names the request."""
    names = [f.name for f in fields(SamplingParams)]
    unknown = sorted(map(str, set(params) - set(names)))
    if unknown:
        raise InvalidRequest(f"request {request_id}: unknown sampling param(s) {unknown}; valid: {names}")
    try:
        return SamplingParams(**params)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"request {request_id}: {exc}") from exc


def checked_request(request: Request) -> Request:
    """``request`` with a dict ``sampling`` made ``SamplingParams``, after checking every field's type and
    basic value; ``InvalidRequest`` naming the request and the field otherwise. Engine-specific limits (context
    length, vocabulary) are the engine's to check. Token lists are checked item by item only when they are
    lists or tuples (the simulator's ``Runs`` are valid by construction and long)."""
    rid = request.request_id
    if not isinstance(rid, str) or not rid:
        raise InvalidRequest(f"request_id must be a non-empty str, got {rid!r}")
    if isinstance(request.sampling, Mapping):
        request = replace(request, sampling=sampling_params_from_dict(request.sampling, request_id=rid))
    elif not isinstance(request.sampling, SamplingParams):
        raise InvalidRequest(
            f"request {rid}: sampling must be SamplingParams or a dict, got {request.sampling!r}"
        )
    _check_tokens(rid, "prompt_token_ids", request.prompt_token_ids)
    if not request.prompt_token_ids:
        raise InvalidRequest(f"request {rid}: empty prompt (prompt_token_ids)")
    _check_tokens(rid, "prefix_token_ids", request.prefix_token_ids)
    _check_items(rid, "prefix_logprobs", request.prefix_logprobs, lambda x: _is_a(x, float) or _is_a(x, int))
    if any(isinstance(x, float) and math.isnan(x) for x in _listed(request.prefix_logprobs)):
        raise InvalidRequest(f"request {rid}: prefix_logprobs must not hold NaN")
    _check_items(rid, "prefix_versions", request.prefix_versions, lambda x: _is_a(x, int))
    lengths = {
        len(getattr(request, name)) for name in ("prefix_token_ids", "prefix_logprobs", "prefix_versions")
    }
    if len(lengths) > 1:
        raise InvalidRequest(
            f"request {rid}: prefix_token_ids, prefix_logprobs and prefix_versions must have one entry per "
            f"token, got {len(request.prefix_token_ids)}, {len(request.prefix_logprobs)} and "
            f"{len(request.prefix_versions)}"
        )
    if request.version is not None and not (_is_a(request.version, int) and request.version >= 0):
        raise InvalidRequest(f"request {rid}: version must be None or an int >= 0, got {request.version!r}")
    if request.affinity_key is not None and not isinstance(request.affinity_key, str):
        raise InvalidRequest(
            f"request {rid}: affinity_key must be None or a str, got {request.affinity_key!r}"
        )
    return request


def _check_tokens(rid: str, name: str, tokens: Any) -> None:
    _check_items(rid, name, tokens, lambda t: _is_a(t, int) and t >= 0)


def _check_items(rid: str, name: str, values: Any, ok: Any) -> None:
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        raise InvalidRequest(f"request {rid}: {name} must be a list, got {type(values).__name__} {values!r}")
    if not all(ok(v) for v in _listed(values)):
        raise InvalidRequest(f"request {rid}: {name} holds an invalid item: {list(_listed(values))[:8]!r}")


def _listed(values: Any) -> Sequence[Any]:
    return values if isinstance(values, list | tuple) else ()


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


TokenObserver = Callable[[Sequence[int]], None]
"""Hears a request's whole output so far while it is generated (a continued request's prefix included, as its
``Generation`` will start): the engine-to-server seam for streaming tokens."""


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


@dataclass(frozen=True)
class PlacedRewards:
    """A reward credited to parts of a text, for per-token or per-step rewards: each ``(offset, value)`` lands on
    the token that produced the character at ``offset`` of the text scored (an offset at or past the end: its
    last token). Reward functions (for the response) and environments (for one turn's response) return it
    instead of a float; a float lands on the last token. The reward of the whole is ``total``."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        points = tuple(tuple(point) for point in self.points)
        for point in points:
            offset, value = point if len(point) == 2 else (None, None)
            if not (
                _is_a(offset, int) and offset >= 0 and _is_a(value, float | int) and math.isfinite(value)
            ):
                raise ValueError(
                    f"PlacedRewards: each point must be (offset >= 0, finite value), got {point!r}"
                )
        object.__setattr__(self, "points", tuple((int(o), float(v)) for o, v in points))

    @property
    def total(self) -> float:
        return sum(value for _, value in self.points)


@dataclass(kw_only=True)
class Trajectory:
    """One response (RLVR) or one multi-turn episode (agentic), flattened to a token sequence.

    ``token_ids`` is the whole sequence, prompt included; ``loss_mask`` is 1 on model-generated tokens and 0 on
    prompt and environment tokens; ``logprobs`` and ``versions`` are aligned with ``token_ids`` (0.0 and -1 where
    the mask is 0). ``start_version`` is the policy version that began the trajectory: staleness is measured
    from it. The sequences are lists, or ``RleSequence`` in the simulator (see ``Generation``).

    ``reward`` is the trajectory's total; ``token_rewards``, when set, says where it fell: aligned with
    ``token_ids``, non-zero only on model tokens (an agentic turn's reward on that turn's last token, a placed
    reward on its token), summing to ``reward``. None puts all of ``reward`` on the last model token. Group
    estimators (GRPO) read the total; GAE reads the rewards where they fall.
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
    token_rewards: Sequence[float] | None = None

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
    token_rewards: (
        torch.Tensor
    )  # [B, T] float, each reward on the token it fell on (a total: last model token)
    start_versions: torch.Tensor  # [B] long
    group_ids: torch.Tensor  # [B] long, index of the sample's group within the batch
    sample_uids: list[str] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> TrainBatch:
        """The same batch with every tensor on ``device`` (the trainer's model's)."""
        tensors = (f.name for f in fields(self) if f.name != "sample_uids")
        return replace(self, **{name: getattr(self, name).to(device) for name in tensors})
