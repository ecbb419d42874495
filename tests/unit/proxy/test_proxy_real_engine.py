"""LLMProxy over two real ``AsyncEngine``s serving a tiny random Qwen2: the seam fits the engine.

Checks the two things the fakes cannot: the real engine keeps requests across an in-flight update (per-token
versions switch mid-generation), and an abort the proxy did not ask for is continued from its prefix to the
same output an uninterrupted run gives.
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


from asyncrl.config.engine import EngineConfig  # noqa: E402
from asyncrl.config.proxy import ProxyConfig  # noqa: E402
from asyncrl.engine import make_engine  # noqa: E402
from asyncrl.engine.async_engine import AsyncEngine  # noqa: E402
from asyncrl.proxy import LLMProxy  # noqa: E402
from asyncrl.testing.models import tiny_qwen2  # noqa: E402
from asyncrl.testing.pause_at import PauseAt  # noqa: E402
from asyncrl.types import Request, SamplingParams  # noqa: E402


@pytest.fixture
def engines() -> list[AsyncEngine]:
    built = [
        make_engine(tiny_qwen2(0), None, EngineConfig(max_running_requests=4, max_kv_tokens=512))
        for _ in "ab"
    ]
    yield built
    for engine in built:
        engine.shutdown()


def request(request_id: str, *, max_new_tokens: int = 100, temperature: float = 1.0) -> Request:
    sampling = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True, temperature=temperature, seed=7)
    return Request(request_id=request_id, prompt_token_ids=[5, 6, 7], sampling=sampling)


def test_in_flight_update_switches_versions_mid_generation(engines: list[AsyncEngine]):
    async def main() -> None:
        proxy = LLMProxy(engines, ProxyConfig(update_policy="in_flight"))
        # one request per engine (the proxy counts a routed call before it awaits), each engine paused with its
        # request in flight, so the update lands mid-generation however late this thread runs
        holds = [PauseAt(engines, f"r{i}", 8) for i in range(2)]
        tasks = [asyncio.create_task(proxy.generate(request(f"r{i}"))) for i in range(2)]
        assert {id(engine) for engine in await asyncio.gather(*(h.reached() for h in holds))} == {
            id(engine) for engine in engines
        }
        await proxy.suspend()
        await proxy.model_update(tiny_qwen2(1).state_dict(), 1)
        await proxy.resume()
        for generation in await asyncio.gather(*tasks):
            assert len(generation.token_ids) == 100
            assert generation.versions == sorted(generation.versions)
            assert generation.versions[0] == 0 and generation.versions[-1] == 1
        assert proxy.versions() == [1, 1]

    asyncio.run(main())


def test_unasked_abort_is_continued_to_the_uninterrupted_output(engines: list[AsyncEngine]):
    async def main() -> None:
        proxy = LLMProxy(engines, ProxyConfig(update_policy="in_flight"))
        reference = await proxy.generate(request("r", max_new_tokens=40, temperature=0.0))
        hold = PauseAt(engines, "r", 5)  # in flight when the abort lands, however late this thread runs
        task = asyncio.create_task(proxy.generate(request("r", max_new_tokens=40, temperature=0.0)))
        paused = await hold.reached()
        partials = [await engine.abort("r") for engine in engines]  # the engine drops it (e.g. a migration)
        await paused.resume()
        generation = await task
        assert sum(p is not None for p in partials) == 1
        assert generation.token_ids == reference.token_ids
        assert torch.allclose(torch.tensor(generation.logprobs), torch.tensor(reference.logprobs), atol=1e-4)
        assert proxy.stats()["num_continuations"] == 1

    asyncio.run(main())


def test_an_observed_call_hears_one_growing_output_across_an_unasked_abort(engines: list[AsyncEngine]):
    """What a streaming endpoint relies on: every report extends the previous one and starts the final
    Generation, also when the proxy continues the request on another engine after an abort it did not ask for."""

    async def main() -> None:
        proxy = LLMProxy(engines, ProxyConfig(update_policy="in_flight"))
        heard: list[list[int]] = []
        hold = PauseAt(engines, "r", 5)  # in flight when the abort lands, however late this thread runs
        task = asyncio.create_task(
            proxy.generate(request("r", max_new_tokens=40, temperature=0.0), heard.append)
        )
        paused = await hold.reached()
        for engine in engines:
            await engine.abort("r")
        await paused.resume()
        generation = await task
        assert proxy.stats()["num_continuations"] == 1
        assert len(heard) > 1 and all(len(b) > len(a) for a, b in zip(heard, heard[1:], strict=False))
        assert all(generation.token_ids[: len(report)] == report for report in heard)

    asyncio.run(main())
