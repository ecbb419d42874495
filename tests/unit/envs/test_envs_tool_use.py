"""tool_use: the safe calculator, exact tool turns, bad actions, and the sandboxed Python tool."""

from __future__ import annotations

import asyncio
import random

import pytest

from asyncrl.config.env import EnvConfig
from asyncrl.config.env_kinds import ToolUseConfig
from asyncrl.envs import code_runner
from asyncrl.envs.calculator import CalculatorError, evaluate, format_number
from asyncrl.envs.code_runner import CodeResult, SandboxUnavailable
from asyncrl.envs.tool_use import ToolUseEnv, make_question, parse_call


@pytest.mark.parametrize(
    ("expression", "value"),
    [("1 + 2 * 3", 7), ("(12 + 7) * 3", 57), ("-4 ** 2", -16), ("7 // 2 + 7 % 2", 4), ("1 / 4", 0.25)],
)
def test_calculator_values(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("__import__('os').system('true')", "Call is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("(1).real", "Attribute is not allowed"),
        ("9 ** 9 ** 9", "exponent"),
        ("1 / 0", "division by zero"),
        ("10.0 ** 60 * 10.0 ** 60", "too large"),
        ("1 +", "not an expression"),
        ("1" * 201, "longer than"),
        ("True + 1", "Constant is not allowed"),
    ],
)
def test_calculator_refuses_everything_but_arithmetic(expression: str, why: str) -> None:
    with pytest.raises(CalculatorError, match=why):
        evaluate(expression)


def test_format_number() -> None:
    assert [format_number(v) for v in (57, 4.0, 0.25, 1 / 3)] == ["57", "4", "0.25", "0.333333"]


def test_questions_are_seeded_and_parenthesised() -> None:
    config = ToolUseConfig(num_operands=3, max_operand=9)
    assert make_question(config, random.Random(3)) == make_question(config, random.Random(3))
    question = make_question(config, random.Random(3))
    assert question.count("(") == 1 and question.count(")") == 1 and len(question.split()) == 5


class FakeRunner:
    """A CodeRunner that records the code and answers from a script (tests the env, not the sandbox)."""

    def __init__(self, result: CodeResult) -> None:
        self.result, self.calls = result, []

    async def run(self, code: str, *, timeout_s: float) -> CodeResult:
        self.calls.append((code, timeout_s))
        return self.result


def run_turns(env: ToolUseEnv, seed: int, actions: list[str]):
    async def main():
        observation, info = await env.reset(seed)
        return observation, info, [await env.step(a) for a in actions]

    return asyncio.run(main())


def test_calc_then_answer_is_exact() -> None:
    env = ToolUseEnv(EnvConfig(type="tool_use"))
    observation, info, _ = run_turns(env, 5, [])
    question = info["question"]
    assert observation == f"compute {question}\ntools: calc: <expression>; finish with answer: <number>\n"
    value = format_number(evaluate(question))
    _, _, (calc, answer) = run_turns(env, 5, [f"calc: {question}", f"answer: {value}"])
    assert calc.observation == f"= {value}\n" and calc.reward == 0.0 and not calc.terminated
    assert answer.reward == 1.0 and answer.terminated and answer.info["correct"]
    _, _, (wrong,) = run_turns(env, 5, [f"answer: {value}1"])
    assert wrong.reward == 0.0 and wrong.terminated and not wrong.info["correct"]


@pytest.mark.parametrize("bad", ["42", "calc:", "calculate: 1+1", "python: print(1)", ""])
def test_bad_actions_cost_the_penalty(bad: str) -> None:
    env = ToolUseEnv(EnvConfig(type="tool_use", tool_use=ToolUseConfig(invalid_action_penalty=0.3)))
    _, _, (result,) = run_turns(env, 1, [bad])
    assert result.reward == -0.3 and not result.terminated and result.info["invalid"]
    assert result.observation.startswith("invalid action: tools: calc:")


def test_calc_errors_are_observations_not_crashes() -> None:
    env = ToolUseEnv(EnvConfig(type="tool_use"))
    _, _, (result,) = run_turns(env, 1, ["calc: open('/etc/passwd')"])
    assert result.observation == "error: Call is not allowed (only numbers and + - * / // % **)\n"


def test_python_tool_goes_through_the_runner_and_output_is_cut() -> None:
    config = EnvConfig(type="tool_use", tool_use=ToolUseConfig(python_tool=True, max_output_chars=5))
    runner = FakeRunner(CodeResult("1234567\n", "", 0, False))
    env = ToolUseEnv(config, runner=runner)
    _, _, (result,) = run_turns(env, 1, ["python: print(1234567)"])
    assert runner.calls == [("print(1234567)", 5.0)]
    assert result.observation == "12345 …(cut)\n"
    config = EnvConfig(type="tool_use", tool_use=ToolUseConfig(python_tool=True))
    failing = ToolUseEnv(config, runner=FakeRunner(CodeResult("", "Traceback\nNameError: x", 1, False)))
    assert run_turns(failing, 1, ["python: x"])[2][0].observation == "error: NameError: x\n"


def test_python_tool_refuses_to_start_without_a_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(config=None):
        raise SandboxUnavailable("bubblewrap cannot create namespaces here")

    monkeypatch.setattr(code_runner, "Sandbox", unavailable)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        ToolUseEnv(EnvConfig(type="tool_use", tool_use=ToolUseConfig(python_tool=True)))


def test_parse_call() -> None:
    assert parse_call(" CALC: 1+1 ") == ("calc", "1+1")
    assert parse_call("python: print(1)\nprint(2)") == ("python", "print(1)\nprint(2)")
    assert parse_call("answer 3") is None
