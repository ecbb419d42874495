"""GPU check of the sharded trainer: one FSDP2 step over NCCL (one rank per GPU) against one process on GPU 0.

Run by scripts/gpu-smoke.sh on up to 4 GPUs; prints the largest relative gradient error and exits non-zero above
1e-4. On one GPU it is one rank: that checks NCCL's process group and FSDP2's wrapping, DTensor parameters and
collectives on CUDA, not sharding across devices. The bound is looser than the CPU test's 1e-5: TF32 and NCCL's
reduction order.
"""

from __future__ import annotations

import sys

import torch

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.models import tiny_qwen2
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.distributed.parallel import FullyShardedParallel, Parallelism, SingleProcess
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Group, Trajectory


def _groups() -> list[Group]:
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


def step(parallel: Parallelism, device: str) -> dict[str, torch.Tensor] | None:
    trainer = Trainer(
        tiny_qwen2().to(device),
        TrainerConfig(lr=1e-3),
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
        parallel=parallel,
    )
    trainer.train_step(_groups(), policy_version=0)
    grads = {}
    for name, param in trainer.model.named_parameters():
        grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
        grads[name] = grad.float().cpu()
    return grads if parallel.rank == 0 else None


def sharded_step() -> dict[str, torch.Tensor] | None:
    return step(FullyShardedParallel("cuda"), f"cuda:{torch.cuda.current_device()}")


def main() -> None:
    world = min(torch.cuda.device_count(), 4)
    sharded = run_ranks(sharded_step, world, device="cuda")[0]
    single = step(SingleProcess(), "cuda:0")
    error = max(
        float((sharded[n] - g).abs().max()) / max(float(g.abs().max()), 1e-12) for n, g in single.items()
    )
    print(f"FSDP2 over NCCL, {world} rank(s): largest relative gradient error {error:.2e}")
    sys.exit(0 if error <= 1e-4 else 1)


if __name__ == "__main__":
    main()
