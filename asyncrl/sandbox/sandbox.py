"""``Sandbox.run``: one untrusted Python program in bubblewrap, with limits, a deadline and capped output.

Key decision: the sandbox is the kernel's, not Python's. The program runs in fresh pid, network, ipc and
uts namespaces as a non-root uid with no capabilities and rlimits set, sees only read-only system files,
its inputs and a private tmpfs. Bubblewrap's init is pid 1 of the sandbox, so when the program ends, times
out or floods its output, killing that one process ends every process inside (setsid grandchildren too).
The constructor runs a probe: a machine where the sandbox cannot start fails there, at start-up, and
nothing ever falls back to running the code unsandboxed.

Lifecycle of a call: wait for a slot → write inputs → start bwrap → read stdout / stderr / report, each
capped → exited | timed out | output over the cap (then killed) → slot released, inputs removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from asyncrl.config.sandbox import SandboxConfig
from asyncrl.sandbox.bwrap import (
    INPUT_DIR,
    SandboxUnavailable,
    build_invocation,
    default_python,
    find_bwrap,
)
from asyncrl.sandbox.pool import SlotPool

REPORT_FD = 3
"""The program may write a machine-readable report to this file descriptor (kept apart from its stdout)."""
_KILL_GRACE_S = 5.0


class SandboxStatus(str, enum.Enum):
    """How a sandboxed program ended: exited 0 (ok), exited otherwise or by a signal (error),
    ran past the deadline (timeout), or wrote more than the output cap (output_limit)."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    OUTPUT_LIMIT = "output_limit"


@dataclass(frozen=True, kw_only=True)
class SandboxResult:
    """What one sandboxed run produced; outputs are cut at ``output_bytes`` each."""

    status: SandboxStatus
    exit_code: int | None
    """The program's exit status (bwrap reports 128 + n for a death by signal n); None if it was killed."""
    stdout: str
    stderr: str
    report: bytes
    """Bytes the program wrote to ``REPORT_FD``."""
    elapsed_s: float
    reason: str = ""
    """Why the status is not OK, in a few words (empty when OK)."""

    @property
    def ok(self) -> bool:
        return self.status is SandboxStatus.OK


