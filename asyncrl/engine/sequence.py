"""One request's state inside the engine: its tokens, its KV progress and its outputs (no torch).

The scheduler, the simulator and the engine share this record. KV progress is a single counter,
``num_cached``: tokens ``[0, num_cached)`` have KV in the request's slot; the rest are pending and are fed to
the model at the next steps (a whole prompt, a prefill chunk, or the one token sampled last).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field

from asyncrl.types import FinishReason, Generation, Request


class SequenceStatus(enum.Enum):
    """Lifecycle: waiting → running → finished; an abort moves waiting or running straight to finished."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def request_seed(request: Request, engine_seed: int) -> int:
    """The request's own seed, else a stable hash of (engine seed, request id): independent of batch and order."""
    if request.sampling.seed is not None:
        return request.sampling.seed
    digest = hashlib.sha256(f"{engine_seed}:{request.request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass(kw_only=True, eq=False)
class Sequence:
    """A request being served: prompt + output tokens, per-token log-probs and versions, KV slot and progress.

    ``sample_seed`` keys the counter-based uniform of each sampled token (``engine/uniforms.py``), whose counter
    is the output position: a continued request (``prefix_token_ids``) starts past the draws its prefix used,
    so an interrupted and resumed request samples like an uninterrupted one.
    """

    request: Request
    sample_seed: int
    token_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    slot: int | None = None
    num_cached: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_request(cls, request: Request, engine_seed: int) -> Sequence:
        return cls(
            request=request,
            sample_seed=request_seed(request, engine_seed),
            token_ids=list(request.prompt_token_ids) + list(request.prefix_token_ids),
            output_logprobs=list(request.prefix_logprobs),
            output_versions=list(request.prefix_versions),
        )

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_pending(self) -> int:
        """Tokens not yet in the KV cache: the whole context before prefill, one token while decoding."""
        return len(self.token_ids) - self.num_cached

    def append(self, token_id: int, logprob: float, version: int) -> None:
        self.token_ids.append(token_id)
        self.output_logprobs.append(logprob)
        self.output_versions.append(version)

    def to_generation(self, text: str | None = None) -> Generation:
        assert self.finish_reason is not None, f"request {self.request_id} has not finished"
        return Generation(
            request_id=self.request_id,
            prompt_token_ids=list(self.request.prompt_token_ids),
            token_ids=self.output_token_ids,
            logprobs=list(self.output_logprobs),
            versions=list(self.output_versions),
            finish_reason=self.finish_reason,
            text=text,
            timings=dict(self.timings),
        )
