"""Running untrusted Python (model-written code, tool calls) in a bubblewrap sandbox; see docs/sandbox.md."""

from asyncrl.sandbox.bwrap import SandboxUnavailable
from asyncrl.sandbox.sandbox import REPORT_FD, Sandbox, SandboxResult, SandboxStatus

__all__ = ["REPORT_FD", "Sandbox", "SandboxResult", "SandboxStatus", "SandboxUnavailable"]
