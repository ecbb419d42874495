"""The gymnasium adapter: a Text-space env registered here and FrozenLake (Discrete actions, ansi render)."""

from __future__ import annotations

import asyncio

import pytest

gymnasium = pytest.importorskip("gymnasium")

from asyncrl.config.env import EnvConfig  # noqa: E402
from asyncrl.config.env_kinds import GymnasiumConfig  # noqa: E402
from asyncrl.envs import EnvError, ThreadedEnv, make_env  # noqa: E402
from asyncrl.envs.gymnasium_env import GymnasiumEnv  # noqa: E402


class EchoEnv(gymnasium.Env):
    """Text in, text out: the reward is 1 when the action repeats the observation; two steps per episode."""

    observation_space = gymnasium.spaces.Text(max_length=16)
    action_space = gymnasium.spaces.Text(max_length=16)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word, self.turn = f"w{self.np_random.integers(100)}", 0
        return self.word, {"word": self.word}

    def step(self, action):
        self.turn += 1
        reward = float(action == self.word)
        self.word = self.word + "x"
        return self.word, reward, self.turn == 2, False, {}


gymnasium.register(id="asyncrl-test/Echo-v0", entry_point=EchoEnv)


def step(env, action):
    return asyncio.run(env.step(action))


def test_text_env_plugs_in_through_make_env() -> None:
    env = make_env(EnvConfig(type="gymnasium", gymnasium=GymnasiumConfig(id="asyncrl-test/Echo-v0")))
    assert isinstance(env, ThreadedEnv)
    observation, info = asyncio.run(env.reset(3))
    assert observation == info["word"] == asyncio.run(make_env(env_config_echo()).reset(3))[0]
    first = step(env, observation)
    assert (first.observation, first.reward, first.terminated) == (observation + "x", 1.0, False)
    second = step(env, "wrong")
    assert (second.reward, second.terminated) == (0.0, True)
    with pytest.raises(EnvError, match="after the episode ended"):
        step(env, "again")


def env_config_echo() -> EnvConfig:
    return EnvConfig(type="gymnasium", gymnasium=GymnasiumConfig(id="asyncrl-test/Echo-v0"))


def frozen_lake(**overrides) -> GymnasiumEnv:
    kwargs = {"desc": ["SF", "FG"], "is_slippery": False, "render_mode": "ansi"}
    names = ["left", "down", "right", "up"]
    gym = GymnasiumConfig(id="FrozenLake-v1", kwargs=kwargs, action_names=names, **overrides)
    return GymnasiumEnv(EnvConfig(type="gymnasium", gymnasium=gym))


def test_discrete_actions_by_name_with_exact_transitions() -> None:
    env = frozen_lake()
    observation, _ = env.reset(0)
    assert "S" in observation and observation.endswith("FG\n")
    right = env.step(" Right ")
    assert (right.reward, right.terminated, right.info["invalid"]) == (0.0, False, False)
    assert right.observation.startswith("  (Right)\n")
    down = env.step("down")
    assert (down.reward, down.terminated) == (1.0, True)


@pytest.mark.parametrize("bad", ["2", "go right", "", "rightt"])
def test_bad_actions_cost_the_penalty_and_do_not_step(bad: str) -> None:
    env = frozen_lake(invalid_action_penalty=0.5)
    env.reset(0)
    result = env.step(bad)
    assert result.reward == -0.5 and not result.terminated and result.info["invalid"]
    assert result.observation == f"invalid action {bad.strip()!r}: answer one of left, down, right, up\n"
    assert env.step("right").info["invalid"] is False  # still at the start: one step right, not two


def test_non_text_envs_and_wrong_action_names_are_refused() -> None:
    with pytest.raises(ValueError, match="no text observations"):
        GymnasiumEnv(EnvConfig(type="gymnasium", gymnasium=GymnasiumConfig(id="FrozenLake-v1")))
    with pytest.raises(ValueError, match="has 2 names, the action space 4"):
        kwargs = {"render_mode": "ansi"}
        GymnasiumEnv(
            EnvConfig(
                type="gymnasium",
                gymnasium=GymnasiumConfig(id="FrozenLake-v1", kwargs=kwargs, action_names=["a", "b"]),
            )
        )


def test_missing_gymnasium_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gymnasium", None)  # import gymnasium now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'asyncrl\[gym\]'"):
        make_env(env_config_echo())
