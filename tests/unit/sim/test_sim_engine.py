"""SimEngine on the virtual clock: exact finish times, admission, abort, in-flight updates; and the CLIs."""

from __future__ import annotations

import asyncio
import json

from asyncrl.cli.main import main
from asyncrl.config.sim import SimEngineConfig
from asyncrl.sim.clock import run_shuffled
from asyncrl.sim.engine import SimEngine
from asyncrl.types import FinishReason, Request, SamplingParams

CONFIG = SimEngineConfig(
    decode_step_s=1.0, knee_batch=4, max_running_requests=2, prefill_s_per_token=0.5, weight_update_s=3.0
)


def request(request_id: str, max_new_tokens: int = 100) -> Request:
    return Request(
        request_id=request_id, prompt_token_ids=[1, 1], sampling=SamplingParams(max_new_tokens=max_new_tokens)
    )


def lengths(table: dict[str, int]):
    return lambda request_id: table[request_id]


def test_finish_times_follow_prefill_steps_and_slots():
    async def scenario():
        loop = asyncio.get_running_loop()
        engine = SimEngine(CONFIG, lengths({"a": 3, "b": 5, "c": 1}))
        done = {}

        async def run(rid):
            generation = await engine.generate(request(rid))
            done[rid] = (loop.time(), generation.num_tokens, generation.finish_reason)

        await asyncio.gather(run("a"), run("b"), run("c"))
        return done

    done = run_shuffled(scenario, seed=None)
    # a and b join together: prefill 4 tokens = 2 s, then a ends after 3 steps (t=5); c waits for a's slot,
    # joins with its 1 s prefill: b's 4th step and c's only step end at t=7; b's 5th at t=8.
    assert done["a"] == (5.0, 3, FinishReason.STOP)
    assert done["c"] == (7.0, 1, FinishReason.STOP)
    assert done["b"] == (8.0, 5, FinishReason.STOP)


def test_length_limit_truncates_and_abort_returns_the_partial_output():
    async def scenario():
        engine = SimEngine(CONFIG, lengths({"long": 50, "cut": 50}))
        capped = asyncio.ensure_future(engine.generate(request("long", max_new_tokens=4)))
        cut = asyncio.ensure_future(engine.generate(request("cut")))
        await asyncio.sleep(3.5)  # prefill 2 s, one step done at t=3, the second in progress
        aborted = await engine.abort("cut")
        aborted_at = asyncio.get_running_loop().time()
        return await capped, aborted, await cut, aborted_at

    capped, aborted, cut, now = run_shuffled(scenario, seed=None)
    assert capped.finish_reason is FinishReason.LENGTH and capped.num_tokens == 4
    assert aborted.finish_reason is FinishReason.ABORT and aborted.num_tokens == 2 and now == 4.0
    assert cut.num_tokens == 2


def test_in_flight_update_changes_the_version_of_later_tokens():
    async def scenario():
        engine = SimEngine(CONFIG, lengths({"a": 4}))
        pending = asyncio.ensure_future(engine.generate(request("a")))
        await asyncio.sleep(3.5)
        await engine.pause()  # prefill 1 s, steps end at t=2, 3: pauses at the end of step 3 (t=4)
        await engine.update_weights({}, 1)  # 3 s
        await engine.resume()
        return await pending, asyncio.get_running_loop().time()

    generation, now = run_shuffled(scenario, seed=None)
    assert generation.versions == [0, 0, 0, 1]
    assert now == 4.0 + 3.0 + 1.0


def test_simulate_cli_writes_json_steps_and_timeline(tmp_path, capsys):
    args = [
        "simulate",
        "rollout.num_engines=2",
        "rollout.rollout_batch_size=2",
        "rollout.num_return_sequences=2",
        "controller.num_steps=2",
        "lengths.mean=20",
        "rollout.max_new_tokens=64",
        f"output_dir={tmp_path}",
    ]
    assert main(args) == 0
    assert "mean_step_s" in capsys.readouterr().out
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["totals"]["num_steps"] == 2 and len(result["steps"]) == 2
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "timeline.png").stat().st_size > 0
    assert (
        main([*args[:-1], f"output_dir={tmp_path / 'sw'}", "--sweep", "controller.mode=sync,one_step_off"])
        == 0
    )
    assert len(json.loads((tmp_path / "sw" / "sweep.json").read_text())["runs"]) == 2


def test_continued_request_starts_with_its_prefix_and_a_cancelled_caller_leaves_the_engine_running():
    async def scenario():
        loop = asyncio.get_running_loop()
        engine = SimEngine(CONFIG, lengths({"c": 5, "gone": 10}), version=2)
        continued = Request(
            request_id="c",
            prompt_token_ids=[1, 1],
            sampling=SamplingParams(max_new_tokens=100),
            prefix_token_ids=[7, 7],
            prefix_logprobs=[-0.5, -0.5],
            prefix_versions=[1, 1],
        )
        gone = asyncio.ensure_future(engine.generate(request("gone")))
        generation = await engine.generate(continued)
        finished_at = loop.time()
        gone.cancel()
        await asyncio.sleep(0)
        running_after_cancel = engine.stats()["running"]
        await asyncio.sleep(100)
        return generation, finished_at, running_after_cancel, engine.stats()

    generation, finished_at, running_after_cancel, stats = run_shuffled(scenario, seed=None)
    # one prefill of both prompts and c's prefix (6 tokens: 3 s), then c's 3 new tokens: t=6
    assert finished_at == 6.0
    assert generation.token_ids == [7, 7, 0, 0, 0]
    assert generation.logprobs == [-0.5, -0.5, -1.0, -1.0, -1.0]
    assert generation.versions == [1, 1, 2, 2, 2]
    assert generation.prompt_token_ids == [1, 1]
    # the cancelled caller's request runs to its end, unread (as a real engine's would until aborted)
    assert running_after_cancel == 1
    assert stats["running"] == 0 and stats["tokens"] == 3 + 10


