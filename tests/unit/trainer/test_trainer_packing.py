"""Sequence packing: the packed decoder gives the padded path's log-probs and gradients, and no sample sees
another through attention."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.models import device_under_test
from asyncrl.trainer.batching import build_train_batch, plan_micro_batches
from asyncrl.trainer.logprobs import compute_token_logprobs
from asyncrl.trainer.packing import pack, plan_rows
from asyncrl.trainer.trainer import Trainer

TOL = 1e-5


def _batch(seed: int = 0):
    groups = random_groups(num_groups=3, group_size=4, seed=seed)
    return build_train_batch(groups, torch.linspace(-1, 1, 12))


def _logprobs(model, batch, packed_row_tokens):
    return compute_token_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        batch.loss_mask,
        chunk_size=7,
        packed_row_tokens=packed_row_tokens,
    ).logprobs


@pytest.mark.parametrize("row_tokens", [1, 24, 10_000])  # one sample per row, a few rows, a single row
def test_packed_logprobs_and_gradients_equal_the_padded_path(row_tokens: int) -> None:
    device = device_under_test()  # scripts/gpu-smoke.sh runs this on CUDA
    batch = _batch().to(device)
    grads = []
    values = []
    for packed in (None, row_tokens):
        model = tiny_qwen2().to(device)
        logprobs = _logprobs(model, batch, packed)
        (logprobs * batch.advantages).sum().backward()
        values.append(logprobs.detach())
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert (batch.attention_mask == 0).any(), "the batch must contain padding for the test to mean anything"
    torch.testing.assert_close(values[1], values[0], atol=TOL, rtol=0)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=TOL, rtol=0, msg=name)


def test_attention_never_crosses_a_sample_boundary() -> None:
    batch = _batch()
    model = tiny_qwen2()
    before = _logprobs(model, batch, 10_000)
    changed = batch.input_ids.clone()
    changed[0, : int(batch.attention_mask[0].sum())] = 7  # another sample 0, packed in the same row
    after = _logprobs(model, dataclasses.replace(batch, input_ids=changed), 10_000)
    torch.testing.assert_close(after[1:], before[1:], atol=TOL, rtol=0)
    assert not torch.allclose(after[0], before[0])


def test_rows_and_positions_restart_per_sample() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    ids = torch.arange(12).reshape(3, 4)
    packing = pack(ids, mask, row_tokens=6)
    assert plan_rows([3, 2, 4], 6) == [[2, 1], [0]]
    assert packing.input_ids.tolist() == [[8, 9, 10, 11, 4, 5], [0, 1, 2, 0, 0, 0]]
    assert packing.position_ids.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]
    assert torch.equal(packing.unpack(packing.input_ids), ids * mask)


def test_packed_micro_batches_count_real_tokens() -> None:
    assert plan_micro_batches([10, 2, 2, 2], 15, packed=True) == [[0, 1, 2], [3]]
    assert plan_micro_batches([10, 2, 2, 2], 15) == [[0], [1, 2, 3]]  # padded: 2 rows × 10 > 15


def test_a_train_step_packed_equals_the_padded_step() -> None:
    groups = with_model_logprobs(random_groups(num_groups=2, seed=3), tiny_qwen2())
    states = []
    for packing in (False, True):
        config = TrainerConfig(
            lr=1e-3, num_mini_batches=2, max_tokens_per_microbatch=40, sequence_packing=packing
        )
        trainer = Trainer(tiny_qwen2(), config, LossConfig(name="ppo"), AdvantageConfig(name="grpo"))
        trainer.train_step(groups, 0)
        states.append(trainer.model.state_dict())
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, atol=TOL, rtol=0, msg=name)
