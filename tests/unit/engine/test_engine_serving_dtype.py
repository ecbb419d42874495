"""The built-in engine serves in ``engine.dtype``: ``make_engine`` casts its model copy, and a serving-dtype
update (what the trainer publishes) lands in it bit for bit."""

from __future__ import annotations

import asyncio

import torch
from engine_testlib import request, tiny_qwen2

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


def test_auto_keeps_the_models_own_dtype_on_cpu():
    served = make_engine(tiny_qwen2(), None, EngineConfig(max_kv_tokens=512))
    try:
        assert {p.dtype for p in served.core.model.parameters()} == {torch.float32}
    finally:
        served.shutdown()
