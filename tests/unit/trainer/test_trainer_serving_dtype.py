"""engine.dtype at publish: the trainer casts its weights to the serving dtype once, where they live, keeps its
fp32 masters, and every transport ships (and ``weight_sync/bytes`` counts) the serving-dtype bytes."""

from __future__ import annotations

import pytest
import torch
from trainer_fixtures import tiny_qwen2

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.trainer import Trainer
from asyncrl.weight_sync.transports import make_weight_sync


def trainer(serving_dtype: str | None) -> Trainer:
    return Trainer(
        tiny_qwen2(), TrainerConfig(), LossConfig(), AdvantageConfig(name="grpo"), serving_dtype=serving_dtype
    )


def test_sync_tensors_are_cast_once_to_the_serving_dtype_and_the_masters_stay_fp32():
    bf16 = trainer("bfloat16")
    synced = bf16.sync_tensors()
    assert {t.dtype for t in synced.values()} == {torch.bfloat16}
    assert synced["lm_head.weight"] is synced["model.embed_tokens.weight"], "the tied matrix is cast once"
    masters = dict(bf16.model.named_parameters())
    assert {p.dtype for p in masters.values()} == {torch.float32}
    for name, master in masters.items():
        assert torch.equal(synced[name], master.detach().to(torch.bfloat16)), name


@pytest.mark.parametrize("transport", ["in_process", "object_store"])
def test_every_transport_ships_and_counts_the_serving_dtype_bytes(transport):
    fp32 = make_weight_sync(transport).publish(1, trainer(None).sync_tensors())
    bf16 = make_weight_sync(transport).publish(1, trainer("bfloat16").sync_tensors())
    assert {e.dtype for e in bf16.manifest} == {"bfloat16"}
    assert {e.dtype for e in fp32.manifest} == {"float32"}
    assert bf16.nbytes * 2 == fp32.nbytes  # weight_sync/bytes: what was shipped, the tied matrix once
    shipped = dict(make_weight_sync(transport).receive(bf16))
    assert shipped["lm_head.weight"].dtype == torch.bfloat16
