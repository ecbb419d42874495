"""GPU check of the sharded trainer: one FSDP2 step over NCCL (one rank per GPU) against one process on GPU 0.

Run by scripts/gpu-smoke.sh on up to 4 GPUs; prints the largest relative gradient error and exits non-zero above
its bound (``VARIANTS``): float32, bf16 mixed precision, activation checkpointing and PPO with a separate or a
shared-trunk critic, each against one float32 process. On one GPU it is one rank: that checks NCCL's process
group and FSDP2's wrapping, DTensor parameters and collectives on CUDA, not sharding across devices.
"""

from __future__ import annotations

import sys

import torch

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.critic import CriticConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.gradients import stepped_gradients
from asyncrl.testing.models import tiny_qwen2
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.distributed.parallel import FullyShardedParallel, Parallelism, SingleProcess
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Group, Trajectory


def check_groups() -> list[Group]:
    """Two groups of four 14-token trajectories with mixed rewards: the batch every GPU check trains on."""
    groups = []
    for g in range(2):
        trajectories = []
        for i in range(4):
            tokens = [(7 * g + 11 * i + k) % 300 for k in range(14)]
            prompt = 2 + 3 * i
            trajectories.append(
                Trajectory(
                    prompt_uid=f"g{g}",
                    sample_index=i,
                    token_ids=tokens,
                    loss_mask=[0] * prompt + [1] * (14 - prompt),
                    logprobs=[0.0] * prompt + [-1.0] * (14 - prompt),
                    versions=[-1] * prompt + [0] * (14 - prompt),
                    start_version=0,
                    num_prompt_tokens=prompt,
                    reward=float((i + g) % 2),
                )
            )
        groups.append(Group(prompt_uid=f"g{g}", trajectories=trajectories))
    return groups


VARIANTS = {
    # name: (FSDP2 mixed precision, trainer config, critic type, largest relative gradient error against float32)
    "float32": (False, {}, None, 1e-4),
    "bf16 mixed precision": (True, {}, None, 5e-2),
    "activation checkpointing": (False, {"activation_checkpointing": True}, None, 1e-4),
    "separate critic": (False, {}, "separate", 1e-4),
    "shared-trunk critic": (False, {}, "shared_trunk", 1e-4),
}
"""The bf16 bound is bfloat16's own precision (8 bits of mantissa) over a few layers; the others are TF32 and
NCCL's reduction order, looser than the CPU test's 1e-5. The critic variants (PPO with GAE) compare the
critic's gradients too, against one float32 process with the same critic."""


def step(
    parallel: Parallelism, device: str, config: dict, critic: str | None
) -> dict[str, torch.Tensor] | None:
    trainer = Trainer(
        tiny_qwen2().to(device),
        TrainerConfig(lr=1e-3, **config),
        LossConfig(name="ppo"),
        AdvantageConfig(name="gae" if critic else "grpo"),
        parallel=parallel,
        critic=CriticConfig(type=critic) if critic else None,
    )
    if critic is not None:  # a non-zero head (the same on every rank), so the critic's body has a gradient
        head = trainer.critic.module if critic == "shared_trunk" else trainer.critic.module.head
        with torch.no_grad():
            full = torch.randn(tuple(head.weight.shape), generator=torch.Generator().manual_seed(0)) * 0.1
            if hasattr(head.weight, "full_tensor"):
                from torch.distributed.tensor import distribute_tensor

                full = distribute_tensor(full.to(device), head.weight.device_mesh, head.weight.placements)
            head.weight.copy_(full)
    with stepped_gradients(trainer, gathered) as stepped:  # read on every rank: gathering is a collective
        trainer.train_step(check_groups(), policy_version=0)
    return stepped[-1] if parallel.rank == 0 else None


def gathered(grad: torch.Tensor) -> torch.Tensor:
    """A full gradient on the CPU: a sharded (DTensor) gradient is gathered first."""
    full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return full.float().cpu()


def relative_error(single: dict[str, torch.Tensor], sharded: dict[str, torch.Tensor]) -> float:
    """The largest gradient difference, relative to the largest gradient of the same parameter."""
    return max(
        float((sharded[n] - g).abs().max()) / max(float(g.abs().max()), 1e-12) for n, g in single.items()
    )


def sharded_step(variant: str) -> dict[str, torch.Tensor] | None:
    mixed_precision, config, critic, _ = VARIANTS[variant]
    parallel = FullyShardedParallel("cuda", mixed_precision=mixed_precision)
    return step(parallel, f"cuda:{torch.cuda.current_device()}", config, critic)


def main() -> None:
    world = min(torch.cuda.device_count(), 4)
    singles: dict[str | None, dict[str, torch.Tensor]] = {}
    failed = False
    for variant, (_, _, critic, bound) in VARIANTS.items():
        if critic not in singles:
            singles[critic] = step(SingleProcess(), "cuda:0", {}, critic)
        single = singles[critic]
        sharded = run_ranks(sharded_step, world, variant, device="cuda")[0]
        error = relative_error(single, sharded)
        print(
            f"FSDP2 over NCCL, {world} rank(s), {variant}: largest relative gradient error {error:.2e} "
            f"(bound {bound:.0e})"
        )
        failed |= not error <= bound
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
