"""The built-in engine serves, and keeps its KV pool, in ``engine.dtype`` rather than the master dtype it is
given: ``make_engine`` casts its model copy, and a serving-dtype update (what the trainer publishes) lands in it
bit for bit."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_testlib import drain, engine, reference_logprobs, request, tiny_qwen2

from asyncrl.config.engine import EngineConfig
from asyncrl.engine import make_engine
from asyncrl.weight_sync.buckets import cast_for_serving


def test_the_builtin_engine_serves_and_updates_in_the_serving_dtype():
    served = make_engine(tiny_qwen2(), None, EngineConfig(dtype="bfloat16", max_kv_tokens=512))
    update = dict(cast_for_serving(tiny_qwen2(seed=1).state_dict(), "bfloat16"))

    async def main():
        await served.pause()
        await served.update_weights(update, version=1)
        await served.resume()
        return await served.generate(request("a", [5, 6, 7], max_new_tokens=4, ignore_eos=True))

    try:
        out = asyncio.run(main())
    finally:
        served.shutdown()
    model = served.core.model
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter.view(torch.int16), update[name].view(torch.int16)), name
    assert out.versions == [1] * 4


@pytest.mark.parametrize("mode", ["off", "on"])
def test_bfloat16_serving_casts_weights_and_kv_and_stays_close_to_fp32(mode):
    master = tiny_qwen2()
    prompt = [5, 6, 7, 8, 9, 10, 11]
    core = engine(tiny_qwen2(), dtype="bfloat16", decode_graphs=mode)
    assert core.dtype == torch.bfloat16
    assert {p.dtype for p in core.model.parameters()} == {torch.bfloat16}
    assert core.runner.cache.keys[0].dtype == torch.bfloat16
    core.add_request(request("r", prompt, temperature=0, max_new_tokens=6, ignore_eos=True))
    out = drain(core)["r"]
    assert out.logprobs == pytest.approx(reference_logprobs(master, prompt, out.token_ids), abs=0.05)


def test_auto_on_cpu_keeps_the_model_dtype():
    core = engine(tiny_qwen2(), dtype="auto")
    assert core.dtype == torch.float32
    assert core.runner.cache.keys[0].dtype == torch.float32
