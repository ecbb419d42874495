"""vLLM's engine core dies with the worker that started it when that worker is killed outright, as Ray kills it.

When an engine actor is killed, Ray 2.60 SIGKILLs the actor's child processes too: the vLLM worker goes before its
parent watch can end its session, and a process the worker forked lived on (observed here 4 times in 4, with
the real ``die_with_parent``). vLLM forks its engine core by default on CUDA (``VLLM_WORKER_MULTIPROC_METHOD``,
default fork), and a forked engine core never runs this file's ``__mp_main__`` guard that asks Linux to kill it
with its parent: it would hold its GPU memory for good and the replacement could not start. A stand-in ``vllm``
whose engine build starts its "engine core" as vLLM does (``multiprocessing``, the start method from that
variable, fork by default) and never finishes; the worker is SIGKILLed; the engine core must be gone within a
deadline. No vLLM and no GPU here: the worker is the real ``worker_main.py`` started by the real client.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import pytest

from asyncrl.config.engine import VLLMConfig
from asyncrl.engine.vllm.client import VLLMEngineClient, VLLMWorkerError
from tests.unit.engine.test_vllm_startup_deadline import fake_vllm_python
from tests.unit.engine.test_vllm_worker_dies_with_parent import gone, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")

ENGINE_WITH_CORE = """
import multiprocessing, os, threading

def engine_core(path):
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getppid()} {os.getpid()}")
    os.rename(path + ".tmp", path)
    threading.Event().wait()

class AsyncLLM:
    @classmethod
    def from_engine_args(cls, args):
        method = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork")  # as vllm.envs reads it
        core = multiprocessing.get_context(method).Process(
            target=engine_core, args=(os.environ["ASYNCRL_TEST_WORKER_PIDS"],), daemon=False
        )
        core.start()
        threading.Event().wait()  # an engine build that never ends: the test kills the worker meanwhile
"""
"""vLLM's ``AsyncLLM`` whose build starts an engine core the way vLLM's ``get_mp_context`` does, which writes the
worker's pid and its own, then never returns."""


def test_an_engine_core_dies_when_its_worker_is_killed_outright(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)  # vLLM's default, as on a GPU node
    python = fake_vllm_python(tmp_path, ENGINE_WITH_CORE)
    pids_file = tmp_path / "pids"
    monkeypatch.setenv("ASYNCRL_TEST_WORKER_PIDS", str(pids_file))
    config = VLLMConfig(python=str(python), startup_timeout_s=120.0)

    def start() -> None:
        with contextlib.suppress(VLLMWorkerError):  # its worker is killed below, so the start fails
            VLLMEngineClient.start(tmp_path / "model", config, max_model_len=64)

    starter = threading.Thread(target=start)
    starter.start()
    pids: list[int] = []
    try:
        wait_until(lambda: pids_file.exists() or not starter.is_alive(), "the engine core starting")
        assert pids_file.exists(), "the worker never started its engine core"
        pids = [int(field) for field in pids_file.read_text().split()]
        worker, core = pids
        os.kill(
            worker, signal.SIGKILL
        )  # as Ray kills a killed actor's children: no time for the parent watch
        wait_until(lambda: gone(core), "the engine core exiting with its worker", deadline_s=30.0)
    finally:
        for pid in pids:  # a failed test leaves nothing behind
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        starter.join(timeout=60)
