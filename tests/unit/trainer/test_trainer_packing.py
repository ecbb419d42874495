"""Sequence packing: the packed decoder gives the padded path's log-probs and gradients, and no sample sees
another through attention, under every attention implementation that runs here (``model.attn_implementation``;
scripts/gpu-smoke.sh reruns this file on CUDA, where flex_attention trains and flash-attn may be installed)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs
from transformers.utils import is_flash_attn_2_available

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.models import device_under_test
from asyncrl.trainer.batching import build_train_batch, plan_micro_batches
from asyncrl.trainer.logprobs import compute_token_logprobs, decoder_hidden
from asyncrl.trainer.packing import pack, plan_rows, rows_for
from asyncrl.trainer.trainer import Trainer

TOL = 1e-5
CPU_ATTENTION = ("sdpa", "eager")
ON_CPU = device_under_test().type == "cpu"
slow_on_cpu = pytest.mark.slow if ON_CPU else (lambda test: test)
"""flex_attention compiles (~15 s on CPU, forward only): slow there; on CUDA it is in the GPU kit's run."""


def _model(attention: str = "sdpa", dtype: torch.dtype = torch.float32, device: torch.device | None = None):
    model = tiny_qwen2().to(device=device or device_under_test(), dtype=dtype)
    model.set_attn_implementation(attention)
    return model


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


@pytest.mark.parametrize("attention", CPU_ATTENTION)
@pytest.mark.parametrize("row_tokens", [1, 24, 10_000])  # one sample per row, a few rows, a single row
def test_packed_logprobs_and_gradients_equal_the_padded_path(attention: str, row_tokens: int) -> None:
    batch = _batch().to(device_under_test())  # scripts/gpu-smoke.sh runs this on CUDA
    grads = []
    values = []
    for packed in (None, row_tokens):
        model = _model(attention)
        logprobs = _logprobs(model, batch, packed)
        (logprobs * batch.advantages).sum().backward()
        values.append(logprobs.detach())
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert (batch.attention_mask == 0).any(), "the batch must contain padding for the test to mean anything"
    torch.testing.assert_close(values[1], values[0], atol=TOL, rtol=0)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=TOL, rtol=0, msg=name)


@pytest.mark.parametrize("attention", CPU_ATTENTION)
def test_attention_never_crosses_a_sample_boundary(attention: str) -> None:
    batch = _batch()
    model = _model(attention, device=torch.device("cpu"))
    before = _logprobs(model, batch, 10_000)
    changed = batch.input_ids.clone()
    changed[0, : int(batch.attention_mask[0].sum())] = 7  # another sample 0, packed in the same row
    after = _logprobs(model, dataclasses.replace(batch, input_ids=changed), 10_000)
    torch.testing.assert_close(after[1:], before[1:], atol=TOL, rtol=0)
    assert not torch.allclose(after[0], before[0])


@slow_on_cpu
def test_flex_attention_packed_equals_the_padded_sdpa_path() -> None:
    """FlexAttention's document mask (built by transformers from the restarting position ids) keeps the samples
    of a row apart: packed flex log-probs equal the padded sdpa path's. On CPU only the forward (torch 2.13 has
    no FlexAttention backward there; its compile makes this test ~15 s, hence slow); on CUDA the gradients too.
    One flex shape per process: torch 2.13's CPU inductor failed to compile a third flex shape once."""
    batch = _batch().to(device_under_test())
    train = not ON_CPU
    results = []
    for attention, packed in (("sdpa", None), ("flex_attention", 24)):  # 24: several rows of several samples
        model = _model(attention)
        with torch.set_grad_enabled(train):
            logprobs = _logprobs(model, batch, packed)
        if train:
            (logprobs * batch.advantages).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()} if train else {}
        results.append((logprobs.detach(), grads))
    (reference, reference_grads), (flex, flex_grads) = results
    torch.testing.assert_close(flex, reference, atol=1e-4, rtol=0)  # two kernels: 1e-6 apart on CPU
    for name, grad in reference_grads.items():
        torch.testing.assert_close(flex_grads[name], grad, atol=1e-4, rtol=0, msg=name)


@pytest.mark.skipif(
    ON_CPU or not is_flash_attn_2_available(), reason="flash-attn 2 runs on CUDA with the flash-attn package"
)
def test_flash_attention_packed_in_one_row_equals_the_padded_sdpa_path() -> None:
    """flash-attn separates packed samples only in a batch of one row (packing.py), so the trainer packs them
    all into one. bfloat16 (flash-attn takes nothing else): this model's log-probs move 2e-3 from float32 to
    bfloat16 and 0.24 when samples attend across a row (measured on CPU with sdpa), so 3e-2 tells them apart."""
    batch = _batch().to(device_under_test())
    reference = _logprobs(_model("sdpa", torch.bfloat16), batch, None)
    flash = _logprobs(_model("flash_attention_2", torch.bfloat16), batch, 24)
    torch.testing.assert_close(flash.float(), reference.float(), atol=3e-2, rtol=0)


class _RecordingBody(nn.Module):
    """A decoder body configured for ``attention`` that records the packed shape it is run on."""

    def __init__(self, attention: str) -> None:
        super().__init__()
        self.config = SimpleNamespace(_attn_implementation=attention)
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, input_ids, attention_mask, position_ids, use_cache):  # noqa: ANN001
        self.shapes.append(tuple(input_ids.shape))
        return SimpleNamespace(last_hidden_state=input_ids.unsqueeze(-1).float())


@pytest.mark.parametrize(
    ("attention", "rows"),
    [("sdpa", 3), ("flex_attention", 3), ("flash_attention_2", 1), ("flash_attention_3", 1)],
)
def test_flash_attention_gets_every_sample_in_one_row(attention: str, rows: int) -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    body = _RecordingBody(attention)
    hidden = decoder_hidden(body, torch.arange(1, 13).reshape(3, 4), mask, packed_row_tokens=4)
    assert body.shapes == [(rows, 9 if rows == 1 else 4)]
    assert torch.equal(hidden.squeeze(-1), (torch.arange(1, 13).reshape(3, 4) * mask).float())
    assert rows_for(attention, 4, 9) == (9 if rows == 1 else 4)


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
