"""Running model-written code for environments: the ``CodeRunner`` seam over the project's one sandbox.

Key decision: model text is never executed in this process, and there is one sandbox implementation
(``asyncrl.sandbox``: bubblewrap namespaces, a non-root uid per slot, rlimits, capped output, the whole pid
namespace killed on timeout). Environments talk to a ``CodeRunner`` so tests can substitute a fake; the real
one is ``SandboxRunner``, and ``require_sandbox`` refuses to start (``SandboxUnavailable``) where the sandbox
cannot run, rather than falling back to an unsandboxed interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from asyncrl.config.sandbox import SandboxConfig
from asyncrl.sandbox import Sandbox, SandboxStatus, SandboxUnavailable

__all__ = ["CodeResult", "CodeRunner", "SandboxRunner", "SandboxUnavailable", "require_sandbox"]


@dataclass(frozen=True)
class CodeResult:
    """What one sandboxed run produced; ``timed_out`` runs were killed and their output may be partial."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool


class CodeRunner(Protocol):
    """Runs untrusted Python source in isolation and returns its output."""

    async def run(self, code: str, *, timeout_s: float) -> CodeResult: ...


class SandboxRunner:
    """``CodeRunner`` over ``asyncrl.sandbox.Sandbox``: the program runs as ``/input/main.py``, cwd ``/work``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    async def run(self, code: str, *, timeout_s: float) -> CodeResult:
        result = await self.sandbox.run(code, timeout_s=timeout_s)
        return CodeResult(
            stdout=result.stdout,
            stderr=result.stderr or result.reason,
            exit_code=-1 if result.exit_code is None else result.exit_code,
            timed_out=result.status is SandboxStatus.TIMEOUT,
        )


def require_sandbox(config: SandboxConfig | None = None) -> SandboxRunner:
    """A runner on a probed, working sandbox; ``SandboxUnavailable`` says why there is none."""
    return SandboxRunner(Sandbox(config))
