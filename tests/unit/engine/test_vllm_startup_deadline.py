"""``engine.vllm.startup_timeout_s`` bounds the whole start of a vLLM worker, vLLM's engine build included: the
worker opens its socket before it builds its engine, so a client that stopped waiting at the socket would wait on
a slow model load for ever. A stand-in ``vllm`` package whose engine build never ends (after it started an
"engine core" child in the worker's session, as vLLM does) makes the real ``VLLMEngineClient.start`` fail by
name at its deadline, and the worker and that child are gone afterwards; one whose build raises fails with the
worker's own reason. No vLLM is needed: only ``vllm`` is the stand-in, the worker is the real ``worker_main.py``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from asyncrl.config.engine import VLLMConfig
from asyncrl.engine.vllm.client import VLLMEngineClient, VLLMWorkerError
from tests.unit.engine.test_vllm_worker_dies_with_parent import gone, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the worker's session kill is POSIX's")

STARTUP_TIMEOUT_S = 5.0
"""Long enough for the worker (stdlib and the stand-in only, no torch) to reach its engine build."""

FAKE_VLLM = """
import dataclasses

@dataclasses.dataclass
class AsyncEngineArgs:
    model: str = ""
    dtype: str = ""
    max_model_len: int = 0
    seed: int = 0
    skip_tokenizer_init: bool = False
    enforce_eager: bool = False
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = True
    max_num_seqs: int = 0
    gpu_memory_utilization: float = 0.0
    logprobs_mode: str = ""
    disable_log_stats: bool = False
    tensor_parallel_size: int = 1
"""
"""``vllm`` as the worker reads it before its engine build: the engine-argument fields it checks and fills."""

FAKE_PLATFORMS = """
class _Platform:
    def is_cpu(self):
        return True

current_platform = _Platform()
"""

SLOW_ENGINE = """
import os, subprocess, sys, threading

class AsyncLLM:
    @classmethod
    def from_engine_args(cls, args):
        core = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
        path = os.environ["ASYNCRL_TEST_WORKER_PIDS"]
        with open(path + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {core.pid}")
        os.rename(path + ".tmp", path)
        threading.Event().wait()  # a model load that never ends
"""
"""vLLM's ``AsyncLLM`` whose build starts an engine-core stand-in, writes both pids, then never returns."""

FAILING_ENGINE = """
class AsyncLLM:
    @classmethod
    def from_engine_args(cls, args):
        raise RuntimeError("stand-in: not enough device memory for the model")
"""


def fake_vllm_python(root: Path, engine: str, platforms: str = FAKE_PLATFORMS) -> Path:
    """An interpreter that sees the stand-in ``vllm`` (``engine``: its ``AsyncLLM`` module; ``platforms``: its
    ``vllm.platforms``), as the client runs the vLLM environment's (``PYTHONPATH`` cleared by the client, set
    here by the wrapper)."""
    package = root / "fake" / "vllm"
    (package / "platforms").mkdir(parents=True)
    (package / "v1" / "engine").mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_VLLM)
    (package / "platforms" / "__init__.py").write_text(platforms)
    (package / "v1" / "__init__.py").write_text("")
    (package / "v1" / "engine" / "__init__.py").write_text("")
    (package / "v1" / "engine" / "async_llm.py").write_text(engine)
    python = root / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={root / "fake"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_worker_whose_engine_build_outlives_the_deadline_is_killed_and_named(tmp_path, monkeypatch):
    python = fake_vllm_python(tmp_path, SLOW_ENGINE)
    pids_file = tmp_path / "pids"
    monkeypatch.setenv("ASYNCRL_TEST_WORKER_PIDS", str(pids_file))
    config = VLLMConfig(python=str(python), startup_timeout_s=STARTUP_TIMEOUT_S)
    failure: list[BaseException] = []

    def start() -> None:
        try:
            VLLMEngineClient.start(tmp_path / "model", config, max_model_len=64)
        except BaseException as error:  # noqa: BLE001 (the test reads it below)
            failure.append(error)

    starter = threading.Thread(target=start)
    starter.start()
    pids: list[int] = []
    try:
        wait_until(lambda: pids_file.exists() or not starter.is_alive(), "the worker building its engine")
        if pids_file.exists():
            pids = [int(field) for field in pids_file.read_text().split()]
        starter.join(timeout=STARTUP_TIMEOUT_S + 60)
        assert not starter.is_alive(), "start() did not return past engine.vllm.startup_timeout_s"
        assert len(failure) == 1 and isinstance(failure[0], VLLMWorkerError), failure
        assert "engine.vllm.startup_timeout_s" in str(failure[0])
        assert "did not load its model" in str(failure[0])
        assert len(pids) == 2, "the worker never reached its engine build: the deadline is not what failed"
        worker, core = pids
        wait_until(lambda: gone(worker) and gone(core), "the worker and its engine core exiting")
    finally:
        for pid in pids:  # a failed test leaves nothing behind
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        starter.join(timeout=60)


def test_a_worker_whose_engine_build_fails_says_why(tmp_path):
    python = fake_vllm_python(tmp_path, FAILING_ENGINE)
    config = VLLMConfig(python=str(python), startup_timeout_s=STARTUP_TIMEOUT_S + 60)
    with pytest.raises(VLLMWorkerError, match="while starting its engine") as error:
        VLLMEngineClient.start(tmp_path / "model", config, max_model_len=64)
    assert "not enough device memory for the model" in str(error.value)
