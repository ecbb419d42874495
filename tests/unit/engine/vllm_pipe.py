"""The real vLLM client and the real ``worker_main.Worker`` joined by a pipe, vLLM itself faked: what the vLLM
backend's unit tests share (the worker's command loop runs on a thread of its own, as it runs beside vLLM in
the worker process)."""

from __future__ import annotations

import argparse
import asyncio
import threading
from multiprocessing import Pipe
from typing import Any

from asyncrl.engine.vllm import worker_main
from asyncrl.engine.vllm.client import VLLMEngineClient


class FakeProcess:
    """The worker process as the client watches it: alive."""

    pid = 0

    def poll(self) -> None:
        return None


class PipedWorker:
    """A client and a worker serving ``engine`` (a fake of vLLM's ``AsyncLLM``), joined by a pipe; ``shapes``:
    the served model's, as the client checks an update against them. ``close`` shuts the worker down."""

    def __init__(self, engine: Any, shapes: dict[str, tuple[int, ...]] | None = None) -> None:
        ours, theirs = Pipe()
        self.worker = worker_main.Worker(theirs, argparse.Namespace())
        self.engine = self.worker.engine = engine
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_until_complete, args=(self.worker.command_loop(),)
        )
        self.thread.start()
        self.client = VLLMEngineClient(FakeProcess(), ours, shapes or {})

    def close(self) -> None:
        self.client._send({"op": "shutdown"})
        self.thread.join(10)
        self.loop.close()
