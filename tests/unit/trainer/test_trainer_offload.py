"""The trainer's state offload (colocated sync) in one process: optimizer state, master weights and the frozen
reference model leave their storages empty (freed) and come back into the same tensors, bit for bit, so training
after a round trip equals training without; a read of the state between steps leaves the reference offloaded.
The host copies live in buffers made at the first offload and reused by every later one (pinned in place once,
at their exact size, on a GPU: a fake CUDA runtime here). On the device under test (``ASYNCRL_TEST_DEVICE``):
the GPU kit's unit section runs these on CUDA, where the host copies must be pinned and the device allocator
must give the bytes back."""

from __future__ import annotations

import copy
import gc
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, KLConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.engine import host_weights
from asyncrl.engine.host_weights import ALIGNMENT
from asyncrl.testing.models import device_under_test
from asyncrl.trainer import offload
from asyncrl.trainer.offload import OffloadChoice, StateOffloader
from asyncrl.trainer.trainer import Trainer

DEVICE = device_under_test()


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step(model, optimizer)
    return model, optimizer


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One step that frees its gradients after, as ``Trainer`` does."""
    torch.manual_seed(1)
    model(torch.randn(4, 8).to(DEVICE)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The weights and Adam's two moments of every weight: what ``master_weights=True`` moves."""
    params = list(model.parameters())
    return params + [optimizer.state[p][key] for p in params for key in ("exp_avg", "exp_avg_sq")]


def test_offload_frees_every_storage_in_place_and_training_after_reload_is_bit_equal() -> None:
    reference, ref_opt = trained()
    step(reference, ref_opt)

    model, optimizer = trained()
    offloader = StateOffloader([model], [optimizer], OffloadChoice(master_weights=True))
    tensors = state_tensors(model, optimizer)
    allocated = torch.cuda.memory_allocated(DEVICE) if DEVICE.type == "cuda" else 0
    moved = offloader.offload()
    assert moved == sum(t.nbytes for t in tensors)  # weights + 2 moments
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors), "a storage was not freed"
    assert offloader.resident_bytes() == 0
    # the same objects hold the state: nothing was rebuilt or swapped
    assert state_tensors(model, optimizer) == tensors
    if DEVICE.type == "cuda":
        assert torch.cuda.memory_allocated(DEVICE) <= allocated - moved, "the device kept the offloaded bytes"
        assert all(parked.host.is_pinned() for parked in offloader._parked)
    assert offloader.reload() == moved and offloader.reload() == 0
    assert offloader.resident_bytes() == (moved if DEVICE.type != "cpu" else 0)
    step(model, optimizer)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(got, want)


def test_a_storage_two_tensors_view_moves_once() -> None:
    """Adam's moments viewing one flat buffer (as a fused or flattened optimizer's may): one host copy, one
    count, and both views whole again after the reload."""
    flat = torch.arange(12.0, device=DEVICE)
    model = torch.nn.Linear(2, 2, bias=False).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters())
    (param,) = model.parameters()
    optimizer.state[param] = {"exp_avg": flat[:4].view(2, 2), "exp_avg_sq": flat[4:8].view(2, 2)}
    offloader = StateOffloader([model], [optimizer], OffloadChoice())
    assert offloader.offload() == flat.nbytes and len(offloader._parked) == 1
    assert offloader.reload() == flat.nbytes
    assert torch.equal(flat, torch.arange(12.0, device=DEVICE))


def test_host_weights_mapped_from_a_file_stay_where_they_are() -> None:
    """A storage that cannot be resized (a CPU model's weights mapped from its safetensors file; here numpy's
    memory) is already host memory the tensor does not own: left in place and not counted; resizable state
    beside it still moves."""
    model = torch.nn.Linear(2, 2, bias=False)
    model.weight.data = torch.from_numpy(np.ones((2, 2), dtype=np.float32))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    offloader = StateOffloader([model], [optimizer], OffloadChoice(master_weights=True))
    assert offloader.offload() == 2 * model.weight.nbytes  # the two moments only
    assert model.weight.untyped_storage().nbytes() == model.weight.nbytes
    offloader.reload()