class Sandbox:
    """Runs untrusted Python programs, ``config.max_concurrency`` at a time, from any thread or event loop."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._bwrap = find_bwrap(self.config.bwrap_path)
        self._python = self.config.python or default_python()
        self._slots = SlotPool(self.config.max_concurrency)
        self._probe()

    async def run(
        self,
        program: str,
        *,
        files: Mapping[str, str | bytes] | None = None,
        stdin: bytes = b"",
        args: Sequence[str] = (),
        timeout_s: float | None = None,
        limits: SandboxConfig | None = None,
    ) -> SandboxResult:
        """Run ``program`` (Python source) as ``/input/main.py args...`` with cwd ``/work``; ``files`` are put
        next to it in the read-only ``/input``. Never raises for anything the program does; the deadline
        (``timeout_s``, else the limits' ``timeout_s``) counts from the start of the program, not the wait.
        ``limits`` replaces the instance's rlimits, sizes and output cap for this call (the slot, uid,
        binary, interpreter and read-only binds stay the instance's)."""
        config = self.config if limits is None else self._call_config(limits)
        inputs = {**(files or {}), "main.py": program}
        slot = await self._slots.acquire()
        try:
            with _input_dir(inputs) as input_dir:
                argv = [f"{INPUT_DIR}/main.py", *args]
                return await self._run_in_slot(
                    config, slot, input_dir, argv, stdin, timeout_s or config.timeout_s
                )
        finally:
            self._slots.release(slot)

    def _call_config(self, limits: SandboxConfig) -> SandboxConfig:
        own = ("bwrap_path", "python", "max_concurrency", "uid_base", "extra_ro_binds")
        return replace(limits, **{name: getattr(self.config, name) for name in own})

    def run_sync(self, program: str, **kwargs: Any) -> SandboxResult:
        """``run`` for callers without an event loop (reward functions in a worker thread or process)."""
        return asyncio.run(self.run(program, **kwargs))

    async def _run_in_slot(
        self,
        config: SandboxConfig,
        slot: int,
        input_dir: str,
        argv: list[str],
        stdin: bytes,
        timeout_s: float,
    ) -> SandboxResult:
        report_read, report_write = os.pipe()
        invocation = build_invocation(
            config,
            bwrap=self._bwrap,
            python=self._python,
            uid=config.uid_base + slot,
            input_dir=input_dir,
            report_fd=report_write,
            args=argv,
        )
        start = time.perf_counter()
        with os.fdopen(report_read, "rb", buffering=0) as report_file:
            try:
                process = await asyncio.create_subprocess_exec(
                    *invocation.argv,
                    env=invocation.env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(report_write,),
                    start_new_session=True,
                )
            finally:
                os.close(report_write)
            run = _Run(process, report_file, config.output_bytes)
            status, reason = await run.finish(stdin, timeout_s)
        return SandboxResult(
            status=status,
            exit_code=None
            if status in (SandboxStatus.TIMEOUT, SandboxStatus.OUTPUT_LIMIT)
            else process.returncode,
            stdout=run.outputs["stdout"].decode("utf-8", "replace"),
            stderr=run.outputs["stderr"].decode("utf-8", "replace"),
            report=run.outputs["report"],
            elapsed_s=time.perf_counter() - start,
            reason=reason,
        )

    def _probe(self) -> None:
        """Start one trivial program; SandboxUnavailable with bwrap's own words if that fails."""
        probe = replace(self.config, max_concurrency=1)
        with _input_dir({"main.py": "pass\n"}) as input_dir:
            invocation = build_invocation(
                probe,
                bwrap=self._bwrap,
                python=self._python,
                uid=probe.uid_base,
                input_dir=input_dir,
                report_fd=2,
                args=[f"{INPUT_DIR}/main.py"],
            )
            try:
                done = subprocess.run(invocation.argv, env=invocation.env, capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as err:
                raise SandboxUnavailable(f"the sandbox ({self._bwrap}) cannot start: {err}") from err
        if done.returncode != 0:
            message = done.stderr.decode("utf-8", "replace").strip()[-500:]
            raise SandboxUnavailable(
                f"the sandbox ({self._bwrap}) cannot start on this machine (exit {done.returncode}): {message}. "
                "bubblewrap needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                "or a container allowing them) or root; untrusted code is never run without it"
            )


class _Run:
    """One started bwrap process: feed stdin, read its three outputs with caps, enforce the deadline."""

    def __init__(self, process: asyncio.subprocess.Process, report_file, cap: int) -> None:
        self.process = process
        self.cap = cap
        self.outputs = {"stdout": b"", "stderr": b"", "report": b""}
        self._report_file = report_file
        self._overflow = asyncio.Event()

    async def finish(self, stdin: bytes, timeout_s: float) -> tuple[SandboxStatus, str]:
        loop = asyncio.get_running_loop()
        report = asyncio.StreamReader(limit=self.cap + 1)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(report), self._report_file
        )
        readers = [
            self._read("stdout", self.process.stdout),
            self._read("stderr", self.process.stderr),
            self._read("report", report),
        ]
        done = asyncio.ensure_future(asyncio.gather(self._feed(stdin), *readers, self.process.wait()))
        overflow = asyncio.ensure_future(self._overflow.wait())
        try:
            finished, _ = await asyncio.wait(
                {done, overflow}, timeout=timeout_s, return_when="FIRST_COMPLETED"
            )
            if done in finished:
                done.result()
                return self._exit_status()
            status = SandboxStatus.OUTPUT_LIMIT if overflow in finished else SandboxStatus.TIMEOUT
            reason = (
                f"output over {self.cap} bytes" if overflow in finished else f"timed out after {timeout_s:g}s"
            )
            await self._kill(done)
            return status, reason
        except asyncio.CancelledError:
            self._signal_kill()  # the caller gave up: nothing it started may keep running
            done.cancel()
            raise
        finally:
            overflow.cancel()
            transport.close()
            # Close the process's pipes while this loop runs: left to the garbage collector, they would be
            # closed after ``run_sync``'s loop is gone ("Event loop is closed" at interpreter exit).
            self.process._transport.close()  # noqa: SLF001 (asyncio.subprocess.Process has no public close)

    def _exit_status(self) -> tuple[SandboxStatus, str]:
        code = self.process.returncode
        if code == 0:
            return SandboxStatus.OK, ""
        if code is not None and code > 128:
            return SandboxStatus.ERROR, f"killed by signal {code - 128}"
        return SandboxStatus.ERROR, f"exit status {code}"

    def _signal_kill(self) -> None:
        """SIGKILL bwrap's process group: its init dies, and with it every process of the pid namespace."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    async def _feed(self, stdin: bytes) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.process.stdin.write(stdin)
            await self.process.stdin.drain()
        self.process.stdin.close()

    async def _read(self, name: str, stream: asyncio.StreamReader | None) -> None:
        assert stream is not None
        while chunk := await stream.read(65536):
            room = self.cap - len(self.outputs[name])
            self.outputs[name] += chunk[: max(room, 0)]
            if len(chunk) > room:
                # Keep draining (and dropping): asyncio's process.wait() returns only once every pipe has
                # reached EOF, and a reader that stopped would leave its pipe paused and wait() hung.
                self._overflow.set()

    async def _kill(self, pending: asyncio.Future) -> None:
        """Kill the sandbox and let the readers drain to EOF and bwrap be reaped (``pending`` is their gather);
        past the grace time stop waiting: the kill has been sent and the pipes are closed on return."""
        self._signal_kill()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(pending, _KILL_GRACE_S)


@contextlib.contextmanager
def _input_dir(files: Mapping[str, str | bytes]):
    """A host temp dir holding ``files``, readable by the sandbox's uid (bound read-only at /input)."""
    path = tempfile.mkdtemp(prefix="asyncrl-sandbox-")
    try:
        os.chmod(path, 0o755)
        for name, content in files.items():
            if "/" in name or name in ("", ".", ".."):
                raise ValueError(f"sandbox input file names must be plain names, got {name!r}")
            data = content.encode() if isinstance(content, str) else content
            target = os.path.join(path, name)
            with open(target, "wb") as f:
                f.write(data)
            os.chmod(target, 0o644)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


__all__ = ["REPORT_FD", "Sandbox", "SandboxResult", "SandboxStatus", "SandboxUnavailable"]
