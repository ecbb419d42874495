"""The environments' CodeRunner runs model code through the project's sandbox (escape tests: tests/unit/sandbox)."""

from __future__ import annotations

import asyncio
import time

from asyncrl.envs.code_runner import require_sandbox


def run(code: str, timeout_s: float = 5.0):
    return asyncio.run(require_sandbox().run(code, timeout_s=timeout_s))


def test_runs_code_and_returns_stdout() -> None:
    result = run("print(sum(range(10)))")
    assert (result.stdout, result.exit_code, result.timed_out) == ("45\n", 0, False)


def test_no_network_and_a_non_root_uid() -> None:
    net = run("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)")
    assert net.exit_code != 0 and "Network is unreachable" in net.stderr
    assert int(run("import os; print(os.getuid())").stdout) != 0


def test_timeout_kills_the_process_tree() -> None:
    started = time.monotonic()
    result = run("import os, time\nos.fork()\ntime.sleep(60)", timeout_s=0.5)
    assert result.timed_out and time.monotonic() - started < 5


def test_tool_use_python_tool_through_the_real_sandbox() -> None:
    from asyncrl.config.env import EnvConfig
    from asyncrl.config.env_kinds import ToolUseConfig
    from asyncrl.envs.tool_use import ToolUseEnv

    env = ToolUseEnv(EnvConfig(type="tool_use", tool_use=ToolUseConfig(python_tool=True)))

    async def main():
        await env.reset(0)
        return await env.step("python: print(6 * 7)"), await env.step(
            "python: import socket; socket.create_connection(('1.1.1.1', 80))"
        )

    ok, blocked = asyncio.run(main())
    assert ok.observation == "42\n" and not ok.info["invalid"]
    assert "error" in blocked.observation and (
        "OSError" in blocked.observation or "unreachable" in blocked.observation
    )
