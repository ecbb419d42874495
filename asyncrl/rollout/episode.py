"""One agentic episode as it grows: context tokens with a loss mask, then a ``Trajectory``.

The context is the initial observation, then each model response (loss mask 1, with its behaviour log-probs
and versions) followed by the environment's observation (mask 0). Each turn's request is the whole context.
Each env step's reward is credited to that turn's response: a float on its last token, ``PlacedRewards`` on
the tokens its offsets name; the episode's reward is their sum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from asyncrl.rollout.reward_placement import Decode, rewards_on_tokens
from asyncrl.types import Generation, PlacedRewards, Trajectory, TrajectoryStatus


@dataclass
class Episode:
    """The state of one episode; ``status`` stays None while it runs."""

    prompt_key: str
    index: int
    env_seed: int
    admitted_version: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    responses: list[str] = field(default_factory=list)
    token_rewards: list[float] = field(default_factory=list)
    last_response_span: tuple[int, int] = (0, 0)
    """[start, end) of the latest response's tokens: where the next env step's reward goes."""
    reward: float = 0.0
    status: TrajectoryStatus | None = None
    reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=lambda: {"generate_s": 0.0, "env_s": 0.0})

    @property
    def uid(self) -> str:
        return f"{self.prompt_key}#{self.index}"

    @property
    def num_turns(self) -> int:
        return len(self.responses)

    def start(self, observation_ids: list[int]) -> None:
        """The first observation: the prompt of the episode."""
        self.num_prompt_tokens = len(observation_ids)
        self.add_observation(observation_ids)

    def add_response(self, generation: Generation, text: str) -> None:
        self.last_response_span = (len(self.token_ids), len(self.token_ids) + generation.num_tokens)
        self.token_ids += generation.token_ids
        self.loss_mask += [1] * generation.num_tokens
        self.logprobs += generation.logprobs
        self.versions += generation.versions
        self.token_rewards += [0.0] * generation.num_tokens
        self.responses.append(text)

    def add_observation(self, observation_ids: list[int]) -> None:
        self.token_ids += observation_ids
        self.loss_mask += [0] * len(observation_ids)
        self.logprobs += [0.0] * len(observation_ids)
        self.versions += [-1] * len(observation_ids)
        self.token_rewards += [0.0] * len(observation_ids)

    def credit_turn(self, reward: float | PlacedRewards, decode: Decode) -> None:
        """Add the last env step's ``reward`` to the episode, on the tokens of the response it answered."""
        start, end = self.last_response_span
        total = reward.total if isinstance(reward, PlacedRewards) else float(reward)
        self.reward += total
        if start == end:  # an empty response: the turn's reward goes to the latest model token there is
            model_tokens = [i for i, m in enumerate(self.loss_mask) if m]
            start, end, reward = (
                (model_tokens[-1], model_tokens[-1] + 1, total) if model_tokens else (0, 0, 0.0)
            )
        placed = rewards_on_tokens(reward, self.token_ids[start:end], decode)
        self.token_rewards[start:end] = [
            a + b for a, b in zip(self.token_rewards[start:end], placed, strict=True)
        ]

    def end(self, status: TrajectoryStatus, reason: str = "") -> None:
        """Set the terminal state once; later calls are ignored (the first cause is the one recorded)."""
        if self.status is None:
            self.status, self.reason = status, reason

    def trajectory(self) -> Trajectory:
        assert self.status is not None, f"episode {self.uid} has not ended"
        model_versions = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return Trajectory(
            prompt_uid=self.prompt_key,
            sample_index=self.index,
            token_ids=list(self.token_ids),
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            start_version=model_versions[0] if model_versions else self.admitted_version,
            num_prompt_tokens=self.num_prompt_tokens,
            reward=self.reward,
            token_rewards=list(self.token_rewards) if model_versions else None,  # no model token: nowhere
            status=self.status,
            reason=self.reason,
            response_text="".join(self.responses),
            info={**self.info, "turns": self.num_turns, "env_seed": self.env_seed},
            timings={**self.timings, "finished_at": time.monotonic()},
        )
