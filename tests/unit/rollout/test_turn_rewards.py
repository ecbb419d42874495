"""Per-turn and per-token rewards reach the right tokens: env steps through the EnvManager, placed rewards by
character offset, and the trainer's batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from asyncrl.config.env import EnvConfig, EnvManagerConfig
from asyncrl.config.env_kinds import SokobanConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.envs.base import StepResult
from asyncrl.envs.sokoban import SokobanEnv, parse_room
from asyncrl.rollout.env_manager import EnvManager, GroupControl
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.reward_placement import rewards_on_tokens, token_at
from asyncrl.trainer.batching import build_train_batch
from asyncrl.types import (
    FinishReason,
    Generation,
    Group,
    PlacedRewards,
    Request,
    Trajectory,
    TrajectoryStatus,
)

ROOM = "######\n#_@__#\n#_$__#\n#____#\n#_.__#\n######"
"""One box two cells above its target; the player right above the box."""


class CharTokenizer:
    """One token per character: ids are code points."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in token_ids)


class ScriptedProxy:
    """Answers each turn with the next scripted response."""

    def __init__(self, responses: list[str]) -> None:
        self.responses = iter(responses)

    async def generate(self, request: Request) -> Generation:
        ids = [ord(c) for c in next(self.responses)]
        return Generation(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            versions=[0] * len(ids),
            finish_reason=FinishReason.STOP,
        )

    async def abort(self, request_id: str) -> Generation | None:
        return None


class FixedRoom(SokobanEnv):
    """Sokoban on ``ROOM`` whatever the seed; records every step's result."""

    def __init__(self, **sokoban: Any) -> None:
        super().__init__(EnvConfig(type="sokoban", sokoban=SokobanConfig(**sokoban)))
        self.results: list[StepResult] = []

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.room = parse_room(ROOM)
        return ROOM + "\nmove:", {}

    async def step(self, action: str) -> StepResult:
        self.results.append(await super().step(action))
        return self.results[-1]


def play(env: Any, responses: list[str]) -> Trajectory:
    proxy = ScriptedProxy(responses)
    manager = EnvManager(
        make_env=lambda: env,
        proxy=proxy,
        tokenizer=CharTokenizer(),
        rollout=RolloutConfig(rollout_batch_size=1, num_return_sequences=1, max_new_tokens=8),
        config=EnvManagerConfig(num_env_groups=1, group_size=1),
        seed=0,
    )
    episode = Episode(prompt_key="room", index=0, env_seed=0, admitted_version=0)
    return asyncio.run(manager.run_episode(episode, GroupControl(proxy, None)))


def response_ends(trajectory: Trajectory) -> list[int]:
    """Index of the last token of each response (a model token followed by an env token or the end)."""
    mask = list(trajectory.loss_mask)
    return [i for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]


def test_each_sokoban_turn_reward_lands_on_that_turns_last_token():
    env = FixedRoom(distance_shaping=0.5, step_penalty=0.1)
    trajectory = play(env, ["left", "right", "down", "down"])
    assert trajectory.status is TrajectoryStatus.COMPLETED
    step_rewards = [result.reward for result in env.results]
    assert step_rewards == pytest.approx([-0.1, -0.1, 0.4, 1.4])
    ends = response_ends(trajectory)
    assert len(ends) == 4
    expected = [0.0] * len(trajectory.token_ids)
    for end, reward in zip(ends, step_rewards, strict=True):
        expected[end] = reward
    assert trajectory.token_rewards == pytest.approx(expected)
    assert trajectory.reward == pytest.approx(sum(step_rewards))
    # The trainer's batch keeps them where they fell; the group total is what GRPO reads.
    batch = build_train_batch([Group(prompt_uid="room", trajectories=[trajectory])], [0.0])
    assert batch.token_rewards[0].tolist() == pytest.approx(expected)
    assert batch.rewards.tolist() == pytest.approx([sum(step_rewards)])


class PlacingEnv:
    """One turn; the reward is placed on the first and fourth characters of the action."""

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        return "go", {}

    async def step(self, action: str) -> StepResult:
        return StepResult("", PlacedRewards(((0, 0.3), (3, 0.7), (99, -0.2))), True, False, {})


def test_placed_env_rewards_land_on_the_tokens_their_offsets_name():
    trajectory = play(PlacingEnv(), ["down"])
    start = len("go")
    assert trajectory.token_rewards[start:] == pytest.approx([0.3, 0.0, 0.0, 0.7 - 0.2])
    assert trajectory.reward == pytest.approx(0.8)


class BadRewardEnv:
    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        return "go", {}

    async def step(self, action: str) -> StepResult:
        return StepResult("", float("nan"), True, False, {})


