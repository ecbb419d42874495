"""Escape attempts, each of which must fail inside the sandbox (and leave nothing running behind)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from asyncrl.config.sandbox import SandboxConfig
from asyncrl.sandbox import Sandbox, SandboxStatus, SandboxUnavailable

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxConfig(timeout_s=5.0, cpu_s=2, memory_mb=256, processes=16, output_bytes=4096))


def run(sandbox: Sandbox, program: str, **kwargs):
    return sandbox.run_sync(program, **kwargs)


def host_processes_with(token: str) -> list[int]:
    """Host pids whose command line holds ``token`` (the sandbox hides nothing from the host's /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline:
                pids.append(int(entry.name))
    return pids


def test_a_normal_program_runs_with_its_inputs_stdout_and_report(sandbox):
    program = "import os, sys\nprint(open('/input/data.txt').read().upper())\nos.write(3, b'report')\n"
    result = run(sandbox, program, files={"data.txt": "hello"}, stdin=b"")
    assert result.status is SandboxStatus.OK, result.stderr
    assert (result.stdout, result.report, result.exit_code) == ("HELLO\n", b"report", 0)


def test_the_program_runs_as_a_non_root_uid_without_capabilities(sandbox):
    program = "import os\nprint(os.getuid(), os.geteuid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])"
    result = run(sandbox, program)
    uid, euid, caps = result.stdout.split()
    assert int(uid) == int(euid) >= sandbox.config.uid_base
    assert int(caps, 16) == 0


def test_a_raising_program_reports_an_error_with_its_traceback(sandbox):
    result = run(sandbox, "raise SystemExit('failed on purpose')")
    assert result.status is SandboxStatus.ERROR and result.exit_code == 1
    assert "failed on purpose" in result.stderr


def test_network_is_unreachable_even_to_the_hosts_loopback(sandbox):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    program = (
        f"import socket\nfor addr in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
        "    try:\n        socket.create_connection(addr, timeout=1)\n        print('connected', addr)\n"
        "    except OSError as err:\n        print('blocked', err.errno)\n"
    )
    try:
        result = run(sandbox, program)
    finally:
        server.close()
    assert result.ok and "connected" not in result.stdout
    assert result.stdout.count("blocked") == 2


def test_writing_outside_the_work_dir_fails_and_work_is_writable(sandbox, tmp_path):
    targets = ["/usr/evil", "/input/main.py", str(tmp_path / "evil"), "/root/evil", "/evil", "/dev/shm/evil"]
    program = (
        f"targets = {targets!r}\nopen('/work/ok', 'w').write('fine')\nfor path in targets:\n"
        "    try:\n        open(path, 'w').write('x')\n        print('WROTE', path)\n"
        "    except OSError as err:\n        print('blocked', path, type(err).__name__)\n"
    )
    result = run(sandbox, program)
    assert result.ok, result.stderr
    assert "WROTE" not in result.stdout and result.stdout.count("blocked") == len(targets)
    assert not (tmp_path / "evil").exists()


def test_host_files_outside_are_not_readable(sandbox):
    targets = ["/etc/shadow", "/etc/passwd", str(REPO / "pyproject.toml"), "/root/.bashrc", "/proc/1/environ"]
    program = (
        f"for path in {targets!r}:\n    try:\n        open(path).read()\n        print('READ', path)\n"
        "    except OSError as err:\n        print('blocked', path, type(err).__name__)\n"
    )
    result = run(sandbox, program)
    assert result.ok, result.stderr
    assert "READ" not in result.stdout and result.stdout.count("blocked") == len(targets)


def test_a_fork_bomb_hits_the_process_limit(sandbox):
    program = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(60)\n            os._exit(0)\n        n += 1\n"
        "except OSError as err:\n    print('blocked after', n, err.errno)\n"
    )
    result = run(sandbox, program)
    assert result.ok and result.stdout.startswith("blocked after")
    assert int(result.stdout.split()[2]) < sandbox.config.processes


def test_memory_exhaustion_fails_inside(sandbox):
    result = run(sandbox, "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))")
    assert result.status is SandboxStatus.ERROR and "MemoryError" in result.stderr


def test_an_infinite_loop_is_killed_at_the_deadline():
    sandbox = Sandbox(SandboxConfig(timeout_s=0.5, cpu_s=30))
    result = run(sandbox, "while True:\n    pass")
    assert result.status is SandboxStatus.TIMEOUT and result.exit_code is None
    assert 0.5 <= result.elapsed_s < 3.0


def test_cpu_exhaustion_is_killed_by_the_cpu_limit():
    sandbox = Sandbox(SandboxConfig(timeout_s=10.0, cpu_s=1))
    result = run(sandbox, "while True:\n    pass")
    assert result.status is SandboxStatus.ERROR and result.reason.startswith("killed by signal")


