"""The trainer's state offload (colocated sync): optimizer state and master weights go to host memory and come
back to the same objects, bit for bit, so training after a round trip equals training without."""

from __future__ import annotations

import pytest
import torch

from asyncrl.trainer.offload import OffloadChoice, StateOffloader


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step(model, optimizer)
    return model, optimizer


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One step that frees its gradients after, as ``Trainer`` does."""
    torch.manual_seed(1)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_offload_then_reload_trains_bit_equal_to_never_offloading() -> None:
    reference, ref_opt = trained()
    step(reference, ref_opt)

    model, optimizer = trained()
    offloader = StateOffloader([model], [optimizer], OffloadChoice(master_weights=True))
    params = list(model.parameters())
    moments = [optimizer.state[p]["exp_avg"] for p in params]
    moved = offloader.offload()
    assert moved == sum(p.nbytes for p in params) + sum(2 * p.nbytes for p in params)  # weights + 2 moments
    assert all(optimizer.state[p]["exp_avg"] is not m for p, m in zip(params, moments, strict=True))
    assert offloader.reload() == moved and offloader.reload() == 0
    assert list(model.parameters()) == params  # the same Parameter objects the optimizer steps
    step(model, optimizer)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(got, want)


def test_offloading_twice_is_refused() -> None:
    model, optimizer = trained()
    offloader = StateOffloader([model], [optimizer], OffloadChoice())
    offloader.offload()
    with pytest.raises(RuntimeError, match="already offloaded"):
        offloader.offload()
    assert offloader.resident_bytes() == 0  # on CPU nothing is on an accelerator
