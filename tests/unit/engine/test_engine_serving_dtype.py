"""The built-in engine serves, and keeps its KV pool, in ``engine.dtype`` rather than the master dtype it is
given: ``make_engine`` casts its model copy, and a serving-dtype update (what the trainer publishes) lands in it
bit for bit."""

from __future__ import annotations

import asyncio

import pytest
import torch
import transformers
from engine_testlib import drain, engine, reference_logprobs, request, tiny_qwen2

from asyncrl.config.engine import EngineConfig
from asyncrl.engine import make_engine
from asyncrl.engine.architectures import SUPPORTED_MODEL_TYPES
from asyncrl.models.float32_projection import float32_linear
from asyncrl.testing.models import tiny_family_model
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
    rotary = model.model.rotary_emb  # an update carries parameters only: the frequencies stay float32
    assert rotary.inv_freq.dtype == rotary.original_inv_freq.dtype == torch.float32
    assert torch.equal(rotary.inv_freq.cpu(), tiny_qwen2().model.rotary_emb.inv_freq)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_a_half_precision_engine_holds_its_model_as_from_pretrained_builds_it(model_type, dtype, tmp_path):
    """Every parameter and buffer (rotary frequencies float32, Gemma's embed_scale in ``dtype``) and the cos/sin
    table equal, bit for bit, those of HF's ``from_pretrained(dtype=...)`` of the same float32 checkpoint
    (float16 too: where HF keeps ``_keep_in_fp32_modules`` in float32, this would catch it)."""
    tiny_family_model(model_type, tied=False).save_pretrained(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=getattr(torch, dtype))
    master = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    core = engine(master, dtype=dtype)
    served = {**dict(core.model.named_parameters()), **dict(core.model.named_buffers())}
    expected = {**dict(hf.named_parameters()), **dict(hf.named_buffers())}
    assert served.keys() == expected.keys()
    for name, tensor in expected.items():
        assert served[name].dtype == tensor.dtype, name
        assert torch.equal(served[name].cpu(), tensor), name
    positions = torch.arange(core.max_model_len + 1)[None]
    cos, sin = hf.model.rotary_emb(torch.zeros(1, dtype=getattr(torch, dtype)), positions)
    table_cos, table_sin = core.runner.cos_sin.table
    assert torch.equal(table_cos.cpu(), cos[0]) and torch.equal(table_sin.cpu(), sin[0])


def test_a_bfloat16_engine_matches_hf_bfloat16_past_a_thousand_positions(tmp_path):
    """Qwen3's rope (theta 1e6) at positions 1100-1115: bf16 frequencies (``model.to(bf16)``) turned 2 of 16
    greedy tokens and put the log-probs 0.29 off HF's bf16 forward; float32 ones keep all 16 and stay within
    bf16 noise. Weights drawn wide (0.3) so attention is sharp enough to see the rope's error.

    The reference projects HF's bf16 final hidden states to float32 logits as the engine does
    (``float32_linear``), not HF's own bf16-rounded logits: measured on CPU, the engine is then 0.011 off at most
    (0.0013 on average: bf16 kernels of the layers), against 0.017 (0.008) from HF's rounded logits."""
    model = tiny_family_model(
        "qwen3", tied=True, seed=3, max_position_embeddings=40960, rope_theta=1e6, initializer_range=0.3
    )
    model.save_pretrained(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    prompt = torch.randint(3, 300, (1100,), generator=torch.Generator().manual_seed(0)).tolist()
    limits = {"max_model_len": 1200, "max_kv_tokens": 1200, "max_prefill_tokens_per_step": 512}
    core = engine(model, dtype="bfloat16", max_running_requests=1, **limits)
    core.add_request(request("r", prompt, temperature=0, max_new_tokens=16, ignore_eos=True))
    out = drain(core)["r"]
    with torch.inference_mode():
        tokens = torch.tensor([prompt + out.token_ids], device=core.runner.device)
        hf = hf.to(core.runner.device)
        logprobs = torch.log_softmax(
            float32_linear(hf.model(tokens).last_hidden_state[0], hf.lm_head), dim=-1
        )
    due = logprobs[len(prompt) - 1 : -1]
    expected = due.gather(1, torch.tensor(out.token_ids, device=due.device)[:, None])[:, 0]
    assert out.logprobs == pytest.approx(expected.tolist(), abs=0.08)
    # greedy: HF's own choice, or one within bf16 noise of it (a near tie may fall either way)
    assert (due.max(dim=-1).values - expected).max().item() <= 0.08


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