def test_huge_output_is_capped_and_the_program_killed(sandbox):
    started = time.perf_counter()
    result = run(sandbox, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    assert result.status is SandboxStatus.OUTPUT_LIMIT
    assert len(result.stdout) == sandbox.config.output_bytes
    assert time.perf_counter() - started < 3.0


def test_huge_files_are_capped_by_the_file_size_limit(sandbox):
    result = run(sandbox, "open('/work/big', 'wb').write(b'x' * (32 * 2**20))")
    assert result.status is SandboxStatus.ERROR and "File too large" in result.stderr


@pytest.mark.parametrize("ending", ["exit", "timeout"])
def test_no_setsid_grandchild_outlives_the_call(sandbox, ending):
    """The program needs ~0.5 s to start its grandchild and see it (measured under load 7), so it gets 5 s to
    exit; the one that must time out sleeps (not spins: the sandbox's 2 s CPU limit would end it first) past a
    3 s deadline, which still leaves its print a wide margin."""
    token = f"asyncrl-orphan-{uuid.uuid4().hex}"
    program = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen(['setsid', sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])\n"
        "time.sleep(0.3)\n"
        "alive = [p for p in os.listdir('/proc') if p.isdigit() and "
        f"b'{token}' in open(f'/proc/{{p}}/cmdline', 'rb').read()]\n"
        "print('grandchild alive', len(alive) == 1, flush=True)\n"
        + ("time.sleep(60)\n" if ending == "timeout" else "")
    )
    result = run(sandbox, program, timeout_s=5.0 if ending == "exit" else 3.0)
    assert result.status is (SandboxStatus.OK if ending == "exit" else SandboxStatus.TIMEOUT), result.stderr
    assert result.stdout == "grandchild alive True\n"
    deadline = time.monotonic() + 10.0
    while host_processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes_with(token) == []


def test_concurrent_calls_share_the_slots(sandbox):
    async def many():
        return await asyncio.gather(*(sandbox.run("import os\nprint(os.getuid())") for _ in range(6)))

    results = asyncio.run(many())
    assert all(r.ok for r in results)
    uids = {int(r.stdout) for r in results}
    assert uids <= set(
        range(sandbox.config.uid_base, sandbox.config.uid_base + sandbox.config.max_concurrency)
    )


def test_a_missing_binary_is_a_clear_error_at_construction():
    with pytest.raises(SandboxUnavailable, match="not an executable"):
        Sandbox(SandboxConfig(bwrap_path="/nonexistent/bwrap"))


def test_a_non_working_binary_is_a_clear_error_at_construction(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable, match="No permissions to create new namespace"):
        Sandbox(SandboxConfig(bwrap_path=str(fake)))


def test_input_file_names_cannot_escape_the_input_dir(sandbox):
    with pytest.raises(ValueError, match="plain names"):
        run(sandbox, "pass", files={"../escape.py": "x"})


def test_the_host_environment_is_not_passed_in(sandbox, monkeypatch):
    monkeypatch.setenv("ASYNCRL_SECRET_TOKEN", "s3cret")
    result = run(sandbox, "import os\nprint(sorted(os.environ))")
    assert "ASYNCRL_SECRET_TOKEN" not in result.stdout and os.environ["ASYNCRL_SECRET_TOKEN"] == "s3cret"


def test_a_cancelled_call_leaves_nothing_running(sandbox):
    token = f"asyncrl-cancelled-{uuid.uuid4().hex}"
    program = f"import sys\nsys.argv.append('{token}')\nwhile True:\n    pass\n"

    async def cancel_midway() -> None:
        call = asyncio.ensure_future(sandbox.run(program, args=[token]))
        deadline = time.monotonic() + 10.0  # the program's start takes what the box's load makes it take
        while not host_processes_with(token) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert host_processes_with(token), "the program should be running before the cancel"
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # Checked while the loop still runs: closing a loop kills its subprocesses anyway.
        deadline = time.monotonic() + 10.0
        while host_processes_with(token) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert host_processes_with(token) == []

    asyncio.run(cancel_midway())


def test_the_user_namespace_mode_used_by_non_root_hosts_runs_and_blocks(monkeypatch):
    """Hosts that are not root get bwrap's user-namespace mode; force it here (as root it works the same)."""
    import asyncrl.sandbox.bwrap as bwrap

    monkeypatch.setattr(bwrap.os, "geteuid", lambda: 1000)
    sandbox = Sandbox(SandboxConfig(timeout_s=5.0))
    program = (
        "import os, socket\nprint(os.getuid())\n"
        "try:\n    open('/usr/evil', 'w')\nexcept OSError:\n    print('write blocked')\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\nexcept OSError:\n    print('net blocked')\n"
    )
    result = sandbox.run_sync(program)
    assert result.ok, result.stderr
    assert result.stdout.split("\n")[:3] == [str(sandbox.config.uid_base), "write blocked", "net blocked"]


def test_per_call_limits_replace_the_instance_limits_for_that_call_only(sandbox):
    program = "data = bytearray(300 * 2**20)\nprint(len(data) // 2**20)"
    generous = SandboxConfig(memory_mb=1024, timeout_s=5.0)
    assert sandbox.run_sync(program).status is SandboxStatus.ERROR  # the fixture allows 256 MiB
    result = sandbox.run_sync(program, limits=generous)
    assert result.ok and result.stdout == "300\n"
    tight = SandboxConfig(output_bytes=10, uid_base=1)  # the uid base stays the instance's
    flood = sandbox.run_sync("import os\nprint('x' * 100)\nprint(os.getuid())", limits=tight)
    assert flood.status is SandboxStatus.OUTPUT_LIMIT and len(flood.stdout) == 10
