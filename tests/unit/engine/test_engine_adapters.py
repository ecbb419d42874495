"""Adapter-only weight updates on the built-in engine serving float32: after one, the engine serves exactly peft's
merged model (weights bit for bit, and the same tokens and log-probs as an engine built on the merged model);
updates are absolute, a full update drops the adapter, and a bad adapter manifest changes nothing. Half
precision serves adapters low-rank instead: test_engine_lora_half.py."""

from __future__ import annotations

import copy

import peft
import pytest
import torch
from engine_testlib import drain, engine, request, tiny_qwen2

from asyncrl.trainer.lora import adapter_spec, adapter_tensors
from asyncrl.weight_sync import FlatBufferSync, InProcessSync, LoraAdapter, WeightSyncError
from asyncrl.weight_sync.protocol import ManifestEntry, WeightUpdate

PROMPTS = [[3, 17, 9, 41], [5, 5, 8], [60, 2, 33, 12, 7, 1], [9]]


def adapted(base: torch.nn.Module, *, seed: int, targets="all-linear") -> peft.PeftModel:
    """A peft model on a copy of ``base`` with random (non-zero) A and B."""
    torch.manual_seed(seed)
    wrapped = peft.get_peft_model(
        copy.deepcopy(base), peft.LoraConfig(r=4, lora_alpha=12, target_modules=targets)
    )
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape) * 0.2)
    return wrapped


def publish(wrapped: peft.PeftModel, version: int, sync=None):
    model = wrapped.get_base_model()
    return (sync or InProcessSync()).publish(version, adapter_tensors(model), adapter=adapter_spec(model))


def generate(core) -> dict[str, tuple[list[int], list[float]]]:
    for index, prompt in enumerate(PROMPTS):
        core.add_request(request(f"r{index}", prompt, max_new_tokens=12, temperature=1.0, seed=index))
    return {rid: (list(g.token_ids), list(g.logprobs)) for rid, g in drain(core).items()}


@pytest.mark.parametrize("sync", [InProcessSync(), FlatBufferSync()], ids=lambda s: s.name)
def test_after_an_adapter_update_the_engine_serves_peft_merged_model_exactly(sync):
    base = tiny_qwen2()
    wrapped = adapted(base, seed=1)
    update = publish(wrapped, 1, sync)
    assert update.kind == "lora" and update.adapter == LoraAdapter(scaling=3.0)
    served = engine(copy.deepcopy(base))
    served.update_weights(update, 1)
    merged = copy.deepcopy(wrapped).merge_and_unload()
    for name, tensor in merged.state_dict().items():
        assert torch.equal(served.model.state_dict()[name], tensor), name
    tokens = generate(served)
    assert tokens == generate(engine(merged))
    assert tokens != generate(engine(copy.deepcopy(base)))  # the adapter changes what is generated
    assert served.version == 1


def test_adapter_updates_are_absolute_and_a_full_update_drops_the_adapter():
    base = tiny_qwen2()
    first = adapted(base, seed=1)
    second = adapted(base, seed=2, targets=["q_proj", "v_proj"])
    served = engine(copy.deepcopy(base))
    served.update_weights(publish(first, 1), 1)
    served.update_weights(publish(second, 2), 2)  # layers only the first adapted go back to the base
    want = copy.deepcopy(second).merge_and_unload().state_dict()
    assert all(torch.equal(served.model.state_dict()[n], t) for n, t in want.items())
    full = {n: t + 0.5 for n, t in base.state_dict().items()}
    full["lm_head.weight"] = full["model.embed_tokens.weight"]
    served.update_weights(InProcessSync().publish(3, full), 3)
    assert served.adapters.num_adapted == 0
    assert all(torch.equal(served.model.state_dict()[n], t) for n, t in full.items())


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ([("model.layers.0.self_attn.q_proj.lora_A.weight", (4, 64))], "lacks its lora_B"),
        ([("model.layers.0.self_attn.q_proj.bias", (64,))], "is not a '<module>.lora_A.weight'"),
        (
            [("model.nope.lora_A.weight", (4, 64)), ("model.nope.lora_B.weight", (64, 4))],
            "no linear layer of the model",
        ),
        (
            [
                ("model.layers.0.self_attn.q_proj.lora_A.weight", (4, 64)),
                ("model.layers.0.self_attn.q_proj.lora_B.weight", (64, 3)),
            ],
            "needs",
        ),
    ],
)
def test_a_bad_adapter_manifest_is_refused_before_anything_changes(entries, error):
    served = engine(tiny_qwen2())
    before = {n: t.clone() for n, t in served.model.state_dict().items()}
    manifest = tuple(ManifestEntry(name=n, dtype="float32", shape=s) for n, s in entries)
    handle = tuple((n, torch.zeros(s)) for n, s in entries)
    update = WeightUpdate(
        version=1, transport="in_process", manifest=manifest, handle=handle, adapter=LoraAdapter(scaling=1.0)
    )
    with pytest.raises(WeightSyncError, match=error):
        served.update_weights(update, 1)
    assert served.version == 0
    assert all(torch.equal(served.model.state_dict()[n], t) for n, t in before.items())


def test_an_adapter_update_carries_only_adapter_bytes():
    base = tiny_qwen2()
    update = publish(adapted(base, seed=1), 1)
    full = InProcessSync().publish(1, base.state_dict())
    adapter_numel = sum(p.numel() for n, p in adapted(base, seed=1).named_parameters() if "lora_" in n)
    assert update.nbytes == 4 * adapter_numel
    distinct = {t.data_ptr(): t.numel() for t in base.state_dict().values()}  # a tied matrix is shipped once
    assert full.nbytes == 4 * sum(distinct.values())
    assert update.nbytes < full.nbytes / 4
