"""Benchmark: what one engine request costs in Ray's own machinery, and what batching requests per call saves.

Why it exists: on the generation-bound workload the async arms on Ray actors reach a smaller share of their
resource ceiling than the same async in one process (docs/benchmarks.md, "Async vs sync"), and every request
there is one actor call through the driver. Batching several requests into one call was the fix proposed for
it; this measures whether it could be, before anyone rewrites the fault handling of every engine call.

An echo actor stands in for the engine actor: each request waits a fixed 2 ms (generation) and returns a
``Generation`` of ``RESPONSE_TOKENS`` tokens for a real ``Request``, so serialization has the real shapes. The
driver keeps ``IN_FLIGHT`` requests outstanding, as the proxy does. Arms:

- ``per_call``: one actor call per request, awaited like ``runtime.actor_calls.await_actor`` does;
- ``streamed_bN``: one streaming-generator call per N requests, each result yielded as it finishes.

Metrics per request: CPU milliseconds of the driver process and of the actor process, and wall time. The CPU
of Ray's own daemons (raylet, GCS) is not counted.

    python bench/ray_calls.py [--quick] [--repeats 3] [--out bench/results/ray_calls.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/ray_calls.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import time
from collections.abc import Callable

import ray

from asyncrl.types import FinishReason, Generation, Request, SamplingParams
from bench import harness

PROMPT_TOKENS, RESPONSE_TOKENS, IN_FLIGHT, GENERATE_S = 32, 160, 64, 0.002
BATCHES = (8, 32)


def make_request(index: int) -> Request:
    return Request(
        request_id=f"r{index}",
        prompt_token_ids=list(range(PROMPT_TOKENS)),
        sampling=SamplingParams(max_new_tokens=RESPONSE_TOKENS, seed=index),
    )


@ray.remote(num_cpus=1)
class EchoEngine:
    """Answers a request after ``GENERATE_S`` with a full-length ``Generation``."""

    async def generate(self, request: Request) -> Generation:
        await asyncio.sleep(GENERATE_S)
        return self._answer(request)

    async def generate_many(self, requests: list[Request]):
        async def one(request: Request) -> Generation:
            await asyncio.sleep(GENERATE_S)
            return self._answer(request)

        for finished in asyncio.as_completed([one(r) for r in requests]):
            yield await finished

    def cpu_seconds(self) -> float:
        return time.process_time()

    @staticmethod
    def _answer(request: Request) -> Generation:
        return Generation(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=list(range(RESPONSE_TOKENS)),
            logprobs=[-1.0] * RESPONSE_TOKENS,
            versions=[0] * RESPONSE_TOKENS,
            finish_reason=FinishReason.LENGTH,
        )


async def per_call(actor, requests: list[Request]) -> None:
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def call(request: Request) -> Generation:
        async with slots:
            return await asyncio.wrap_future(actor.generate.remote(request).future())

    await asyncio.gather(*(call(r) for r in requests))


async def streamed(actor, requests: list[Request], batch: int) -> None:
    slots = asyncio.Semaphore(max(1, IN_FLIGHT // batch))

    async def call(chunk: list[Request]) -> list[Generation]:
        async with slots:
            stream = actor.generate_many.options(num_returns="streaming").remote(chunk)
            return [await ref async for ref in stream]

    await asyncio.gather(*(call(requests[i : i + batch]) for i in range(0, len(requests), batch)))


def arm(actor, num_requests: int, send: Callable) -> Callable[[], dict[str, float]]:
    """One timed pass of ``num_requests`` requests through ``send``, CPU per request on both sides."""

    def run() -> dict[str, float]:
        requests = [make_request(i) for i in range(num_requests)]
        driver_0, actor_0 = time.process_time(), ray.get(actor.cpu_seconds.remote())
        start = time.perf_counter()
        asyncio.run(send(actor, requests))
        wall = time.perf_counter() - start
        driver_1, actor_1 = time.process_time(), ray.get(actor.cpu_seconds.remote())
        return {
            "driver_cpu_ms_per_request": 1e3 * (driver_1 - driver_0) / num_requests,
            "actor_cpu_ms_per_request": 1e3 * (actor_1 - actor_0) / num_requests,
            "wall_ms_per_request": 1e3 * wall / num_requests,
        }

    return run


def main() -> None:
    args = harness.parser(__doc__.splitlines()[0], "ray_calls").parse_args()
    num_requests = 256 if args.quick else 3000
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = EchoEngine.remote()
        ray.get(actor.cpu_seconds.remote())
        arms = {"per_call": arm(actor, num_requests, per_call)}
        for batch in BATCHES:
            arms[f"streamed_b{batch}"] = arm(actor, num_requests, lambda a, r, b=batch: streamed(a, r, b))
        raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run, warmup=True)
    finally:
        ray.shutdown()
    ratios = {
        f"streamed_b{batch}_over_per_call_{side}": harness.paired_ratio(
            raw, f"streamed_b{batch}", "per_call", f"{side}_cpu_ms_per_request"
        )
        for batch in BATCHES
        for side in ("driver", "actor")
    }
    setup = {
        "num_requests": num_requests,
        "prompt_tokens": PROMPT_TOKENS,
        "response_tokens": RESPONSE_TOKENS,
        "in_flight": IN_FLIGHT,
        "generate_s": GENERATE_S,
    }
    resources = {"all_arms": "a local Ray with 2 CPUs: the driver and one echo actor (num_cpus=1)"}
    harness.write_result(args, "ray_calls", raw, ratios=ratios, resources=resources, setup=setup)


if __name__ == "__main__":
    main()
