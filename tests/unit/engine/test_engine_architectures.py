"""Every family the built-in engine accepts computes what Hugging Face computes, and the rest are refused."""

from __future__ import annotations

import pytest
import torch
import transformers
from engine_testlib import drain, engine, hf_greedy, reference_logprobs, request

from asyncrl.engine.architectures import SUPPORTED_MODEL_TYPES, architecture_of
from asyncrl.testing.models import FAMILY_SHAPES, tiny_family_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]]


def test_every_supported_family_has_a_tiny_test_model():
    assert set(SUPPORTED_MODEL_TYPES) == set(FAMILY_SHAPES)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_greedy_tokens_and_logprobs_match_hf(model_type, tied):
    model = tiny_family_model(model_type, tied=tied, num_kv_heads=2, seed=1)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    core = engine(model, max_running_requests=2, max_prefill_tokens_per_step=5)
    for i, prompt in enumerate(PROMPTS):
        core.add_request(request(str(i), prompt, temperature=0, max_new_tokens=8, ignore_eos=True))
    out = drain(core)
    for i, prompt in enumerate(PROMPTS):
        assert out[str(i)].token_ids == hf_greedy(model, prompt, 8), f"{model_type} prompt {i}"
        assert out[str(i)].logprobs == pytest.approx(
            reference_logprobs(model, prompt, out[str(i)].token_ids), abs=1e-4
        )


def test_sampled_logprobs_match_hf_without_gqa_on_a_fused_projection_family():
    model = tiny_family_model("phi3", tied=False, num_kv_heads=4, seed=2)
    core = engine(model)
    core.add_request(request("s", PROMPTS[0], temperature=0.7, max_new_tokens=8, ignore_eos=True))
    tokens = drain(core)["s"]
    assert tokens.logprobs == pytest.approx(
        reference_logprobs(model, PROMPTS[0], tokens.token_ids, 0.7), abs=1e-4
    )


def test_an_unsupported_family_is_refused_with_a_pointer_to_vllm():
    config = transformers.AutoConfig.for_model(
        "olmo2",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        vocab_size=64,
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match=r"model_type 'olmo2' is not supported.*engine.backend=vllm"):
        architecture_of(model, max_len=64)


def test_a_sliding_window_shorter_than_the_engine_context_is_refused():
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        sliding_window=16,
    )
    model = transformers.MistralForCausalLM(config)
    assert architecture_of(model, max_len=16).model_type == "mistral"
    with pytest.raises(ValueError, match=r"sliding-window attention \(window 16\).*max_model_len"):
        architecture_of(model, max_len=17)
