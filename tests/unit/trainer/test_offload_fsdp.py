"""The trainer's state offload under FSDP2 (two gloo ranks): what it frees is what FSDP2 all-gathers from.

A parameter of a ``fully_shard``-ed module is a DTensor whose local tensor views FSDP2's padded shard buffer
(``FSDPParam._sharded_param_data``), and AdamW's moments are DTensors too. After ``offload`` every one of those
storages holds no bytes (replacing ``param.data``, as the offload once did, freed none of them); the bytes
counted are this rank's local ones (the shard buffers', padding included), never the global sizes; after
``reload`` two more steps equal a twin's that never offloaded, bit for bit. A trainer with a separate critic
(``StateOffloader.for_trainer``) frees the critic's shards and moments as the policy's, and one with a KL term
its frozen reference's shards (sharded as the policy is), which come back bit for bit only for a step. The
host buffers are made at the first offload only and every later round trip is bit-exact.

The round trip runs on the device under test (``ASYNCRL_TEST_DEVICE``): the GPU kit's unit section runs it over
NCCL on up to two GPUs (one rank on one GPU: no padding, local bytes equal global ones), where the host copies
must be pinned and the device allocator must give the offloaded bytes back.
"""

from __future__ import annotations

import pytest
import torch
from trainer_fixtures import random_groups

from asyncrl.config.run import load_run_config
from asyncrl.models.loading import load_configured_skeleton, load_tokenizer, model_dir, save_tiny
from asyncrl.models.tiny import build_tiny_model
from asyncrl.testing.models import device_under_test
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.factory import build_trainer
from asyncrl.trainer.offload import OffloadChoice, StateOffloader

EVERYTHING = OffloadChoice(optimizer=True, master_weights=True)
DEVICE = device_under_test()
WORLD = 2 if DEVICE.type == "cpu" else min(2, torch.cuda.device_count())
TINY = {"hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "num_layers": 2, "vocab_size": 301}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _fsdp_params(module: torch.nn.Module) -> list:
    """Every ``FSDPParam`` of ``module``'s FSDP2 groups (torch internals: the buffers its all-gathers read)."""
    params = []
    for sub in module.modules():
        state = sub._get_fsdp_state() if hasattr(sub, "_get_fsdp_state") else None
        if state is not None and state._fsdp_param_group is not None:
            params.extend(state._fsdp_param_group.fsdp_params)
    return params


def _moments(optimizers: list[torch.optim.Optimizer]) -> list[torch.Tensor]:
    return [v for o in optimizers for s in o.state.values() for v in s.values() if v.dim() > 0]


def _rank_device() -> torch.device:
    return torch.device("cuda", torch.distributed.get_rank()) if DEVICE.type == "cuda" else DEVICE


def _sharded_adamw(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Two linear layers sharded over the ranks, after one AdamW step. ``Linear(8, 1)``'s weight has one row
    for two ranks, so one rank holds only padding of it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)).to(_rank_device())
    mesh = init_device_mesh(DEVICE.type, (torch.distributed.get_world_size(),))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, optimizer)
    return model, optimizer


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    torch.manual_seed(1)
    model(torch.randn(4, 8).to(_rank_device())).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _assert_all_freed(modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
    for module in modules:
        for name, param in module.named_parameters():
            assert hasattr(param, "to_local"), f"{name} is not sharded"
            assert _local(param).untyped_storage().nbytes() == 0, f"{name}: its shard was not freed"
        for fsdp_param in _fsdp_params(module):
            assert fsdp_param._sharded_param_data.untyped_storage().nbytes() == 0, (
                f"{fsdp_param}: all-gather input"
            )
    for moment in _moments(optimizers):
        assert hasattr(moment, "to_local") and _local(moment).untyped_storage().nbytes() == 0


def _offload_round_trip() -> bool:
    model, optimizer = _sharded_adamw(seed=0)
    twin, twin_optimizer = _sharded_adamw(seed=0)

    local_bytes = sum(p._sharded_param_data.untyped_storage().nbytes() for p in _fsdp_params(model))
    local_bytes += sum(_local(m).untyped_storage().nbytes() for m in _moments([optimizer]))
    global_bytes = sum(p.nbytes for p in model.parameters()) + sum(m.nbytes for m in _moments([optimizer]))
    offloader = StateOffloader([model], [optimizer], EVERYTHING)
    allocated = torch.cuda.memory_allocated() if DEVICE.type == "cuda" else 0
    moved = offloader.offload()
    assert moved == local_bytes <= global_bytes, (moved, local_bytes, global_bytes)
    assert local_bytes < global_bytes or WORLD == 1, "counted global sizes"
    _assert_all_freed([model], [optimizer])
    if DEVICE.type == "cuda":
        assert torch.cuda.memory_allocated() <= allocated - moved, "the device kept the offloaded bytes"
        assert all(parked.host.is_pinned() for parked in offloader._parked)
    held = [parked.host.data_ptr() for parked in offloader._parked]
    assert offloader.reload() == moved
    _assert_equal([model], [optimizer], [twin], [twin_optimizer])
    assert offloader.offload() == moved  # the second round trip: into the same host memory
    assert [parked.host.data_ptr() for parked in offloader._parked] == held
    _assert_all_freed([model], [optimizer])
    assert offloader.reload() == moved
    _assert_equal([model], [optimizer], [twin], [twin_optimizer])
    memory = offloader.host_memory()
    assert memory["host_allocations"] == 1 and memory["host_bytes"] >= moved
    assert memory["host_pinned_bytes"] == (memory["host_bytes"] if DEVICE.type == "cuda" else 0)

    for _ in range(2):
        _step(model, optimizer)
        _step(twin, twin_optimizer)
    _assert_equal([model], [optimizer], [twin], [twin_optimizer])
    return True


def _assert_equal(
    modules: list[torch.nn.Module],
    optimizers: list[torch.optim.Optimizer],
    twins: list[torch.nn.Module],
    twin_optimizers: list[torch.optim.Optimizer],
) -> None:
    """Every parameter and moment equal to the twin's, bit for bit (whole tensors: a collective per tensor)."""
    got = [p for m in modules for p in m.parameters()] + _moments(optimizers)
    want = [p for m in twins for p in m.parameters()] + _moments(twin_optimizers)
    assert len(got) == len(want)
    for mine, theirs in zip(got, want, strict=True):
        assert torch.equal(_full(mine), _full(theirs))


def test_offload_frees_the_shards_fsdp_gathers_from_and_two_steps_after_reload_equal_a_twins() -> None:
    assert run_ranks(_offload_round_trip, WORLD, device=DEVICE.type) == [True] * WORLD


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_tiny(build_tiny_model(**TINY), load_tokenizer(""), tmp_path_factory.mktemp("policy")))


