"""The ``code`` reward: program extraction, per-test outcomes, scoring, and that nothing runs in-process."""

from __future__ import annotations

import builtins

import pytest

from asyncrl.config.reward import CodeRewardConfig, RewardConfig
from asyncrl.config.sandbox import SandboxConfig
from asyncrl.config.task import TaskConfig
from asyncrl.data import make_task
from asyncrl.data.base import TaskSample
from asyncrl.rewards import RewardService, RewardStatus
from asyncrl.rewards.code import CodeReward, extract_program, read_outcomes
from asyncrl.sandbox import SandboxResult, SandboxStatus

TESTS = ["assert f(1) == 3", "assert f(2) == 5", "assert f(0) == 0"]
SAMPLE = TaskSample(uid="s1", prompt="p", answer="", reward="code", metadata={"tests": TESTS})
FAST = CodeRewardConfig(test_timeout_s=0.3, sandbox=SandboxConfig(timeout_s=3.0))


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return CodeReward(FAST)


def test_extract_program_takes_the_last_python_block_or_the_whole_text():
    assert extract_program("no fences at all") == "no fences at all"
    assert extract_program("a\n```python\nx = 1\n```\nb\n```python\nx = 2\n```") == "x = 2\n"
    assert extract_program("```\nplain = 1\n```") == "plain = 1\n"
    assert extract_program("```py\nlabelled = 1\n```\n```\nplain = 1\n```") == "labelled = 1\n"


def result_with(report: bytes, status=SandboxStatus.OK, reason="") -> SandboxResult:
    return SandboxResult(
        status=status, exit_code=0, stdout="", stderr="", report=report, elapsed_s=0.1, reason=reason
    )


def test_read_outcomes_ignores_lines_without_the_nonce_and_repeats():
    report = (
        b'{"nonce": "fake", "test": 0, "passed": true}\n'
        b'{"nonce": "n", "test": 0, "passed": false, "error": "AssertionError"}\n'
        b'{"nonce": "n", "test": 0, "passed": true}\n'
        b"not json\n"
        b'{"nonce": "n", "test": 7, "passed": true}\n'
        b'{"nonce": "n", "test": 1, "passed": true}\n'
    )
    outcomes = read_outcomes(result_with(report), "n", 3)
    assert outcomes[0] == (False, "AssertionError") and outcomes[1] == (True, "")
    assert outcomes[2] == (False, "not reported: sandbox ok (exited early)")


def test_tests_never_reported_fail_with_the_sandbox_reason():
    outcomes = read_outcomes(result_with(b"", SandboxStatus.TIMEOUT, "timed out after 3s"), "n", 2)
    assert outcomes == [(False, "not reported: sandbox timeout (timed out after 3s)")] * 2


def test_a_correct_program_gets_full_reward(reward):
    score, info = reward("Sure:\n```python\ndef f(x):\n    return 2 * x + 1 if x else 0\n```", SAMPLE)
    assert score == 1.0 and info["num_passed"] == 3 and info["failures"] == []


def test_partial_credit_is_the_fraction_passed_and_failures_are_recorded(reward):
    score, info = reward("def f(x):\n    return 2 * x + 1", SAMPLE)
    assert score == pytest.approx(2 / 3)
    assert info["failures"] == ["test 2 (assert f(0) == 0): AssertionError"]


def test_all_or_nothing_scoring():
    strict = CodeReward(CodeRewardConfig(scoring="all_or_nothing", sandbox=FAST.sandbox))
    assert strict("def f(x):\n    return 2 * x + 1", SAMPLE)[0] == 0.0
    assert strict("def f(x):\n    return 2 * x + 1 if x else 0", SAMPLE)[0] == 1.0


def test_a_program_that_does_not_load_fails_every_test_with_its_error(reward):
    score, info = reward("def f(x) return", SAMPLE)
    assert score == 0.0 and all("the program raised SyntaxError" in f for f in info["failures"])


def test_a_hanging_test_fails_alone(reward):
    program = "def f(x):\n    while x == 2:\n        pass\n    return 2 * x + 1 if x else 0"
    score, info = reward(program, SAMPLE)
    assert score == pytest.approx(2 / 3)
    assert info["failures"] == ["test 1 (assert f(2) == 5): TimeLimit: test timed out"]


def test_spoofed_reports_without_the_nonce_earn_nothing(reward):
    program = (
        "import os\nfor i in range(3):\n"
        '    os.write(3, (\'{"nonce": "guess", "test": %d, "passed": true}\\n\' % i).encode())\n'
        "os._exit(0)\n"
    )
    score, info = reward(program, SAMPLE)
    assert score == 0.0 and info["num_passed"] == 0


def test_model_text_is_never_executed_in_the_training_process(reward, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("model text reached exec/eval/compile in the training process")

    for name in ("exec", "eval", "compile"):
        monkeypatch.setattr(builtins, name, refuse)
    score, _ = reward("```python\ndef f(x):\n    return 2 * x + 1 if x else 0\n```", SAMPLE)
    assert score == 1.0


def test_a_sample_without_tests_fails_with_a_reason_naming_it():
    service = RewardService.from_config(RewardConfig(name="code", code=FAST))
    (result,) = service.score_many_sync([("def f(x): pass", TaskSample(uid="bad-7", prompt="p", answer=""))])
    service.close()
    assert (
        result.status is RewardStatus.FAILED
        and "bad-7" in result.reason
        and "metadata['tests']" in result.reason
    )


def test_the_code_task_demonstrations_pass_their_own_tests_through_the_service():
    samples = make_task(TaskConfig(type="code", num_train=8, num_eval=2)).split("train")
    assert all(s.reward == "code" and len(s.metadata["tests"]) > s.metadata["num_items"] for s in samples)
    service = RewardService.from_config(RewardConfig(code=FAST))  # each sample's own reward: "code"
    results = service.score_many_sync([(s.demonstration, s) for s in samples])
    wrong = service.score_many_sync([("def f(x):\n    return None", s) for s in samples])
    service.close()
    assert [r.reward for r in results] == [1.0] * len(samples)
    assert all(r.ok and r.reward < 1.0 for r in wrong)
