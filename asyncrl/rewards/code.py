"""The ``code`` reward: unit tests run on model-written Python, only inside the sandbox.

Key decision: the training process only *reads* model text (a regex cuts out the program); compiling and
running it, and the tests, happen in ``asyncrl.sandbox`` under a harness that reports each test on its
own channel. The reward is the fraction of tests passed (or all-or-nothing), and ``info`` records why each
failed test failed. Tests come with the sample (``metadata["tests"]``: Python statements, usually asserts).

Threat model in one line: the sandbox protects the machine, not the reward's honesty; a program can still
cheat its own tests (e.g. exit early after faking reports), see docs/sandbox.md.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any

from asyncrl.config.reward import CodeRewardConfig
from asyncrl.data.base import TaskSample
from asyncrl.sandbox import Sandbox, SandboxResult

HARNESS = Path(__file__).with_name("code_harness.py")
_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
MAX_FAILURES_RECORDED = 5


def extract_program(response_text: str) -> str:
    """The last fenced ```python block (or the last unlabelled one); the whole text when there is none."""
    blocks = _FENCE.findall(response_text)
    labelled = [code for label, code in blocks if label]
    chosen = labelled or [code for _, code in blocks]
    return chosen[-1] if chosen else response_text


def sample_tests(sample: TaskSample) -> list[str]:
    """The sample's unit tests; ValueError naming the sample if it has none or they are not strings."""
    tests = sample.metadata.get("tests")
    if not isinstance(tests, list | tuple) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(
            f"sample {sample.uid}: the code reward needs metadata['tests'], a non-empty list of str"
        )
    return list(tests)


class CodeReward:
    """``(response_text, sample) -> (reward, info)`` running the sample's tests against the response."""

    def __init__(self, config: CodeRewardConfig) -> None:
        self.config = config
        self.sandbox = Sandbox(config.sandbox)  # probes now: an unusable sandbox fails at start-up
        self._harness = HARNESS.read_text()

    def __call__(self, response_text: str, sample: TaskSample) -> tuple[float, dict[str, Any]]:
        tests = sample_tests(sample)
        nonce = secrets.token_hex(16)
        result = self.sandbox.run_sync(
            self._harness,
            files={"solution.py": extract_program(response_text), "tests.json": json.dumps(tests)},
            stdin=f"{nonce}\n".encode(),
            args=[f"{self.config.test_timeout_s:g}"],
        )
        outcomes = read_outcomes(result, nonce, len(tests))
        return self.score(outcomes), summarize(outcomes, tests, result)

    def score(self, outcomes: list[tuple[bool, str]]) -> float:
        """Fraction of tests passed, or 1/0 for all passed / not with ``scoring: all_or_nothing``."""
        passed = sum(ok for ok, _ in outcomes)
        if self.config.scoring == "all_or_nothing":
            return float(passed == len(outcomes))
        return passed / len(outcomes)


def read_outcomes(result: SandboxResult, nonce: str, num_tests: int) -> list[tuple[bool, str]]:
    """(passed, error) per test from the harness's report; a test with no report failed with the sandbox's
    reason (timed out, output flood, crash). Lines without the nonce, or repeats, are ignored."""
    outcomes: dict[int, tuple[bool, str]] = {}
    for line in result.report.decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        ok = isinstance(entry, dict) and entry.get("nonce") == nonce and entry.get("test") in range(num_tests)
        if ok and entry["test"] not in outcomes:
            outcomes[entry["test"]] = (entry.get("passed") is True, str(entry.get("error", "")))
    missing = f"not reported: sandbox {result.status.value} ({result.reason or 'exited early'})"
    return [outcomes.get(i, (False, missing)) for i in range(num_tests)]


def summarize(outcomes: list[tuple[bool, str]], tests: list[str], result: SandboxResult) -> dict[str, Any]:
    """The per-sample record: counts, the first failures (test and reason), and how the sandbox ended."""
    failures = [f"test {i} ({tests[i][:80]}): {error}" for i, (ok, error) in enumerate(outcomes) if not ok]
    return {
        "num_tests": len(outcomes),
        "num_passed": len(outcomes) - len(failures),
        "failures": failures[:MAX_FAILURES_RECORDED],
        "sandbox_status": result.status.value,
        "sandbox_s": round(result.elapsed_s, 4),
    }
