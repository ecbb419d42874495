"""The engine's own CUDA stream on a real device (skipped without CUDA; the GPU kit's unit section runs it): while
a trainer-like thread keeps the default stream busy with large matmuls, weight updates published in process
(clones queued behind those matmuls) reach an engine decoding on its own stream bit-equal, and its greedy
tokens equal a single-stream engine's. Without the hand-off's ``wait_stream`` the engine's copy could read a
clone before the default stream wrote it; without its final drain the trainer could overwrite or free it
under the copy."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import threading

import pytest
import torch
from engine_testlib import request, tiny_qwen2

from asyncrl.config.engine import EngineConfig
from asyncrl.engine.async_engine import AsyncEngine
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.weight_sync import InProcessSync

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

NUM_UPDATES = 4
MATMUL = 4096
"""Side of the busy thread's matrices: one fp32 product is ~0.1 TFLOP, milliseconds on any lent GPU."""
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [15]]
TIMEOUT = 120


def served(model: torch.nn.Module, mode: str) -> AsyncEngine:
    config = EngineConfig(
        max_running_requests=4,
        max_kv_tokens=1024,
        max_prefill_tokens_per_step=16,
        dtype="float32",
        cuda_stream=mode,
    )
    return AsyncEngine(LLMEngine(copy.deepcopy(model), None, config))


class BusyDefaultStream:
    """A thread queueing large matmuls on the default stream until stopped (bounded: it waits for its own
    work every few products, so the queue never grows without end)."""

    def __init__(self, device: torch.device) -> None:
        self._stop = threading.Event()
        self.products = 0
        self._a = torch.randn(MATMUL, MATMUL, device=device)
        self._thread = threading.Thread(target=self._run, name="busy-default-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        out = torch.empty_like(self._a)
        while not self._stop.is_set():
            for _ in range(8):
                torch.matmul(self._a, self._a, out=out)
                self.products += 1
            torch.cuda.current_stream().synchronize()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)


def test_updates_into_an_engine_on_its_own_stream_are_exact_beside_a_busy_default_stream() -> None:
    device = torch.device("cuda")
    trainer_model = tiny_qwen2().to(device)
    own, single = served(trainer_model, "own"), served(trainer_model, "default")
    trainer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainer")
    sync = InProcessSync()

    def train_and_publish(version: int):
        """On the trainer thread (default stream): a burst of products, an in-place step that depends on them,
        and the clones of the new weights, all queued behind the burst when ``publish`` returns."""
        a = torch.randn(MATMUL, MATMUL, device=device)
        for _ in range(16):
            a = torch.tanh(a @ a / MATMUL)
        with torch.no_grad():
            for param in trainer_model.parameters():
                param.add_(a.mean() * 1e-2 + 1e-3 * version)
        return sync.publish(version, trainer_model.state_dict())

    async def greedy(engine: AsyncEngine) -> list[list[int]]:
        requests = [
            request(f"p{i}", p, temperature=0, max_new_tokens=8, ignore_eos=True)
            for i, p in enumerate(PROMPTS)
        ]
        return [list(g.token_ids) for g in await asyncio.gather(*(engine.generate(r) for r in requests))]

    async def scenario(busy: BusyDefaultStream) -> None:
        loop = asyncio.get_running_loop()
        assert await own._call(torch.cuda.current_stream) == own.stream.stream  # the engine thread's stream
        assert await single._call(torch.cuda.current_stream) == torch.cuda.default_stream(device)
        for version in range(1, NUM_UPDATES + 1):
            update = await loop.run_in_executor(trainer, train_and_publish, version)
            decoding = asyncio.ensure_future(greedy(own))  # the engine decodes while the update lands
            await own.update_weights(update, version)
            await decoding
            published = dict(update.handle)
            served_weights = own.core.model.state_dict()
            assert all(torch.equal(served_weights[n], t) for n, t in published.items()), f"v{version}"
            await single.update_weights(update, version)
            assert await greedy(own) == await greedy(single), f"v{version}"
        assert busy.products > 0

    busy = BusyDefaultStream(device)
    try:
        assert own.stream.mode == "own" and single.stream.mode == "default"
        asyncio.run(asyncio.wait_for(scenario(busy), TIMEOUT))
    finally:
        busy.stop()
        trainer.shutdown()
        own.shutdown()
        single.shutdown()
