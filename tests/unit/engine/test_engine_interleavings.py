"""Randomized interleavings of add / abort / pause / update / resume / step on the synchronous core.

A ledger records one terminal generation per request id; a second one, a missing one, or a broken scheduler
invariant fails the run, and Hypothesis shrinks it to a short program.
"""

from __future__ import annotations

from engine_testlib import tiny_qwen2
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from asyncrl.config.engine import EngineConfig
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.types import FinishReason, Generation, Request, SamplingParams

MODEL = tiny_qwen2()
WEIGHTS = [
    {k: v.clone() for k, v in tiny_qwen2(seed=s).state_dict().items() if k != "lm_head.weight"}
    for s in (0, 1)
]


class EngineMachine(RuleBasedStateMachine):
    @initialize(kv_on_update=st.sampled_from(["keep", "recompute"]), budget=st.integers(40, 120))
    def start(self, kv_on_update: str, budget: int) -> None:
        MODEL.load_state_dict(WEIGHTS[0], strict=False)
        config = EngineConfig(
            max_running_requests=3,
            max_kv_tokens=budget,
            max_prefill_tokens_per_step=6,
            kv_on_update=kv_on_update,
        )
        self.core = LLMEngine(MODEL, None, config)
        self.added: dict[str, Request] = {}
        self.ended: dict[str, Generation] = {}
        self.version = 0

    def record(self, generations: list[Generation]) -> None:
        for g in generations:
            assert g.request_id not in self.ended, f"request {g.request_id} ended twice"
            self.ended[g.request_id] = g

    @rule(
        num_prompt=st.integers(1, 10),
        max_new_tokens=st.integers(1, 12),
        temperature=st.sampled_from([0.0, 1.0]),
        top_p=st.sampled_from([1.0, 0.8]),
    )
    def add(self, num_prompt: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
        rid = f"r{len(self.added)}"
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        self.added[rid] = Request(
            request_id=rid, prompt_token_ids=list(range(3, 3 + num_prompt)), sampling=params
        )
        self.core.add_request(self.added[rid])

    @precondition(lambda self: self.added)
    @rule(data=st.data())
    def abort(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.added)))
        generation = self.core.abort(rid)
        assert (generation is None) == (rid in self.ended)
        if generation is not None:
            assert generation.finish_reason is FinishReason.ABORT
            self.record([generation])

    @rule(num_steps=st.integers(1, 4))
    def step(self, num_steps: int) -> None:
        for _ in range(num_steps):
            self.record(self.core.step())

    @rule()
    def pause(self) -> None:
        self.core.pause()

    @rule()
    def resume(self) -> None:
        self.core.resume()

    @rule()
    def update(self) -> None:
        self.version += 1
        self.core.update_weights(WEIGHTS[self.version % 2], version=self.version)

    @invariant()
    def scheduler_is_consistent(self) -> None:
        scheduler = self.core.scheduler
        slots = [seq.slot for seq in scheduler.running]
        assert len(set(slots)) == len(slots) <= 3
        assert scheduler.kv_tokens_reserved == sum(scheduler.reservation(s) for s in scheduler.running)
        assert scheduler.kv_tokens_reserved <= scheduler.policy.max_kv_tokens
        assert all(0 <= s.num_cached < s.num_tokens <= self.core.max_model_len for s in scheduler.running)

    def teardown(self) -> None:
        if not hasattr(self, "core"):
            return
        self.core.resume()
        for _ in range(500):
            if not self.core.has_work():
                break
            self.record(self.core.step())
        assert set(self.ended) == set(self.added)
        for rid, g in self.ended.items():
            n = len(g.token_ids)
            assert n == len(g.logprobs) == len(g.versions) <= self.added[rid].sampling.max_new_tokens
            assert g.versions == sorted(g.versions) and all(0 <= v <= self.version for v in g.versions)
            assert all(lp <= 1e-6 for lp in g.logprobs)
            if g.finish_reason is FinishReason.LENGTH:
                assert n == self.added[rid].sampling.max_new_tokens


EngineMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
test_engine_interleavings = EngineMachine.TestCase
