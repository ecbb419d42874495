"""A vLLM worker dies with the client that started it from its first moment, not only once it is ready: the
client's process is killed while its worker is still starting (a stand-in ``vllm`` package whose import never
ends, after it started an "engine core" child in the worker's session), and the worker and that child are gone
within a deadline, both where the worker waits on its parent's pidfd and where the OS offers none (the polling
fallback, forced by taking ``os.pidfd_open`` away). No vLLM is needed: the worker is the real
``worker_main.py`` started by the real ``VLLMEngineClient.start``, only ``vllm`` is the stand-in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncrl.engine.vllm import worker_main

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the worker's parent watch is Linux's")

REPO = Path(__file__).resolve().parents[3]
DEADLINE_S = 60.0

FAKE_VLLM = """
import os, subprocess, sys, threading
core = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
path = os.environ["ASYNCRL_TEST_WORKER_PIDS"]
with open(path + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {core.pid} {int(hasattr(os, 'pidfd_open'))}")
os.rename(path + ".tmp", path)
threading.Event().wait()  # a start-up that never ends
"""
"""``vllm`` as the worker imports it first (``check_engine_args``): an engine-core stand-in in its session,
both pids (and whether the worker has ``os.pidfd_open``) written where the test reads them, then a start-up
that never ends."""

NO_PIDFD = """
import os
del os.pidfd_open
"""
"""``sitecustomize`` for the worker's interpreter where the test forces the parent watch's polling fallback: an
OS without pidfds (not Linux >= 5.3), as ``worker_main._watch_parent`` sees it."""

CLIENT = """
import sys
import threading
from asyncrl.config.engine import VLLMConfig
from asyncrl.engine.vllm.client import VLLMEngineClient
config = VLLMConfig(python=sys.argv[1], startup_timeout_s=3600)
VLLMEngineClient.start(sys.argv[2], config, max_model_len=64)
"""
"""The client's process: starts a worker and waits for it to answer (until the test kills it)."""


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped yet (its parent, the killed client, is gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_until(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {deadline_s:g} s")
        time.sleep(0.05)


@pytest.mark.parametrize("watch", ["pidfd", "poll"])
def test_a_worker_whose_client_dies_during_start_up_dies_with_its_session(tmp_path, watch):
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    if watch == "poll":
        (fake / "sitecustomize.py").write_text(NO_PIDFD)
    python = (
        tmp_path / "python"
    )  # the vLLM environment's interpreter, as the client runs it (PYTHONPATH cleared)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    pids_file = tmp_path / "pids"
    env = os.environ | {"PYTHONPATH": str(REPO), "ASYNCRL_TEST_WORKER_PIDS": str(pids_file)}
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(python), str(tmp_path / "model")], env=env, stderr=subprocess.PIPE
    )
    pids: list[int] = []
    try:
        wait_until(lambda: pids_file.exists() or client.poll() is not None, "the worker starting")
        assert client.poll() is None, client.stderr.read().decode()
        *pids, has_pidfd = [int(field) for field in pids_file.read_text().split()]
        worker, core = pids
        assert has_pidfd == (watch == "pidfd")  # the watch under test is the one the worker could use
        assert not gone(worker) and not gone(core)
        client.kill()
        client.wait()
        wait_until(lambda: gone(worker) and gone(core), "the orphaned worker and its engine core exiting")
    finally:
        for pid in pids:  # a failed test leaves nothing behind
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        if client.poll() is None:
            client.kill()
        client.wait()


def test_a_worker_started_by_hand_watches_no_parent():
    """Without ``--parent-pid`` (a worker run by hand) nothing is watched: no thread, nothing killed."""
    args = worker_main.parse_args(["--model", "m", "--port", "1", "--authkey-hex", "00"])
    assert args.parent_pid == 0
    worker_main.die_with_parent(args.parent_pid)
    assert all(thread.name != "asyncrl-parent" for thread in threading.enumerate())
