"""Property-based fuzzing of the requests the proxies accept: a bad request fails its own caller with an
error naming it and the field, reaches no engine, and never costs an engine its health."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.config.engine import EngineConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.engine import make_engine
from asyncrl.proxy import LLMProxy
from asyncrl.proxy.multi_version import MultiVersionProxy
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import FakeEngine
from asyncrl.testing.fuzz import values
from asyncrl.testing.models import tiny_qwen2
from asyncrl.types import InvalidRequest, Request, SamplingParams

FIELDS = ["request_id", "prompt_token_ids", "sampling", "version", "affinity_key", "prefix_token_ids"]


def valid_fields(rid: str) -> dict[str, Any]:
    return {"request_id": rid, "prompt_token_ids": [1, 2, 3], "sampling": SamplingParams(max_new_tokens=2)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(FIELDS), value=values, multi_version=st.booleans())
def test_a_bad_field_fails_its_caller_by_name_and_reaches_no_engine(name, value, multi_version):
    async def main() -> None:
        engine = FakeEngine(lengths=2)
        config = ProxyConfig(max_consecutive_failures=1)
        clock = asyncio.get_running_loop().time
        proxy = (
            MultiVersionProxy([engine], config, clock=clock)
            if multi_version
            else LLMProxy([engine], config, clock=clock)
        )
        request = Request(**{**valid_fields("fuzzed"), name: value})
        try:
            await proxy.generate(request)
        except (TypeError, ValueError) as err:
            assert name in str(err) or "fuzzed" in str(err), str(err)
            assert engine.received == []
        good = await proxy.generate(Request(**valid_fields("good")))  # the engine is still healthy
        assert len(good.token_ids) == 2
        await proxy.aclose()

    run_shuffled(main, None, virtual_time=True)


def test_requests_only_the_engine_can_judge_do_not_cost_it_its_health():
    """Token ids past the vocabulary and prompts past the context are the request's fault: a run of them
    longer than ``max_consecutive_failures`` must leave the real engine serving."""
    engine = make_engine(
        tiny_qwen2(0), None, EngineConfig(max_running_requests=2, max_kv_tokens=128, max_model_len=16)
    )
    vocab = engine.core.model.config.vocab_size

    async def main() -> None:
        proxy = LLMProxy([engine], ProxyConfig(max_consecutive_failures=2, retry_on_engine_failure=True))
        bad = [[vocab + 5], list(range(1, 20)), list(range(1, 17))]
        for i, prompt in enumerate(bad):
            with pytest.raises(InvalidRequest, match=f"request bad{i}"):
                await proxy.generate(Request(request_id=f"bad{i}", prompt_token_ids=prompt))
        good = await proxy.generate(Request(**valid_fields("good")))
        assert len(good.token_ids) == 2 and proxy.healthy_engines() == [0]
        await proxy.aclose()

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()


def test_a_prefix_without_its_log_probs_and_versions_is_refused_by_name():
    """Found by the fuzzer above: a two-token prefix with no log-probs reached the engine and cost it its health."""
    from asyncrl.types import checked_request

    with pytest.raises(
        InvalidRequest,
        match=r"request r: prefix_token_ids, prefix_logprobs and prefix_versions .* 2, 0 and 0",
    ):
        checked_request(Request(**valid_fields("r"), prefix_token_ids=(0, 0)))
