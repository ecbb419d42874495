"""LoRA in the trainer: only adapters train and hold optimizer state, the reference is the frozen base, the
log-probs and gradients are peft's own, adapter dropout acts only in gradient passes, and weight sync names the
adapter pairs."""

from __future__ import annotations

import peft
import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, KLConfig, LossConfig
from asyncrl.config.trainer import LoraConfig, TrainerConfig
from asyncrl.trainer.batching import build_train_batch
from asyncrl.trainer.lora import ADAPTER_NAME, adapter_dropout, lora_layers
from asyncrl.trainer.trainer import Trainer

LORA = LoraConfig(rank=4, alpha=8.0)


def lora_trainer(lora: LoraConfig = LORA, loss: LossConfig | None = None, **overrides) -> Trainer:
    config = TrainerConfig(lr=1e-2, lora=lora, **overrides)
    return Trainer(tiny_qwen2(), config, loss or LossConfig(name="ppo"), AdvantageConfig(name="grpo"))


def randomise_adapters(trainer: Trainer, seed: int = 1, members: tuple[str, ...] = ("B",)) -> None:
    """Random ``members`` of every pair: non-zero B matrices by default (peft starts B at zero, where the adapter
    changes nothing and tests see nothing); the same values on every rank's shards under FSDP2."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (_, layer), member in (
            (pair, member) for pair in lora_layers(trainer.model) for member in members
        ):
            weight = getattr(layer, f"lora_{member}")[ADAPTER_NAME].weight
            values = torch.randn(weight.shape, generator=gen) * 0.1
            if hasattr(weight, "device_mesh"):
                from torch.distributed.tensor import distribute_tensor

                values = distribute_tensor(values, weight.device_mesh, weight.placements)
            weight.copy_(values)


def groups(seed: int = 5):
    return with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=seed), tiny_qwen2(), noise=0.3)


def test_only_adapters_train_and_hold_optimizer_state():
    trainer = lora_trainer()
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    adapters = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_A" in n or "lora_B" in n for n in adapters)
    # all-linear on a 2-layer Qwen2: q, k, v, o, gate, up, down in each layer, not the output layer
    assert len(adapters) == 2 * 7 * 2
    optimised = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimised} == {id(p) for p in adapters.values()}
    before = {n: p.detach().clone() for n, p in adapters.items()}
    trainer.train_step(groups(), policy_version=0)
    assert set(trainer.optimizer.state_dict()["state"]) == set(range(len(optimised)))
    for name, weight in base.items():
        assert torch.equal(dict(trainer.model.named_parameters())[name], weight), name
    assert any(not torch.equal(before[n], p) for n, p in adapters.items() if "lora_B" in n)


def test_log_probs_and_gradients_equal_peft_models_own_forward():
    """The trainer's packed, chunked log-prob path through the adapters vs a plain forward of a PeftModel built
    separately on the same weights: same log-probs, same adapter gradients."""
    trainer = lora_trainer()
    randomise_adapters(trainer)
    batch = build_train_batch(groups(), [0.0] * 8)
    out = trainer._forward(trainer.policy, batch)
    (out.logprobs * batch.loss_mask).sum().backward()

    reference = peft.get_peft_model(
        tiny_qwen2(), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )
    reference.load_state_dict(trainer.peft_model.state_dict())
    logits = reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    taken = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    want = torch.cat([torch.zeros(len(taken), 1), taken], dim=1) * batch.loss_mask
    torch.testing.assert_close(out.logprobs * batch.loss_mask, want.detach(), rtol=0, atol=2e-6)
    want.sum().backward()
    got_grads = {n: p.grad for n, p in trainer.peft_model.named_parameters() if p.requires_grad}
    want_grads = {n: p.grad for n, p in reference.named_parameters() if p.requires_grad}
    assert got_grads.keys() == want_grads.keys()
    assert max(float(g.abs().max()) for g in want_grads.values()) > 0
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_reference_is_the_frozen_base_without_a_second_copy():
    loss = LossConfig(name="grpo", kl=KLConfig(beta=0.1))
    trainer = lora_trainer(loss=loss)
    randomise_adapters(trainer)
    assert trainer.ref_model is None and trainer.reference is trainer.policy
    batch = build_train_batch(groups(), [0.0] * 8)
    fixed, _ = trainer._step_start_logprobs(batch)
    plain = Trainer(tiny_qwen2(), TrainerConfig(), LossConfig(name="ppo"), AdvantageConfig(name="grpo"))
    base = plain._logprobs_no_grad(plain.policy, batch)
    assert torch.equal(fixed["ref_logprobs"], base)
    with_adapter = trainer._logprobs_no_grad(trainer.policy, batch)
    assert not torch.equal(with_adapter, base)  # the adapters are back on after the reference pass
    metrics = trainer.train_step(groups(), policy_version=0)
    assert metrics["kl"] > 0


def test_adapter_dropout_acts_only_in_gradient_passes():
    trainer = lora_trainer(LoraConfig(rank=4, alpha=8.0, dropout=0.5))
    randomise_adapters(trainer)
    batch = build_train_batch(groups(), [0.0] * 8)
    first = trainer._logprobs_no_grad(trainer.policy, batch)
    assert torch.equal(first, trainer._logprobs_no_grad(trainer.policy, batch))
    with adapter_dropout(trainer.model):
        dropped = trainer._forward(trainer.policy, batch).logprobs.detach()
    assert not torch.equal(dropped, first)
    assert all(not module.training for module in trainer.model.modules())  # all back to eval


def test_sync_tensors_are_the_adapter_pairs_by_layer_name():
    trainer = lora_trainer(LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj")))
    tensors = trainer.sync_tensors()
    assert sorted(tensors) == sorted(
        f"model.layers.{i}.self_attn.{proj}.lora_{m}.weight"
        for i in range(2)
        for proj in ("q_proj", "v_proj")
        for m in "AB"
    )
    q_proj = trainer.model.get_submodule("model.layers.0.self_attn.q_proj")
    assert tensors["model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, q_proj.in_features)
    assert tensors["model.layers.0.self_attn.q_proj.lora_B.weight"].shape == (q_proj.out_features, 4)
    assert trainer.adapter.scaling == 2.0
    full = Trainer(tiny_qwen2(), TrainerConfig(), LossConfig(name="ppo"), AdvantageConfig(name="grpo"))
    assert full.adapter is None and "lm_head.weight" in full.sync_tensors()


def test_bad_lora_settings_name_the_field():
    with pytest.raises(ValueError, match="trainer.lora.rank"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match="trainer.lora.dropout"):
        LoraConfig(dropout=1.0)
    with pytest.raises(ValueError, match="stands alone"):
        LoraConfig(target_modules=("all-linear", "q_proj"))
    with pytest.raises(ValueError, match=r"trainer.lora.target_modules=\['nope'\]"):
        lora_trainer(LoraConfig(target_modules=("nope",)))
    with pytest.raises(ValueError, match="pass no ref_model"):
        Trainer(tiny_qwen2(), TrainerConfig(lora=LORA), LossConfig(), AdvantageConfig(), tiny_qwen2())