def test_a_non_finite_env_reward_fails_the_episode_with_a_reason():
    trajectory = play(BadRewardEnv(), ["up"])
    assert trajectory.status is TrajectoryStatus.FAILED
    assert "reward nan" in trajectory.reason


def test_offsets_map_to_the_token_holding_the_character():
    pieces = ["Th", "e ", "answer", " is", " 42"]  # tokens of several characters
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    ids = list(range(len(pieces)))
    text = decode(ids)
    for offset, char in enumerate(text):
        index = token_at(offset, ids, decode)
        start = len(decode(ids[:index]))
        assert start <= offset < start + len(pieces[index]), (offset, char)
    assert token_at(len(text) + 5, ids, decode) == len(ids) - 1
    placed = rewards_on_tokens(PlacedRewards(((text.index("42"), 1.0), (0, 0.5))), ids, decode)
    assert placed == [0.5, 0.0, 0.0, 0.0, 1.0]
    assert rewards_on_tokens(2.0, ids, decode) == [0.0, 0.0, 0.0, 0.0, 2.0]


@pytest.mark.parametrize(
    ("token_rewards", "message"),
    [
        ([0.0, 1.0, 0.0], "sum to 1.0, but its reward is 2.0"),
        ([1.0, 0.0, 1.0], "did not generate"),
        ([0.0, 2.0], "2 entries for 3 tokens"),
    ],
)
def test_the_batch_refuses_token_rewards_it_cannot_honour(token_rewards, message):
    trajectory = masked_trajectory([0, 1, 1], reward=2.0, token_rewards=token_rewards)
    with pytest.raises(ValueError, match=f"trajectory p#0: .*{message}"):
        build_train_batch([Group(prompt_uid="p", trajectories=[trajectory])], [0.0])


def test_a_total_reward_lands_on_the_last_model_token():
    trajectory = masked_trajectory([0, 1, 1, 0], reward=3.0)
    batch = build_train_batch([Group(prompt_uid="p", trajectories=[trajectory])], [0.0])
    assert batch.token_rewards.tolist() == [[0.0, 0.0, 3.0, 0.0]]


def masked_trajectory(
    loss_mask: list[int], reward: float, token_rewards: list[float] | None = None
) -> Trajectory:
    """A trajectory of ``len(loss_mask)`` tokens whose model tokens are where ``loss_mask`` is 1."""
    return Trajectory(
        prompt_uid="p",
        sample_index=0,
        token_ids=list(range(1, len(loss_mask) + 1)),
        loss_mask=loss_mask,
        logprobs=[-1.0 * m for m in loss_mask],
        versions=[0 if m else -1 for m in loss_mask],
        start_version=0,
        num_prompt_tokens=1,
        reward=reward,
        token_rewards=token_rewards,
    )


def test_an_rlvr_reward_placed_by_offset_reaches_the_trajectory():
    """The RLVR producer maps a reward function's PlacedRewards onto the response tokens (prompt tokens 0)."""
    from asyncrl.buffer.records import Admission
    from asyncrl.data.base import TaskSample
    from asyncrl.rewards.service import RewardService
    from asyncrl.rollout.prompt_source import Prompt
    from asyncrl.rollout.rlvr_producer import RLVRProducer

    def two_steps(text: str, sample: TaskSample) -> PlacedRewards:
        return PlacedRewards(((text.index("\n"), 0.25), (len(text), 1.0)))

    tokenizer = CharTokenizer()
    with RewardService(two_steps, timeout_s=5) as rewards:
        producer = RLVRProducer(
            source=None,
            proxy=None,
            rewards=rewards,
            buffer=None,
            tokenizer=tokenizer,
            config=RolloutConfig(),
            seed=0,
        )
        prompt = Prompt(key="k", sample=TaskSample(uid="s", prompt="Q?", answer="a"))
        generation = Generation(
            request_id="r",
            prompt_token_ids=tokenizer.encode("Q?"),
            token_ids=tokenizer.encode("ab\ncd"),
            logprobs=[-1.0] * 5,
            versions=[0] * 5,
            finish_reason=FinishReason.STOP,
        )
        admission = Admission(ticket_id=0, start_version=0, producer="rlvr")
        trajectory = asyncio.run(producer._score(admission, prompt, 0, generation))
    assert trajectory.token_rewards == [0.0, 0.0, 0.0, 0.0, 0.25, 0.0, 1.0]
    assert trajectory.reward == pytest.approx(1.25)
    build_train_batch([Group(prompt_uid="k", trajectories=[trajectory])], [0.0])  # consistent for the trainer
