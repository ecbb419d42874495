"""Randomized interleavings of generate / abort / suspend / model_update / resume over fake engines.

Each seed builds a random workload (engines, lengths, arrivals, update cycles, caller aborts, faults) and runs it
on a loop whose ready callbacks are shuffled by that seed (asyncrl/sim/clock.py), on virtual time.
A ledger checks that every request ends exactly once and nothing hangs; the outputs check the version policy:
``drain`` → one version per generation and no update on an engine with a call in flight; ``in_flight`` → no
abort the caller did not ask for, tokens identical to an uninterrupted run, versions non-decreasing.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy import EngineFailure, LLMProxy, NoHealthyEngine, RequestTimeout
from asyncrl.sim.clock import run_seeds
from asyncrl.testing.fake_engine import FakeEngine, expected_tokens, make_request
from asyncrl.types import FinishReason, Generation

NUM_SEEDS = 500
NUM_FAULT_SEEDS = 200


@dataclass
class Ledger:
    """Exactly one terminal outcome per request id; abort() answers kept beside."""

    outcomes: dict[str, Any] = field(default_factory=dict)
    abort_answers: dict[str, Generation | None] = field(default_factory=dict)

    def end(self, request_id: str, outcome: Any) -> None:
        assert request_id not in self.outcomes, f"request {request_id} ended twice"
        self.outcomes[request_id] = outcome


@dataclass(frozen=True)
class Workload:
    policy: str
    faults: bool
    lengths: dict[str, int]
    max_new: dict[str, int]
    arrivals: dict[str, float]
    aborts: dict[str, float]
    update_times: list[float]
    engine_kwargs: list[dict[str, Any]]
    wait_applied: bool


def draw_workload(rng: random.Random, policy: str, faults: bool) -> Workload:
    ids = [f"r{i}" for i in range(rng.randint(3, 9))]
    engine_kwargs = [
        {"step_s": rng.choice([0.5, 1.0, 1.5]), "abort_on_pause": rng.random() < 0.5}
        for _ in range(rng.randint(1, 3))
    ]
    if faults:
        for kwargs in engine_kwargs:
            kwargs["fail_after"] = {rid: rng.randint(0, 3) for rid in ids if rng.random() < 0.2}
        engine_kwargs[rng.randrange(len(engine_kwargs))]["hang"] = rng.random() < 0.3
    return Workload(
        policy=policy,
        faults=faults,
        lengths={rid: rng.randint(1, 6) for rid in ids},
        max_new={rid: rng.randint(2, 8) for rid in ids},
        arrivals={rid: rng.uniform(0, 6) for rid in ids},
        aborts={rid: rng.uniform(0, 8) for rid in ids if rng.random() < 0.25},
        update_times=sorted(rng.uniform(0, 8) for _ in range(rng.randint(0, 3))),
        engine_kwargs=engine_kwargs,
        wait_applied=rng.random() < 0.5,
    )


async def submit(proxy: LLMProxy, work: Workload, ledger: Ledger, request_id: str) -> None:
    await asyncio.sleep(work.arrivals[request_id])
    request = make_request(request_id, max_new_tokens=work.max_new[request_id], affinity_key=request_id[-1:])
    try:
        ledger.end(request_id, await proxy.generate(request))
    except (EngineFailure, RequestTimeout, NoHealthyEngine) as error:
        assert work.faults, f"unexpected failure without faults: {error!r}"
        ledger.end(request_id, error)


async def abort_later(proxy: LLMProxy, ledger: Ledger, request_id: str, delay: float) -> None:
    await asyncio.sleep(delay)
    try:
        ledger.abort_answers[request_id] = await proxy.abort(request_id)
    except EngineFailure:
        ledger.abort_answers[request_id] = None


async def update_cycles(proxy: LLMProxy, work: Workload) -> None:
    elapsed = 0.0
    for version, when in enumerate(work.update_times, start=1):
        await asyncio.sleep(when - elapsed)
        elapsed = when
        try:
            await proxy.suspend()
            await proxy.model_update({"w": version}, version)
            if work.policy == "drain" and work.wait_applied:
                await proxy.update_applied(version)
        except NoHealthyEngine:
            assert work.faults, "engines became unhealthy without faults"
        finally:
            await proxy.resume()


async def scenario(seed: int, policy: str, faults: bool) -> None:
    rng = random.Random(seed)
    work = draw_workload(rng, policy, faults)
    engines = [FakeEngine(lengths=work.lengths, **kwargs) for kwargs in work.engine_kwargs]
    config = ProxyConfig(
        update_policy=policy,
        request_timeout_s=20.0 if faults else None,
        control_timeout_s=5.0,
        retry_on_engine_failure=faults and rng.random() < 0.5,
        max_consecutive_failures=2,
    )
    proxy = LLMProxy(engines, config, clock=asyncio.get_running_loop().time)
    ledger = Ledger()
    jobs = [submit(proxy, work, ledger, rid) for rid in work.lengths]
    jobs += [abort_later(proxy, ledger, rid, delay) for rid, delay in work.aborts.items()]
    await asyncio.wait_for(asyncio.gather(*jobs, update_cycles(proxy, work)), timeout=1000.0)
    check_outcomes(work, ledger, engines)
    check_settled(proxy)


def check_outcomes(work: Workload, ledger: Ledger, engines: list[FakeEngine]) -> None:
    assert set(ledger.outcomes) == set(work.lengths), "some request never ended"
    for request_id, outcome in ledger.outcomes.items():
        if isinstance(outcome, Exception):
            continue
        check_generation(work, request_id, outcome, asked_abort=request_id in work.aborts)
        answer = ledger.abort_answers.get(request_id)
        expected = outcome if outcome.finish_reason is FinishReason.ABORT else None
        assert answer == expected, f"{request_id}: abort() answered {answer}, generate() returned {outcome}"
    if work.policy == "drain":
        assert all(count == 0 for engine in engines for count in engine.running_at_update), (
            "update mid-request"
        )


def check_generation(work: Workload, request_id: str, generation: Generation, *, asked_abort: bool) -> None:
    full = min(work.lengths[request_id], work.max_new[request_id])
    tokens, logprobs = expected_tokens(request_id, len(generation.token_ids))
    assert (generation.token_ids, generation.logprobs) == (tokens, logprobs), f"{request_id}: bad stitching"
    if generation.finish_reason is FinishReason.ABORT:
        assert asked_abort or work.policy == "drain", f"{request_id}: unasked abort reached the caller"
        assert len(tokens) <= full
    else:
        assert len(tokens) == full, f"{request_id}: wrong length"
    if work.policy == "drain":
        assert len(set(generation.versions)) <= 1, f"{request_id}: versions mixed {generation.versions}"
    else:
        assert generation.versions == sorted(generation.versions), f"{request_id}: versions went back"


def check_settled(proxy: LLMProxy) -> None:
    stats = proxy.stats()
    assert stats["num_calls"] == 0 and not stats["suspended"]
    assert all(engine["in_flight"] == 0 for engine in stats["engines"])


@pytest.mark.parametrize("policy", ["drain", "in_flight"])
@pytest.mark.parametrize("faults", [False, True])
def test_random_schedules_end_every_request_once_under_the_policy(policy: str, faults: bool):
    num_seeds = NUM_FAULT_SEEDS if faults else NUM_SEEDS
    assert run_seeds(lambda seed: scenario(seed, policy, faults), range(num_seeds)) == num_seeds