def preemption_run(
    prefix_caching: bool, budget: int = 20, lengths_of: dict[str, int] | None = None, max_new_tokens: int = 18
):
    """Requests of 2 prompt tokens (10 output each unless ``lengths_of`` says) on a paged engine of
    ``budget`` KV tokens, 1 s a step and 0.5 s a prefilled token: when each finished, and the engine's counts."""
    paged = SimEngineConfig(
        decode_step_s=1.0,
        knee_batch=4,
        max_running_requests=4,
        prefill_s_per_token=0.5,
        kv_allocation="paged",
        max_kv_tokens=budget,
        prefix_caching=prefix_caching,
    )
    table = lengths_of or {"a": 10, "b": 10}

    async def scenario():
        loop = asyncio.get_running_loop()
        engine = SimEngine(paged, lengths(table))
        done = {}

        async def run(rid):
            generation = await engine.generate(request(rid, max_new_tokens=max_new_tokens))
            done[rid] = (loop.time(), generation.num_tokens, generation.finish_reason)

        await asyncio.gather(*(run(rid) for rid in table))
        return done, engine.counts

    return run_shuffled(scenario, seed=None)


def test_paged_kv_preempts_the_newest_request_and_recomputes_it():
    """Paged KV (vLLM) without a prefix cache: two requests of 2 + 10 tokens in a 20-token budget. Both join
    (prefill 4 tokens = 2 s); after 8 steps they hold 20 tokens and the next step would not fit, so b (the
    newer) is preempted with 8 tokens made; a finishes alone 2 steps later (t = 12); b is prefilled again
    (2 + 8 tokens = 5 s) and makes its last 2 tokens (t = 19), its output whole."""
    done, counts = preemption_run(prefix_caching=False)
    assert done == {"a": (12.0, 10, FinishReason.STOP), "b": (19.0, 10, FinishReason.STOP)}
    assert counts["preempted"] == 1
    assert counts["recomputed_tokens"] == counts["cached_tokens"] == 0


def test_prefix_cache_keeps_a_preempted_request_until_allocations_reuse_its_kv():
    """The same run with the prefix cache (vLLM's default): b's 10 freed tokens stay cached. No space was
    free ahead of them when b was preempted (20 of 20 held), so a's 2 further tokens reuse 2 of b's (its last
    ones); b is readmitted at t = 12 with 8 tokens read from the cache and 2 prefilled again (1 s), then makes
    its last 2 tokens: t = 15, not 19."""
    done, counts = preemption_run(prefix_caching=True)
    assert done == {"a": (12.0, 10, FinishReason.STOP), "b": (15.0, 10, FinishReason.STOP)}
    assert counts["preempted"] == 1
    assert (counts["recomputed_tokens"], counts["cached_tokens"]) == (2, 8)


def test_prefix_cache_is_spent_space_already_free_first_and_a_long_wait_loses_it_all():
    """Free space ahead of the preempted request's blocks is used before them; once allocations since its
    preemption pass its context, all of it is prefilled again, as without a cache.

    Budget 21: a and b (2 + 10 each) hold 20 after 8 steps, the next step needs 22, b is preempted with one
    token free ahead of its 10. a's 2 further tokens take that free one and 1 of b's: b keeps 9 (t = 12.5 + 2).
    With a = 30 and b = 20 tokens in 32: b is preempted after 14 steps (2 + 14 held each, none free), and a
    makes 16 more: all of b's 16 are reused, b recomputes its whole context as without a cache, and both runs
    end at the same time."""
    done, counts = preemption_run(prefix_caching=True, budget=21)
    assert done["b"] == (14.5, 10, FinishReason.STOP)
    assert (counts["recomputed_tokens"], counts["cached_tokens"]) == (1, 9)

    long_a = {"a": 30, "b": 20}
    cached, cached_counts = preemption_run(True, budget=32, lengths_of=long_a, max_new_tokens=30)
    uncached, _ = preemption_run(False, budget=32, lengths_of=long_a, max_new_tokens=30)
    assert cached == uncached
    assert cached_counts["preempted"] == 1
    assert (cached_counts["recomputed_tokens"], cached_counts["cached_tokens"]) == (16, 0)


def test_paged_kv_admits_by_context_so_far_not_by_the_longest_reservation():
    """A reservation of prompt + max_new_tokens (2 + 18) admits one request at a time in 30 tokens; paged KV
    admits both, since their contexts (2 each, growing to 12) fit together."""

    async def finish_time(kv_allocation):
        config = SimEngineConfig(
            decode_step_s=1.0,
            knee_batch=4,
            max_running_requests=4,
            kv_allocation=kv_allocation,
            max_kv_tokens=30,
        )
        engine = SimEngine(config, lengths({"a": 10, "b": 10}))
        await asyncio.gather(*(engine.generate(request(rid, max_new_tokens=18)) for rid in "ab"))
        return asyncio.get_running_loop().time(), engine.counts["preempted"]

    assert run_shuffled(lambda: finish_time("reserved"), seed=None) == (20.0, 0)
    assert run_shuffled(lambda: finish_time("paged"), seed=None) == (10.0, 0)
