"""``tool_use``: arithmetic questions the model may answer with tools, one tool call or answer per turn.

A turn's response is one of:

- ``calc: <expression>``: the safe calculator (``asyncrl.envs.calculator``); the observation is ``= <value>``
  or ``error: <why>``.
- ``python: <code>`` (only with ``env.tool_use.python_tool``): the code runs in the sandbox (a
  ``CodeRunner``); the observation is its stdout, else its error, cut to ``max_output_chars``.
- ``answer: <number>``: ends the episode with reward 1 when it equals the question's value, else 0.

Anything else costs ``invalid_action_penalty`` and the observation says what is accepted. The question is a
pure function of the seed: ``num_operands`` integers joined by ``+ - *`` with one pair of parentheses.
"""

from __future__ import annotations

import random
from typing import Any

from asyncrl.config.env import EnvConfig
from asyncrl.config.env_kinds import ToolUseConfig
from asyncrl.envs.base import EnvError, StepResult
from asyncrl.envs.calculator import CalculatorError, evaluate, format_number
from asyncrl.envs.code_runner import CodeRunner, require_sandbox


def make_question(config: ToolUseConfig, rng: random.Random) -> str:
    """An expression such as ``(12 + 7) * 3``: operands 1..max_operand, operators from + - *."""
    operands = [str(rng.randint(1, config.max_operand)) for _ in range(config.num_operands)]
    operators = [rng.choice("+-*") for _ in range(config.num_operands - 1)]
    if config.num_operands > 2:
        start = rng.randrange(config.num_operands - 1)
        operands[start] = "(" + operands[start]
        operands[start + 1] += ")"
    parts = [operands[0]]
    for op, operand in zip(operators, operands[1:], strict=True):
        parts += [op, operand]
    return " ".join(parts)


def parse_call(text: str) -> tuple[str, str] | None:
    """(tool, argument) for ``calc: …``, ``python: …`` or ``answer: …``; None otherwise."""
    head, sep, argument = text.strip().partition(":")
    tool = head.strip().lower()
    if not sep or tool not in ("calc", "python", "answer") or not argument.strip():
        return None
    return tool, argument.strip()


class ToolUseEnv:
    """The game above; with the Python tool it needs a sandbox, and refuses to start without one."""

    def __init__(self, config: EnvConfig, runner: CodeRunner | None = None) -> None:
        self.config = config.tool_use
        self.runner = runner
        if self.config.python_tool and self.runner is None:
            self.runner = require_sandbox()  # raises SandboxUnavailable: model code never runs unsandboxed
        self.question = ""
        self.value: float | None = None

    def tools_line(self) -> str:
        tools = "calc: <expression>" + (", python: <code>" if self.config.python_tool else "")
        return f"tools: {tools}; finish with answer: <number>"

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.question = make_question(self.config, random.Random(seed))
        self.value = float(evaluate(self.question))
        return f"compute {self.question}\n{self.tools_line()}\n", {"question": self.question}

    async def step(self, action: str) -> StepResult:
        if self.value is None:
            raise EnvError("tool_use: step() called before reset() or after the answer")
        call = parse_call(action)
        if call is None or (call[0] == "python" and not self.config.python_tool):
            note = f"invalid action: {self.tools_line()}\n"
            return StepResult(note, -self.config.invalid_action_penalty, False, False, {"invalid": True})
        tool, argument = call
        if tool == "answer":
            return self._answer(argument)
        output = self._calc(argument) if tool == "calc" else await self._python(argument)
        return StepResult(self._cut(output) + "\n", 0.0, False, False, {"invalid": False, "tool": tool})

    def _answer(self, argument: str) -> StepResult:
        try:
            correct = abs(float(argument) - (self.value or 0.0)) < 1e-6
        except ValueError:
            correct = False
        self.value = None
        return StepResult("", 1.0 if correct else 0.0, True, False, {"invalid": False, "correct": correct})

    @staticmethod
    def _calc(expression: str) -> str:
        try:
            return "= " + format_number(evaluate(expression))
        except CalculatorError as err:
            return f"error: {err}"

    async def _python(self, code: str) -> str:
        assert self.runner is not None
        result = await self.runner.run(code, timeout_s=self.config.python_timeout_s)
        if result.timed_out:
            return f"error: timed out after {self.config.python_timeout_s}s"
        if result.exit_code != 0:
            last = (result.stderr.strip().splitlines() or ["exit code " + str(result.exit_code)])[-1]
            return f"error: {last}"
        return result.stdout.rstrip("\n")

    def _cut(self, text: str) -> str:
        limit = self.config.max_output_chars
        return text if len(text) <= limit else text[:limit] + " …(cut)"
