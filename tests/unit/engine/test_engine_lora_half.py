"""LoRA on a half-precision built-in engine (``engine.dtype: auto`` serves bfloat16 on CUDA): the adapters are
served low-rank, as peft computes them unmerged, never merged into the half-precision weights, where a small
delta vanishes under the weights' rounding. Updates copy into the same A and B tensors, so captured decode
graphs stay valid; a level-2 sleep moves A and B with the weights.

Device-aware: ``scripts/gpu-smoke.sh`` reruns this file with ``ASYNCRL_TEST_DEVICE=cuda``, where the decode
graphs (``engine.decode_graphs: on``) are really captured over the adapters' forward hooks.
"""

from __future__ import annotations

import copy

import pytest
import torch
from engine_testlib import device_under_test, drain, engine, request, tiny_llama, tiny_qwen2
from test_engine_adapters import adapted, publish

from asyncrl.trainer.lora import lora_layers
from asyncrl.weight_sync import InProcessSync

PROMPTS = [[3, 17, 9, 41], [5, 5, 8], [60, 2, 33, 12, 7, 1], [9]]


def generate(core) -> dict[str, tuple[list[int], list[float]]]:
    """Sampled tokens and log-probs of fixed requests, EOS ignored so every run steps through the same shapes."""
    for index, prompt in enumerate(PROMPTS):
        core.add_request(
            request(f"r{index}", prompt, max_new_tokens=12, temperature=1.0, seed=index, ignore_eos=True)
        )
    return {rid: (list(g.token_ids), list(g.logprobs)) for rid, g in drain(core).items()}


def peft_engine(wrapped, **config):
    """An engine over peft's own model (its ``lora.Linear`` layers, unmerged): the reference."""
    return engine(copy.deepcopy(wrapped.get_base_model()), **config)