@pytest.fixture
def allocations(monkeypatch) -> list[int]:
    """The size of every host buffer allocated (``engine.host_weights.allocate_host``), in order."""
    sizes: list[int] = []
    allocate = host_weights.allocate_host

    def counted(nbytes: int) -> torch.Tensor:
        sizes.append(nbytes)
        return allocate(nbytes)

    monkeypatch.setattr(host_weights, "allocate_host", counted)
    return sizes


@pytest.fixture
def cudart(monkeypatch) -> SimpleNamespace:
    """A fake CUDA runtime (``torch.cuda.cudart()``) with its register and unregister calls in ``calls``, a
    register returning ``error`` (0: success); and the offloader told its storages are on a GPU (``on_gpu``),
    so its host buffers are pinned as they would be there."""
    fake = SimpleNamespace(calls=[], error=0)
    fake.cudaHostRegister = lambda ptr, size, flags: fake.calls.append(("register", ptr, size)) or fake.error
    fake.cudaHostUnregister = lambda ptr: fake.calls.append(("unregister", ptr)) or 0
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(offload, "on_gpu", lambda storages: True)
    return fake


def aligned(tensors: list[torch.Tensor]) -> int:
    """The host buffer's exact size for ``tensors``' storages: each at a 256-byte aligned offset."""
    return sum(-(-t.untyped_storage().nbytes() // ALIGNMENT) * ALIGNMENT for t in tensors)


def test_host_buffers_are_allocated_at_the_first_offload_only_and_every_reload_is_bit_exact(allocations):
    """Three round trips with a step between each (new values, the same layout): one allocation, at the exact
    size, the same host memory every time, and the state after each reload equal to it before the offload."""
    model, optimizer = trained()
    offloader = StateOffloader([model], [optimizer], OffloadChoice(master_weights=True))
    tensors = state_tensors(model, optimizer)
    addresses = None
    for _ in range(3):
        want = [t.detach().clone() for t in tensors]
        moved = offloader.offload()
        held = [parked.host.data_ptr() for parked in offloader._parked]
        assert addresses in (None, held), "the host copies moved to new memory"
        addresses = held
        assert offloader.reload() == moved == sum(t.nbytes for t in tensors)
        for got, expected in zip(state_tensors(model, optimizer), want, strict=True):
            assert torch.equal(got, expected)
        step(model, optimizer)
    assert allocations == [aligned(tensors)]
    assert offloader.host_memory() == {
        "host_bytes": aligned(tensors),
        "host_pinned_bytes": 0,  # on CPU: plain host memory
        "host_allocations": 1,
    }


def test_a_changed_layout_allocates_a_new_buffer(allocations):
    """A storage of another size (a LoRA layout change, here a grown moment) makes the next offload allocate
    anew, at the new exact size; the round trip is still bit-exact."""
    model, optimizer = trained()
    offloader = StateOffloader([model], [optimizer], OffloadChoice())
    offloader.offload()
    offloader.reload()
    first = model[0].weight
    optimizer.state[first]["exp_avg"] = torch.arange(400.0, device=DEVICE)
    moments = [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
    offloader.offload()
    offloader.reload()
    assert torch.equal(optimizer.state[first]["exp_avg"], torch.arange(400.0, device=DEVICE))
    assert len(allocations) == 2 and allocations[1] == aligned(moments) != allocations[0]
    assert offloader.host_memory()["host_allocations"] == 2


def test_on_a_gpu_the_buffer_is_pinned_once_at_its_exact_size(cudart):
    """Pinned in place (``cudaHostRegister``) at the buffer's exact size, not a power of two, at the first
    offload only; the pinned bytes reported; dropping the offloader unpins it."""
    model, optimizer = trained()
    moments = [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
    offloader = StateOffloader([model], [optimizer], OffloadChoice())
    for _ in range(3):
        offloader.offload()
        offloader.reload()
    assert [(call, size) for call, _, size in cudart.calls] == [("register", aligned(moments))]
    assert aligned(moments) & (aligned(moments) - 1), "the test's size is a power of two already"
    assert offloader.host_memory()["host_pinned_bytes"] == aligned(moments)
    pinned = cudart.calls[0][1]
    del offloader
    gc.collect()
    assert cudart.calls[1:] == [("unregister", pinned)]


def test_an_offload_whose_pinning_fails_frees_nothing(cudart) -> None:
    """No pinned host memory left (``cudaHostRegister`` fails): the error names it, the state stays resident
    and whole, and a later offload tries again."""
    model, optimizer = trained()
    want = [t.detach().clone() for t in state_tensors(model, optimizer)]
    offloader = StateOffloader([model], [optimizer], OffloadChoice(master_weights=True))
    cudart.error = 2
    with pytest.raises(
        RuntimeError, match=r"a trainer's offloaded state failed \(cudaHostRegister: cudaError 2"
    ):
        offloader.offload()
    assert not offloader.offloaded and offloader.reload() == 0
    for got, expected in zip(state_tensors(model, optimizer), want, strict=True):
        assert torch.equal(got, expected)
    cudart.error = 0
    assert offloader.offload() == sum(t.nbytes for t in want)
    offloader.reload()


def test_offloading_twice_is_refused() -> None:
    model, optimizer = trained()
    offloader = StateOffloader([model], [optimizer], OffloadChoice())
    offloader.offload()
    with pytest.raises(RuntimeError, match="already offloaded"):
        offloader.offload()


def kl_trainer() -> Trainer:
    """A tiny trainer with a KL term, so a frozen reference copy of its own (``Trainer.ref_model``)."""
    model = tiny_qwen2().to(DEVICE)
    loss = LossConfig(name="ppo", kl=KLConfig(beta=0.1, estimator="k3"))
    return Trainer(model, TrainerConfig(lr=1e-2), loss, AdvantageConfig(name="grpo"), copy.deepcopy(model))


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the storages ``tensors`` view, each once (the tiny model's embedding and head are tied)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def test_the_reference_model_is_freed_with_the_state_and_comes_back_bit_for_bit_only_for_a_step() -> None:
    """``OffloadChoice.reference`` frees the reference's storages with the moments; a read between steps
    (``reload(reference=False)``: a checkpoint, a catch-up pack) brings back the moments alone and the offload
    after it moves only them; the step's reload brings the reference back bit for bit, and the next step (whose
    KL term reads it) equals a twin's that never offloaded."""
    groups = with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=1), tiny_qwen2(), noise=0.5)
    trainer, twin = kl_trainer(), kl_trainer()
    for t in (trainer, twin):
        t.train_step(groups, policy_version=0)
    reference = list(trainer.ref_model.parameters())
    was = [p.detach().clone() for p in reference]
    moments = [v for s in trainer.optimizer.state.values() for v in s.values() if v.dim() > 0]
    reference_bytes, moment_bytes = storage_bytes(reference), storage_bytes(moments)
    assert reference_bytes > 0 and moment_bytes > 0

    offloader = StateOffloader.for_trainer(trainer, OffloadChoice(reference=True))
    allocated = torch.cuda.memory_allocated(DEVICE) if DEVICE.type == "cuda" else 0
    assert offloader.offload() == moment_bytes + reference_bytes
    assert storage_bytes(reference) == 0 and storage_bytes(moments) == 0, "a storage was not freed"
    if DEVICE.type == "cuda":
        assert torch.cuda.memory_allocated(DEVICE) <= allocated - moment_bytes - reference_bytes
    assert offloader.reload(reference=False) == moment_bytes  # a checkpoint's read
    assert storage_bytes(reference) == 0 and storage_bytes(moments) == moment_bytes
    assert offloader.offload() == moment_bytes  # the reference is still in host memory: not moved twice
    assert offloader.reload() == moment_bytes + reference_bytes and offloader.reload() == 0
    for got, want in zip(reference, was, strict=True):
        assert torch.equal(got, want)
    assert offloader.offload() == moment_bytes + reference_bytes and offloader.reload() > 0
    assert (
        offloader.host_memory()["host_allocations"] == 2
    )  # the state's buffer and the reference's, once each

    later = with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=2), tiny_qwen2(), noise=0.5)
    got, want = (t.train_step(later, policy_version=1) for t in (trainer, twin))
    assert got["kl"] != 0 and got["kl"] == want["kl"], (got, want)
    for mine, theirs in zip(trainer.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def test_the_reference_stays_on_the_device_unless_chosen() -> None:
    trainer = kl_trainer()
    offloader = StateOffloader.for_trainer(trainer, OffloadChoice(optimizer=False, master_weights=True))
    reference = list(trainer.ref_model.parameters())
    offloader.offload()
    assert storage_bytes(reference) == sum(p.nbytes for p in reference)
    assert storage_bytes(list(trainer.model.parameters())) == 0
    offloader.reload()
