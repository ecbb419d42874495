"""The asyncio wrapper: results, abort, pause/update/resume, failures reaching every caller, no hangs."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace

import pytest
from engine_testlib import engine, hf_greedy, request, tiny_qwen2
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.config.engine import EngineConfig
from asyncrl.engine import make_engine
from asyncrl.engine.async_engine import AsyncEngine, EngineStoppedError
from asyncrl.testing.pause_at import PauseAt
from asyncrl.types import FinishReason

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [15]]
TIMEOUT = 30


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


@pytest.fixture
def async_engine(qwen2):
    served = AsyncEngine(engine(qwen2, max_running_requests=2))
    yield served
    served.shutdown()


def test_concurrent_generates_match_hf_and_stats_add_up(async_engine, qwen2):
    async def main():
        reqs = [
            request(str(i), p, temperature=0, max_new_tokens=6, ignore_eos=True)
            for i, p in enumerate(PROMPTS)
        ]
        return await asyncio.gather(*(async_engine.generate(r) for r in reqs))

    outs = run(main())
    assert [o.token_ids for o in outs] == [hf_greedy(qwen2, p, 6) for p in PROMPTS]
    stats = async_engine.stats()
    assert (stats["running"], stats["waiting"], stats["num_generated_tokens"]) == (0, 0, 24)
    assert stats["tokens_per_s"] > 0 and 0 <= stats["idle_fraction"] <= 1


def test_idle_engine_sleeps(async_engine):
    """Idle seconds grow with the wall clock while there is nothing to do. Measured across the sleep, not since
    construction: the engine thread's start counts as busy, and on a loaded box it can take a share of 0.3 s."""
    deadline = time.monotonic() + TIMEOUT
    while async_engine.stats()["idle_seconds"] == 0:  # the thread has not reached its first wait yet
        assert time.monotonic() < deadline, "the engine thread never went idle"
        time.sleep(0.001)
    before = async_engine.stats()
    time.sleep(0.3)
    after = async_engine.stats()
    # both from the engine's own clock reads, so no descheduling between a stats() call and a clock read counts
    idle, wall = (after[key] - before[key] for key in ("idle_seconds", "uptime_s"))
    assert idle > 0.9 * wall


def test_abort_resolves_both_the_caller_and_the_generate_call(async_engine):
    async def main():
        # paused on the engine's thread: in flight when the abort lands, however late this thread runs
        hold = PauseAt([async_engine], "a", 3)
        task = asyncio.create_task(
            async_engine.generate(request("a", PROMPTS[0], max_new_tokens=100, ignore_eos=True))
        )
        await hold.reached()
        partial = await async_engine.abort("a")
        return partial, await task

    partial, from_generate = run(main())
    assert partial is from_generate
    assert partial.finish_reason is FinishReason.ABORT and len(partial.token_ids) >= 3


def test_pause_update_resume_tags_new_versions(async_engine):
    weights = {k: v.clone() for k, v in tiny_qwen2(seed=1).state_dict().items() if k != "lm_head.weight"}

    async def main():
        hold = PauseAt([async_engine], "a", 2)  # so the update lands before the request's last token
        task = asyncio.create_task(
            async_engine.generate(request("a", PROMPTS[0], max_new_tokens=30, ignore_eos=True))
        )
        await hold.reached()
        await async_engine.pause()
        before = async_engine.stats()["num_generated_tokens"]
        await asyncio.sleep(0.05)
        assert async_engine.stats()["num_generated_tokens"] == before
        with pytest.raises(ValueError, match="unknown tensor"):
            await async_engine.update_weights({"bogus": weights["model.norm.weight"]}, version=9)
        await async_engine.update_weights(weights, version=1)
        await async_engine.resume()
        return before, await task

    before, out = run(main())
    assert out.versions == [0] * before + [1] * (30 - before)


def test_bad_request_fails_only_its_caller(async_engine, qwen2):
    async def main():
        good = async_engine.generate(
            request("ok", PROMPTS[0], temperature=0, max_new_tokens=4, ignore_eos=True)
        )
        bad = async_engine.generate(request("bad", [], max_new_tokens=4))
        return await asyncio.gather(good, bad, return_exceptions=True)

    good, bad = run(main())
    assert good.token_ids == hf_greedy(qwen2, PROMPTS[0], 4)
    assert isinstance(bad, ValueError) and "request bad: empty prompt" in str(bad)


def test_cancelled_generate_aborts_its_request(async_engine):
    async def main():
        task = asyncio.create_task(
            async_engine.generate(request("c", PROMPTS[1], max_new_tokens=100, ignore_eos=True))
        )
        while async_engine.stats()["num_generated_tokens"] < 3:  # running, far from its 100 tokens
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await async_engine.pause()  # a round trip through the engine thread: the abort ran before it
        return async_engine.stats()

    stats = run(main())
    assert (stats["running"], stats["waiting"]) == (0, 0)


