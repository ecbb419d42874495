"""Built-in reward functions and the name / dotted-path registry, with exact values."""

import sys
from pathlib import Path

import pytest

from asyncrl.config.reward import RewardConfig
from asyncrl.data import TaskSample
from asyncrl.rewards import get_reward, make_reward_fn, register_reward, registered_rewards

sys.path.insert(0, str(Path(__file__).parent))

COUNT = TaskSample(uid="c", prompt="count 8 to 10:", answer="8 9 10", format_regex=r"\s*\d+( \d+)*\s*")
SUM = TaskSample(
    uid="s", prompt="sum 3 4:", answer="7", answer_delimiter="=", format_regex=r"\s*\d+( \d+)* = \d+\s*"
)


@pytest.mark.parametrize(
    ("response", "sample", "expected"),
    [
        (" 8 9 10", COUNT, 1.0),
        ("8  9\n10 ", COUNT, 1.0),
        (" 8 9 10 11", COUNT, 0.0),
        (" 8 9", COUNT, 0.0),
        (" 3 7 = 7", SUM, 1.0),
        (" 3 8 = 7", SUM, 1.0),  # only the final answer counts
        (" 3 7 = 8", SUM, 0.0),
        (" 3 7", SUM, 0.0),
    ],
)
def test_exact_match(response, sample, expected):
    assert get_reward("exact_match")(response, sample) == expected


def test_format_reward():
    fmt = get_reward("format")
    assert [fmt(r, COUNT) for r in (" 8 9 10", " 8 x", "")] == [1.0, 0.0, 0.0]
    assert [fmt(r, SUM) for r in (" 3 7 = 7", " 3 7 = ", " 3 7")] == [1.0, 0.0, 0.0]
    free = TaskSample(uid="f", prompt="p", answer="a", answer_delimiter="####")
    assert [fmt(r, free) for r in ("x #### 5", "x ####", "x")] == [1.0, 0.0, 0.0]


def test_math_equiv():
    half = TaskSample(uid="m", prompt="p", answer="\\frac{1}{2}")
    math_equiv = get_reward("math_equiv")
    assert math_equiv("so it is $\\boxed{0.5}$", half)[0] == 1.0
    assert math_equiv("so it is $\\boxed{1/3}$", half)[0] == 0.0
    delimited = TaskSample(uid="m", prompt="p", answer="6", answer_delimiter="####")
    assert math_equiv("3 + 3 = 6 #### 6", delimited)[0] == 1.0
    assert math_equiv("6 #### 7", delimited)[0] == 0.0


def test_registry_names_paths_and_errors():
    assert {"exact_match", "format", "math_equiv", "reasoning_gym"} <= set(registered_rewards())
    assert get_reward("reward_plugins:length_reward")("abc", COUNT) == (3.0, {"chars": 3})
    with pytest.raises(ValueError, match="reward.name must be one of"):
        get_reward("exact")
    with pytest.raises(ValueError, match="cannot be imported"):
        get_reward("reward_plugins:missing")
    with pytest.raises(ValueError, match="is not callable"):
        get_reward("reward_plugins:not_callable")
    with pytest.raises(ValueError, match="already registered"):
        register_reward("exact_match")(lambda text, sample: 0.0)


def test_configured_reward_adds_weighted_format_and_uses_sample_default():
    reward_fn = make_reward_fn(RewardConfig(format_weight=0.25))
    assert reward_fn(" 8 9 10", COUNT) == (1.25, {"format": 1.0})
    assert reward_fn(" 8 9", COUNT) == (0.25, {"format": 1.0})
    assert reward_fn(" 8 x", COUNT) == (0.0, {"format": 0.0})
    assert make_reward_fn(RewardConfig(name="reward_plugins:length_reward"))("ab", COUNT) == (
        2.0,
        {"chars": 2},
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "a b"}, "reward.name must be a registered name"),
        ({"name": "pkg.mod:"}, "reward.name must be a registered name"),
        ({"timeout_s": 0.0}, "reward.timeout_s must be > 0"),
        ({"format_weight": -1.0}, "reward.format_weight"),
        ({"executor": "fiber"}, "reward.executor must be one of 'thread', 'process'"),
        ({"max_workers": 0}, "reward.max_workers"),
    ],
)
def test_reward_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(**overrides)
