"""The reward service: concurrent scoring where a raising or timed-out reward fails only its own sample."""

import sys
import time
from pathlib import Path

import pytest

from asyncrl.data import TaskSample
from asyncrl.rewards import RewardService, RewardStatus, get_reward
from asyncrl.rewards.service import ConfiguredReward
from asyncrl.types import PlacedRewards

sys.path.insert(0, str(Path(__file__).parent))

SAMPLE = TaskSample(uid="s-1", prompt="p", answer="a")


def test_results_keep_order_and_info():
    with RewardService(get_reward("reward_plugins:length_reward"), timeout_s=5) as service:
        results = service.score_many_sync([("ab", SAMPLE), ("abcd", SAMPLE)])
    assert [(r.reward, r.status, r.info) for r in results] == [
        (2.0, RewardStatus.OK, {"chars": 2}),
        (4.0, RewardStatus.OK, {"chars": 4}),
    ]


def test_raising_reward_fails_only_its_sample():
    with RewardService(get_reward("reward_plugins:raising_reward"), timeout_s=5) as service:
        ok, failed = service.score_many_sync([("fine", SAMPLE), ("boom", SAMPLE)])
    assert (ok.reward, ok.status) == (1.0, RewardStatus.OK)
    assert (failed.reward, failed.status) == (0.0, RewardStatus.FAILED)
    assert failed.reason == "sample s-1: reward raised RuntimeError: kaboom"
    assert not failed.ok and ok.ok


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("nan", "reward must be a finite number or PlacedRewards, got nan"),
        ("str", "reward must be a finite number or PlacedRewards, got '1'"),
        ("info", "reward info must be a dict, got list"),
    ],
)
def test_invalid_outputs_fail_with_reason(response, reason):
    with RewardService(get_reward("reward_plugins:bad_output_reward"), timeout_s=5) as service:
        (result,) = service.score_many_sync([(response, SAMPLE)])
    assert result.status is RewardStatus.FAILED
    assert result.reason == f"sample s-1: reward raised ValueError: {reason}"


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_timeout_fails_the_slow_sample_and_the_rest_continue(executor):
    """The timeout counts from submission, so in a process pool it covers forking a worker of this
    torch-loaded process: 1.5 s leaves the quick calls room on a loaded box. Waiting out the slow call would
    take 6 s, past the elapsed bound."""
    slow = get_reward("reward_plugins:sleepy_reward")
    with RewardService(slow, timeout_s=1.5, executor=executor, max_workers=2) as service:
        start = time.perf_counter()
        results = service.score_many_sync([("6", SAMPLE), ("0", SAMPLE), ("0.01", SAMPLE)])
        elapsed = time.perf_counter() - start
        after = service.score_many_sync([("0", SAMPLE)])
    assert [r.status for r in results] == [RewardStatus.FAILED, RewardStatus.OK, RewardStatus.OK]
    assert results[0].reason == "sample s-1: reward timed out after 1.5s"
    assert elapsed < 4.5
    assert after[0].status is RewardStatus.OK


def test_calls_run_concurrently():
    slow = get_reward("reward_plugins:sleepy_reward")
    with RewardService(slow, timeout_s=5, max_workers=4) as service:
        start = time.perf_counter()
        results = service.score_many_sync([("0.3", SAMPLE)] * 4)
    assert all(r.ok for r in results)
    assert time.perf_counter() - start < 1.0


def test_unknown_executor_is_rejected():
    with pytest.raises(ValueError, match="reward.executor must be 'thread' or 'process'"):
        RewardService(get_reward("exact_match"), timeout_s=1, executor="fiber")


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_placed_reward_keeps_its_points_and_totals_them(executor):
    with RewardService(get_reward("reward_plugins:step_reward"), timeout_s=30, executor=executor) as service:
        (result,) = service.score_many_sync([("step one\nstep two\n", SAMPLE)])
    assert result.ok and result.reward == pytest.approx(1.5)
    assert result.placed == PlacedRewards(((8, 0.5), (17, 1.0)))


def test_format_weight_adds_its_score_on_the_last_token_of_a_placed_reward():
    reward = ConfiguredReward("reward_plugins:step_reward", format_weight=0.5)
    placed, info = reward("step one\n", SAMPLE)
    assert placed.points[:1] == ((8, 0.5),) and placed.points[1][0] == len("step one\n")
    assert placed.total == pytest.approx(0.5 + 0.5 * info["format"])
