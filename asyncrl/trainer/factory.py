"""The trainer a run's config describes, built the same way by every runtime (inline, each Ray rank).

Key decision: one place decides which extra models a run's trainer holds — a frozen reference copy when the
loss reads reference log-probs, a critic when the advantage is GAE (a copy of the policy's body, or the body of
``critic.model_path``) — so the runtimes cannot drift apart on it. A ``critic.model_path`` body is resolved at
``critic.revision`` (its own repository's; the policy's ``model.revision`` names a commit of another repository,
or none for a folder) and loaded as the policy was: whole, or (a sharded trainer's policy on the meta device) as
a skeleton whose shards each rank reads from that checkpoint's files.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from asyncrl.config.engine import serving_dtype
from asyncrl.config.run import RunConfig
from asyncrl.models.loading import (
    critic_model_dir,
    load_decoder_body,
    load_decoder_skeleton,
    resolve_device,
)
from asyncrl.trainer.distributed.parallel import Parallelism
from asyncrl.trainer.distributed.sharded_load import has_meta_parameters
from asyncrl.trainer.trainer import Trainer, needs_reference_copy


def build_trainer(
    config: RunConfig, model: nn.Module, tokenizer: Any, parallel: Parallelism | None = None
) -> Trainer:
    """The run's trainer over ``model`` (the policy, also the reference's and a default critic's source), with
    the run's ``deterministic`` switch, publishing its weights in the engines' dtype (``engine.dtype``)."""
    ref_model = copy.deepcopy(model) if needs_reference_copy(config.loss, config.trainer) else None
    critic = config.critic
    critic_body, critic_weights = None, None
    if critic is not None and critic.model_path is not None:
        directory = critic_model_dir(critic, local_files_only=config.model.local_files_only)
        if has_meta_parameters(model):
            critic_body, critic_weights = load_decoder_skeleton(directory, config.model), directory
        else:
            critic_body = load_decoder_body(directory, config.model)
    return Trainer(
        model,
        config.trainer,
        config.loss,
        config.advantage,
        ref_model,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        parallel=parallel,
        critic=critic,
        critic_body=critic_body,
        critic_weights=critic_weights,
        recompute_behaviour=config.deterministic,
        serving_dtype=serving_dtype(
            config.engine.dtype, config.model.dtype, resolve_device(config.model.device).type
        ),
    )
