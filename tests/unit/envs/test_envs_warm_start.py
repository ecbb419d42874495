"""The warm starts' demonstrations (Sokoban, FrozenLake): optimal, and tokenised exactly as contexts are built."""

from __future__ import annotations

import asyncio

from asyncrl.config.env import EnvConfig
from asyncrl.config.env_kinds import SokobanConfig
from asyncrl.config.loader import load_config
from asyncrl.config.run import RunConfig
from asyncrl.envs.frozen_lake import FrozenLakeEnv
from asyncrl.envs.sokoban import SokobanEnv
from asyncrl.envs.warm_start import encode_episode, frozen_lake_episode, scripted_episode
from asyncrl.models.sft import IGNORE_INDEX


class CharTokenizer:
    """One id per character, EOS 0: enough to check the layout of ids and labels exactly."""

    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_scripted_episode_solves_its_room_in_the_env() -> None:
    config = EnvConfig(type="sokoban", sokoban=SokobanConfig(num_pulls=3))
    for seed in range(10):
        observations, responses = scripted_episode(config.sokoban, seed)
        env = SokobanEnv(config)
        first, info = asyncio.run(env.reset(seed))
        assert observations[0] == first and len(responses) <= len(info["solution"])
        for i, response in enumerate(responses):
            result = asyncio.run(env.step(response))
            assert result.terminated == (i == len(responses) - 1)
            if not result.terminated:
                assert result.observation == observations[i + 1]
        assert result.reward == 1.0


def test_encode_episode_labels_only_responses_and_their_eos() -> None:
    example = encode_episode(CharTokenizer(), ["ab", "c"], [" d", " u"])
    assert example.input_ids == [97, 98, 32, 100, 0, 99, 32, 117, 0]
    no = IGNORE_INDEX
    assert example.labels == [no, no, 32, 100, 0, no, 32, 117, 0]


def test_the_sokoban_example_config_loads() -> None:
    config = load_config(RunConfig, "asyncrl/examples/agentic_sokoban.yaml")
    assert config.env is not None and config.env.type == "sokoban" and config.env.sokoban.num_pulls == 2


def test_scripted_frozen_lake_episode_reaches_the_goal_in_the_env() -> None:
    for size in (4, 8):
        for seed in range(10):
            observations, responses = frozen_lake_episode(size, seed)
            env = FrozenLakeEnv(size)
            first, info = asyncio.run(env.reset(seed))
            assert observations[0] == first and len(responses) == info["shortest"]
            for i, response in enumerate(responses):
                result = asyncio.run(env.step(response))
                assert result.terminated == (i == len(responses) - 1)
                if not result.terminated:
                    assert result.observation == observations[i + 1]
            assert result.reward == 1.0


def test_the_frozen_lake_example_configs_start_from_its_warm_start() -> None:
    built_in = load_config(RunConfig, "asyncrl/examples/agentic_frozen_lake.yaml")
    external = load_config(RunConfig, "asyncrl/examples/agents/frozen_lake.yaml")
    assert built_in.env is not None and built_in.env.type == "asyncrl.envs.frozen_lake:make_4x4"
    assert built_in.model.path == external.model.path == "runs/tiny-frozen-lake"
