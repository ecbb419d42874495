"""The engine serves, and keeps its KV pool, in ``engine.dtype`` rather than the master dtype it is given."""

from __future__ import annotations

import pytest
import torch
from engine_testlib import drain, engine, reference_logprobs, request, tiny_qwen2


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
