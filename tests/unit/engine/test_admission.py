"""The one admission policy: exact decisions, and the real scheduler and the simulated engine agreeing on a trace."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.config.sim import SimEngineConfig
from asyncrl.engine.admission import AdmissionPolicy
from asyncrl.engine.scheduler import Scheduler
from asyncrl.engine.sequence import Sequence
from asyncrl.sim.clock import run_shuffled
from asyncrl.sim.engine import SimEngine
from asyncrl.types import FinishReason, Request, SamplingParams

POLICY = AdmissionPolicy(
    max_running_requests=3, max_kv_tokens=100, max_prefill_tokens_per_step=8, max_model_len=40
)

TRACE = [
    ("a", 10, 50),
    ("b", 5, 100),
    ("c", 2, 10),
    ("d", 30, 60),
    ("e", 1, 20),
    ("f", 8, 20),
    ("g", 25, 30),
    ("h", 20, 100),
]
"""(request id, prompt tokens, max_new_tokens): the length cap binds a, b, d, g and h; slots bind first, then
the KV budget holds h back with a slot free. Every output is >= 10 tokens, so nothing ends on its own while
the simulated rounds (about one step each) run."""


def request(rid: str, num_prompt: int, max_new_tokens: int) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=[1] * num_prompt,
        sampling=SamplingParams(max_new_tokens=max_new_tokens),
    )


def test_reservation_is_capped_by_max_model_len():
    assert POLICY.reservation(10, 50) == 40
    assert POLICY.reservation(2, 10) == 12
    assert AdmissionPolicy(max_running_requests=1, max_kv_tokens=10).reservation(10, 50) == 60


def test_fifo_admission_stops_at_the_first_request_that_does_not_fit():
    assert POLICY.num_admitted([40, 40, 12, 6], num_running=0, kv_reserved=0) == 3  # slots
    assert (
        POLICY.num_admitted([40, 40, 30, 6], num_running=0, kv_reserved=0) == 2
    )  # KV, and 6 is not let past
    assert POLICY.num_admitted([6], num_running=3, kv_reserved=0) == 0


def test_prefill_chunks_share_the_step_budget_in_order():
    assert POLICY.prefill_chunks([5, 5, 5]) == [5, 3, 0]
    assert AdmissionPolicy(max_running_requests=1, max_kv_tokens=1).prefill_chunks([5, 500]) == [5, 500]


def test_a_request_that_can_never_fit_is_an_error_naming_it():
    with pytest.raises(
        ValueError, match="request big: needs 101 KV tokens, more than engine.max_kv_tokens=100"
    ):
        AdmissionPolicy(max_running_requests=1, max_kv_tokens=100).check_fits("big", 101)


def real_rounds() -> list[list[str]]:
    """Running request ids after each admission; between rounds the oldest running request is aborted."""
    scheduler = Scheduler(
        max_running_requests=POLICY.max_running_requests,
        max_kv_tokens=POLICY.max_kv_tokens,
        max_prefill_tokens_per_step=POLICY.max_prefill_tokens_per_step,
        max_model_len=POLICY.max_model_len,
    )
    for rid, num_prompt, max_new in TRACE:
        scheduler.add(Sequence.from_request(request(rid, num_prompt, max_new), engine_seed=0))
    rounds = []
    while scheduler.has_work:
        scheduler.schedule()
        rounds.append([seq.request_id for seq in scheduler.running])
        scheduler.finish(scheduler.running[0], FinishReason.ABORT)
    return rounds


def sim_rounds() -> list[list[str]]:
    """The same trace and abort pattern on the simulator's engine, on the virtual clock."""
    config = SimEngineConfig(
        max_running_requests=POLICY.max_running_requests,
        max_kv_tokens=POLICY.max_kv_tokens,
        max_model_len=POLICY.max_model_len,
        decode_step_s=1.0,
    )

    async def scenario() -> list[list[str]]:
        engine = SimEngine(config, lambda rid: 10**6)
        calls = [asyncio.ensure_future(engine.generate(request(*row))) for row in TRACE]
        rounds = []
        for _ in TRACE:  # each round aborts one request
            await asyncio.sleep(0.5)  # mid-step: the admissions of the last boundary are in place
            running = [seq.request.request_id for seq in engine.running]
            rounds.append(running)
            await engine.abort(running[0])
        await asyncio.gather(*calls)
        return rounds

    return run_shuffled(scenario, seed=None, virtual_time=True)


def test_real_scheduler_and_simulated_engine_admit_the_same_requests():
    real = real_rounds()
    assert real == [
        ["a", "b", "c"],
        ["b", "c", "d"],
        ["c", "d", "e"],
        ["d", "e", "f"],
        ["e", "f", "g"],
        ["f", "g"],  # h (40 KV tokens) waits with a slot free: 28 + 40 + 40 > 100
        ["g", "h"],
        ["h"],
    ]
    assert sim_rounds() == real
