"""An upper bound on one checkpoint's bytes, from the model's parameters: what a checkpoint's deadline scales with.

Key decision: the bound is taken from the model itself (its parameters, real or on the meta device), when a
trainer rank starts and before its process group forms, because the group's collective timeout has to cover
a checkpoint (``runtime.trainer_group``) and is fixed when the group is created. It counts what the larger
(sharded) format writes, so one number serves both formats:

- the weights in the master dtype, with a tied output layer twice (DCP saves it under both names);
- AdamW's two moments of every weight, in the master dtype (the trainer's optimizer);
- the Hugging Face export (``model/``) in the serving dtype, every parameter once;
- a critic's weights and two moments: a separate body at its own shape (``critic.model_path``, read as a
  skeleton) or a copy of the policy; a shared trunk's value head (a few KB) is left out.

With LoRA the whole model is counted all the same: the real checkpoint is far smaller, so the deadline is only
longer, never shorter. ``app.memory_plan.checkpoint_bytes`` plans the same files part by part for the disk
check, from a model shape rather than a model.
"""

from __future__ import annotations

import torch
from torch import nn

from asyncrl.config.engine import serving_dtype
from asyncrl.config.run import RunConfig
from asyncrl.models.loading import critic_model_dir, load_decoder_skeleton, resolve_device


def checkpoint_bytes(config: RunConfig, model: nn.Module) -> int:
    """An upper bound on the bytes one checkpoint of a trainer over ``model`` (the policy) writes."""
    saved = _weight_bytes(model, each_name=True)
    master = _weight_bytes(model)
    served = getattr(torch, serving_dtype(config.engine.dtype, config.model.dtype, _device_type(config)))
    export = sum(p.numel() for p in model.parameters()) * served.itemsize
    return saved + 2 * master + export + 3 * _critic_weight_bytes(config, master)


def _weight_bytes(model: nn.Module, *, each_name: bool = False) -> int:
    """Bytes of ``model``'s parameters as they are held; a tied one once, or under each of its names."""
    named = model.named_parameters(remove_duplicate=not each_name)
    return sum(p.numel() * p.element_size() for _, p in named)


def _critic_weight_bytes(config: RunConfig, policy_bytes: int) -> int:
    """A separate critic's weight bytes: its own body's (a meta skeleton: no bytes read), or the policy's when
    it is a copy of it; 0 without a critic or with a shared trunk's value head."""
    critic = config.critic
    if critic is None or critic.type == "shared_trunk":
        return 0
    if critic.model_path is None:
        return policy_bytes
    directory = critic_model_dir(critic, local_files_only=config.model.local_files_only)
    return _weight_bytes(load_decoder_skeleton(directory, config.model))


def _device_type(config: RunConfig) -> str:
    return resolve_device(config.model.device).type