def test_step_failure_reaches_every_waiting_caller(qwen2):
    served = AsyncEngine(engine(qwen2, max_running_requests=1))
    calls = {"n": 0}
    run_model = served.core.runner.run

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device fell over")
        return run_model(*args)

    served.core.runner.run = flaky

    async def main():
        reqs = [request(str(i), p, max_new_tokens=50, ignore_eos=True) for i, p in enumerate(PROMPTS)]
        results = await asyncio.gather(*(served.generate(r) for r in reqs), return_exceptions=True)
        with pytest.raises(EngineStoppedError):
            await served.generate(request("late", [1], max_new_tokens=2))
        return results

    results = run(main())
    assert all(isinstance(r, EngineStoppedError) and "device fell over" in str(r) for r in results)
    served.shutdown()


def test_shutdown_fails_pending_callers(qwen2):
    served = make_engine(qwen2, None, EngineConfig(max_running_requests=2, max_kv_tokens=512))

    async def main():
        await served.pause()
        task = asyncio.create_task(served.generate(request("p", PROMPTS[0], max_new_tokens=5)))
        await asyncio.sleep(0.02)
        await asyncio.to_thread(served.shutdown)
        with pytest.raises(EngineStoppedError, match="shut down"):
            await task

    run(main())


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_random_async_interleavings_end_every_request_exactly_once(qwen2, seed):
    rng = random.Random(seed)
    served = AsyncEngine(
        engine(
            qwen2, max_running_requests=3, max_kv_tokens=60, kv_on_update=rng.choice(["keep", "recompute"])
        )
    )
    weights = {k: v.clone() for k, v in qwen2.state_dict().items() if k != "lm_head.weight"}
    ledger: dict[str, list] = {}

    async def client(rid: str) -> None:
        req = request(rid, [3] * rng.randint(1, 8), max_new_tokens=rng.randint(1, 10), ignore_eos=True)
        ledger.setdefault(rid, []).append(await served.generate(req))

    async def main():
        tasks, version = [], 0
        for i in range(rng.randint(3, 12)):
            action = rng.choice(["add", "add", "abort", "pause", "resume", "update", "sleep"])
            if action == "add":
                tasks.append(asyncio.create_task(client(f"r{i}")))
            elif action == "abort" and tasks:
                await served.abort(f"r{rng.randrange(i)}")
            elif action == "pause":
                await served.pause()
            elif action == "resume":
                await served.resume()
            elif action == "update":
                version += 1
                await served.update_weights(weights, version=version)
            else:
                await asyncio.sleep(rng.random() * 0.01)
        await served.resume()
        await asyncio.gather(*tasks)
        return len(tasks)

    try:
        num_tasks = run(main())
    finally:
        served.shutdown()
    assert len(ledger) == num_tasks and all(len(ends) == 1 for ends in ledger.values())


def test_an_observed_request_hears_each_token_then_gets_the_same_generation(async_engine):
    """Decode samples one token per step, so the observer hears outputs of length 1, 2, …, n - 1 (the n-th
    comes with the Generation), each the start of the final tokens; a continued request's start with its prefix."""
    heard: list[list[int]] = []

    async def main():
        plain = request("a", PROMPTS[0], temperature=0, max_new_tokens=6, ignore_eos=True)
        generation = await async_engine.generate_observed(plain, heard.append)
        continued = replace(
            request("b", PROMPTS[0], temperature=0, max_new_tokens=6, ignore_eos=True),
            prefix_token_ids=generation.token_ids[:2],
            prefix_logprobs=generation.logprobs[:2],
            prefix_versions=generation.versions[:2],
        )
        continued_heard: list[list[int]] = []
        rest = await async_engine.generate_observed(continued, continued_heard.append)
        return generation, continued_heard, rest

    generation, continued_heard, rest = run(main())
    assert heard == [generation.token_ids[:n] for n in range(1, 6)]
    assert rest.token_ids == generation.token_ids
    assert continued_heard == [generation.token_ids[:n] for n in range(3, 6)]


def test_requests_finishing_in_one_step_are_delivered_with_one_wake_up(qwen2, monkeypatch):
    """Each wake-up of the caller's loop costs the engine thread a self-pipe write and a GIL hand-off, so a
    step's finished requests travel together."""
    from asyncrl.engine import async_engine as module

    wake_ups: list[int] = []
    settle = module.settle_threadsafe
    monkeypatch.setattr(
        module,
        "settle_threadsafe",
        lambda loop, outcomes: (wake_ups.append(len(outcomes)), settle(loop, outcomes)),
    )
    served = AsyncEngine(engine(qwen2, max_running_requests=4))
    try:

        async def main():
            reqs = [request(str(i), p, max_new_tokens=5, ignore_eos=True) for i, p in enumerate(PROMPTS)]
            return await asyncio.gather(*(served.generate(r) for r in reqs))

        outs = run(main())
    finally:
        served.shutdown()
    assert all(o.num_tokens == 5 for o in outs)
    assert len(PROMPTS) in wake_ups, f"the four same-length requests were delivered in {wake_ups}"


def test_a_finished_command_holds_nothing_once_its_caller_hears(async_engine):
    """A command's closure (a streamed weight bucket) is freed before its caller resumes, not when the engine
    thread's next command overwrites it: the engine, paused and idle, runs nothing after it."""
    import weakref

    class Payload:
        pass

    async def main():
        await async_engine.pause()
        for _ in range(20):
            payload = Payload()
            alive = weakref.ref(payload)
            await async_engine._call(lambda held=payload: None)  # held by the closure only
            del payload
            assert alive() is None

    run(main())