def _trainer_with_critic(path: str):
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    overrides = [f"model.path={path}", "model.device=cpu", "model.dtype=float32", "loss.name=ppo"]
    overrides += ["advantage.name=gae", "critic.type=separate", "trainer.lr=1e-3"]
    config = load_run_config(None, overrides)
    model, tokenizer = load_configured_skeleton(config.model)
    parallel = FullyShardedParallel("cpu", weights=model_dir(config.model))
    return build_trainer(config, model.train(), tokenizer, parallel)


def _critic_round_trip(path: str) -> bool:
    trainer, twin = _trainer_with_critic(path), _trainer_with_critic(path)
    for t in (trainer, twin):
        t.train_step(random_groups(num_groups=2, group_size=4, seed=2), policy_version=0)
    offloader = StateOffloader.for_trainer(trainer, EVERYTHING)
    assert offloader.offload() > 0
    _assert_all_freed([trainer.model, trainer.critic.module], [trainer.optimizer, trainer.critic.optimizer])
    offloader.reload()
    for t in (trainer, twin):
        t.train_step(random_groups(num_groups=2, group_size=4, seed=3), policy_version=1)
    for module, twin_module in ((trainer.model, twin.model), (trainer.critic.module, twin.critic.module)):
        for got, want in zip(module.parameters(), twin_module.parameters(), strict=True):
            assert torch.equal(_full(got), _full(want))
    return True


def test_a_separate_critic_is_freed_and_reloaded_with_the_policy(policy_dir: str) -> None:
    assert run_ranks(_critic_round_trip, 2, policy_dir) == [True, True]


def _kl_trainer(path: str):
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    overrides = [f"model.path={path}", "model.device=cpu", "model.dtype=float32", "loss.name=ppo"]
    overrides += ["loss.kl.beta=0.1", "trainer.lr=1e-2"]
    config = load_run_config(None, overrides)
    model, tokenizer = load_configured_skeleton(config.model)
    parallel = FullyShardedParallel("cpu", weights=model_dir(config.model))
    return build_trainer(config, model.train(), tokenizer, parallel)


def _shard_bytes(module: torch.nn.Module) -> int:
    """This rank's bytes of FSDP2's shard buffers of ``module`` (the all-gather inputs, padding included)."""
    return sum(p._sharded_param_data.untyped_storage().nbytes() for p in _fsdp_params(module))


def _reference_round_trip(path: str) -> bool:
    trainer, twin = _kl_trainer(path), _kl_trainer(path)
    for t in (trainer, twin):
        t.train_step(random_groups(num_groups=2, group_size=4, seed=2), policy_version=0)
    reference = trainer.reference  # the log-prob module FSDP2 sharded: its root holds embeddings and head
    held = _shard_bytes(reference)
    moments = sum(_local(m).untyped_storage().nbytes() for m in _moments([trainer.optimizer]))
    was = [_full(p).clone() for p in reference.parameters()]
    offloader = StateOffloader.for_trainer(trainer, OffloadChoice(reference=True))
    assert offloader.offload() == held + moments and held > 0
    _assert_all_freed([reference], [trainer.optimizer])
    assert offloader.reload(reference=False) == moments  # a checkpoint's read: the reference stays offloaded
    assert _shard_bytes(reference) == 0
    assert offloader.offload() == moments and offloader.reload() == held + moments
    assert _shard_bytes(reference) == held
    assert offloader.host_memory()["host_allocations"] == 2  # the state's buffer, the reference's: once each
    for got, want in zip(reference.parameters(), was, strict=True):
        assert torch.equal(_full(got), want)
    for t in (trainer, twin):
        t.train_step(random_groups(num_groups=2, group_size=4, seed=3), policy_version=1)
    for got, want in zip(trainer.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.equal(_full(got), _full(want))
    return True


def test_a_sharded_reference_is_freed_with_the_state_and_comes_back_bit_for_bit_for_the_step(policy_dir: str):
    assert run_ranks(_reference_round_trip, 2, policy_dir) == [True, True]