def test_an_early_adapter_changes_a_bfloat16_engine_as_it_changes_peft_unmerged():
    """W0 ~ N(0, 0.02) and B ~ 1e-4, as early in training: merged into the bf16 weights, most of each delta fell
    under half an ulp of W0 and vanished, and the served adapter effect was 2.6× off peft's unmerged bf16 one
    on these layers (at 2048 × 2048, 88 % of the weights unchanged and the effect 89 % off the exact one)."""
    base = tiny_qwen2()
    wrapped = adapted(base, seed=1)
    with torch.no_grad():
        for _, layer in lora_layers(wrapped):
            layer.lora_B["default"].weight.normal_(0.0, 1e-4)
    served = engine(copy.deepcopy(base), dtype="bfloat16")
    served.update_weights(publish(wrapped, 1), 1)
    device = device_under_test()
    plain = copy.deepcopy(base).to(device, torch.bfloat16)
    reference = copy.deepcopy(wrapped.get_base_model()).to(device, torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    layers = lora_layers(reference)
    assert len(layers) == served.adapters.num_adapted == 14  # every linear layer of both decoder layers
    with torch.no_grad():
        for name, layer in layers:
            x = torch.randn(64, layer.in_features, generator=generator).to(device, torch.bfloat16)
            before = plain.get_submodule(name)(x).float()
            want = layer(x).float() - before
            effect = served.model.get_submodule(name)(x).float() - before
            assert want.norm() > 0, name
            assert (effect - want).norm() / want.norm() < 0.05, name


@pytest.mark.parametrize("mode", ["off", "on"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_engine_serves_peft_unmerged_model_exactly(dtype, mode):
    """Same tokens and log-probs as an engine over peft's own unmerged layers, at static shapes (``on``,
    captured on CUDA) and dynamic ones; the base weights are never touched."""
    base = tiny_qwen2()
    wrapped = adapted(base, seed=1)
    served = engine(copy.deepcopy(base), dtype=dtype, decode_graphs=mode)
    served.update_weights(publish(wrapped, 1), 1)
    tokens = generate(served)
    assert tokens == generate(peft_engine(wrapped, dtype=dtype, decode_graphs=mode))
    plain = engine(copy.deepcopy(base), dtype=dtype, decode_graphs=mode)
    assert tokens != generate(plain)  # the adapter changes what is generated
    for name, tensor in plain.model.state_dict().items():
        assert torch.equal(served.model.state_dict()[name], tensor), name


def test_adapter_updates_reach_captured_decode_graphs_in_place():
    """A second update at the same layout copies into the same A and B: the captured graphs stay and serve it
    (no new capture on CUDA). A new layout (fewer adapted layers) or a full update (the adapter dropped)
    changes the fingerprint the graphs depend on, so they are captured again."""
    base = tiny_qwen2()
    served = engine(copy.deepcopy(base), dtype="bfloat16", decode_graphs="on")
    assert generate(served) == generate(engine(copy.deepcopy(base), dtype="bfloat16", decode_graphs="on"))
    unadapted = served.adapters.fingerprint()
    first = adapted(base, seed=1)
    served.update_weights(publish(first, 1), 1)
    assert served.adapters.fingerprint() != unadapted
    assert generate(served) == generate(peft_engine(first, dtype="bfloat16", decode_graphs="on"))
    layout, captures = served.adapters.fingerprint(), served.runner.static.total.captures

    second = adapted(base, seed=2)
    served.update_weights(publish(second, 2), 2)
    assert served.adapters.fingerprint() == layout
    assert generate(served) == generate(peft_engine(second, dtype="bfloat16", decode_graphs="on"))
    assert served.runner.static.total.captures == captures

    third = adapted(base, seed=3, targets=["q_proj", "v_proj"])
    served.update_weights(publish(third, 3), 3)
    assert served.adapters.num_adapted == 4 and served.adapters.fingerprint() != layout
    assert generate(served) == generate(peft_engine(third, dtype="bfloat16", decode_graphs="on"))

    full = {n: t + 0.01 for n, t in base.state_dict().items()}
    full["lm_head.weight"] = full["model.embed_tokens.weight"]
    served.update_weights(InProcessSync().publish(4, full), 4)
    assert served.adapters.num_adapted == 0 and served.adapters.tensors() == []
    moved = copy.deepcopy(base)
    moved.load_state_dict(full)
    assert generate(served) == generate(engine(moved, dtype="bfloat16", decode_graphs="on"))


def test_a_level_two_sleep_moves_the_low_rank_adapters_with_the_weights():
    """A and B leave the device with the weights and come back with them, an update while asleep included
    (its new layers made where the weights then are, in host memory)."""
    base = tiny_qwen2()
    served = engine(copy.deepcopy(base), dtype="bfloat16", decode_graphs="on")
    served.update_weights(publish(adapted(base, seed=1, targets=["q_proj", "v_proj"]), 1), 1)
    generate(served)
    weights = sum(p.nbytes for p in served.model.parameters())
    pool = served.runner.cache.resident_bytes()
    adapter_bytes = sum(t.nbytes for t in served.adapters.tensors())
    assert served.sleep(2) == pool + weights + adapter_bytes
    assert {t.device.type for t in served.adapters.tensors()} == {"cpu"}

    later = adapted(base, seed=2)
    served.update_weights(publish(later, 2), 2)
    adapter_bytes = sum(t.nbytes for t in served.adapters.tensors())
    assert served.wake() == pool + weights + adapter_bytes
    assert {t.device for t in served.adapters.tensors()} == {served.runner.device}
    assert generate(served) == generate(peft_engine(later, dtype="bfloat16", decode_graphs="on"))


def test_an_adapter_on_the_lm_head_is_refused_by_name():
    """The engine's logits are float32 products of the head's weight (``models.float32_projection``), which a
    low-rank forward hook on the head would never join: refused, as the trainer refuses a LoRA head."""
    base = tiny_llama()  # an untied head, which peft can adapt
    served = engine(copy.deepcopy(base), dtype="bfloat16")
    update = publish(adapted(base, seed=1, targets=["q_proj", "lm_head"]), 1)
    with pytest.raises(ValueError, match="'lm_head' is the LM head"):
        served.update_weights(update, 1)
