"""No-grad passes leave FSDP2 modules sharded: the reference model's and the policy's step-start forwards.

FSDP2 reshards the root (embeddings, final norm, output layer) only after a backward. A frozen reference runs
no-grad only, so without an explicit reshard it held its root whole on every rank for the whole run, and the
policy held it from the step-start pass until its first backward. Two gloo ranks; the tiny model's 300-row
embedding (tied to the output layer) must be a DTensor whose local storage is this rank's 150 rows.
"""

from __future__ import annotations

import copy

from trainer_fixtures import VOCAB, random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, DecoupledPPOParams, KLConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.trainer import Trainer

WORLD = 2


def _unsharded(module) -> list[str]:
    """Names of ``module``'s parameters registered whole (not as this rank's shard of a DTensor)."""
    from torch.distributed.tensor import DTensor

    whole = []
    for name, param in module.named_parameters():
        if not isinstance(param, DTensor):
            whole.append(f"{name} {tuple(param.shape)}")
        elif param.shape[0] >= WORLD and param.to_local().shape[0] == param.shape[0]:
            whole.append(f"{name} local {tuple(param.to_local().shape)}")
    return whole


def _states() -> dict[str, list[str]]:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    model = tiny_qwen2()
    loss = LossConfig(
        name="decoupled_ppo",  # recompute: the policy's step-start no-grad pass
        decoupled_ppo=DecoupledPPOParams(proximal="recompute"),
        kl=KLConfig(beta=0.1, estimator="k3"),  # a frozen reference copy
    )
    trainer = Trainer(
        model,
        TrainerConfig(lr=1e-3),
        loss,
        AdvantageConfig(name="grpo"),
        copy.deepcopy(model),
        parallel=FullyShardedParallel("cpu"),
    )
    groups = with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=1), tiny_qwen2(), noise=0.5)
    embedding = trainer.model.model.embed_tokens.weight
    assert embedding.shape[0] == VOCAB and embedding.to_local().shape[0] == VOCAB // WORLD
    trainer._step_start_logprobs(trainer.make_batch(groups))  # the step-start passes alone
    states = {"policy after its no-grad pass": _unsharded(trainer.policy)}
    states["reference after its no-grad pass"] = _unsharded(trainer.reference)
    trainer.train_step(groups, policy_version=0)
    states["policy after train_step"] = _unsharded(trainer.policy)
    states["reference after train_step"] = _unsharded(trainer.reference)
    return states


def test_no_grad_passes_leave_every_parameter_sharded():
    for rank, states in enumerate(run_ranks(_states, WORLD)):
        for when, whole in states.items():
            assert not whole, f"rank {rank}, {when}: parameters held whole: {whole}"
