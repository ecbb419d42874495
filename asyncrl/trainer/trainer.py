"""The trainer: one ``train_step`` turns groups of trajectories into PPO-style optimizer steps.

    groups ─► advantages [B] ─► TrainBatch ─► step-start log-probs (no grad: proximal / train-behaviour / ref,
    only those the loss config needs) ─► for each PPO epoch, for each mini-batch:
        micro-batches by token budget ─► forward + registered loss ─► backward (accumulate) ─► clip ─► AdamW step
        (skipped, weights unchanged, when the global gradient norm is not finite)
    ─► scheduler step ─► version + 1

Key decisions: the trainer never branches on the loss name, only on which inputs the loss config says it needs
(``LossConfig.needs_*``). Gradient accumulation weights each micro-batch's loss by its share of the mini-batch's
aggregation denominator (its mask count for token-mean, its counted sequences for the sequence means), so the
accumulated gradient equals the gradient of the whole mini-batch's loss. Dropout stays off (eval mode), so the
recomputed step-start log-probs equal the first forward's exactly and π_θ/π_prox starts at 1.

Data parallelism is the same code (``distributed.parallel``): every rank builds the whole batch (so advantages
see whole groups), takes its share of each mini-batch's rows, dealt so every rank computes about as many tokens
(``distributed.row_split``), and weighs its micro-batches by their share of the *global* denominator, agreed
before any backward (``distributed.normalisation``); ranks agree on the number of passes so FSDP2's collectives
line up. One process is the world of size 1.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.critic import CriticConfig, check_critic
from asyncrl.config.trainer import TrainerConfig
from asyncrl.models.loading import state_dict_for_sync
from asyncrl.trainer.activation_checkpointing import enable_activation_checkpointing
from asyncrl.trainer.advantages import compute_advantages
from asyncrl.trainer.batching import (
    build_train_batch,
    flatten_groups,
    plan_micro_batches,
    plan_mini_batches,
    select_rows,
    sequence_lengths,
)
from asyncrl.trainer.critic import Critic, head_for, make_critic, separate_value_model
from asyncrl.trainer.distributed.normalisation import (
    GlobalDenominator,
    combine,
    global_accumulation_weight,
    local_denominator,
)
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess, agreed_count
from asyncrl.trainer.distributed.row_split import RowSplit, balanced_split
from asyncrl.trainer.distributed.sharded_load import has_meta_parameters
from asyncrl.trainer.gae import gae_targets
from asyncrl.trainer.logprobs import TokenLogProbModule, TokenLogProbs, autocast
from asyncrl.trainer.lora import (
    adapter_dropout,
    adapter_spec,
    adapter_tensors,
    attach_lora,
    seeded_dropout,
)
from asyncrl.trainer.losses import PolicyLossInputs, compute_policy_loss
from asyncrl.trainer.losses.value import value_loss
from asyncrl.trainer.metric_merger import MetricMerger
from asyncrl.trainer.mismatch import METRIC_PREFIXES as CORRECTION_METRICS
from asyncrl.trainer.mismatch import compute_step_start_correction
from asyncrl.trainer.offpolicy import m2po_keep
from asyncrl.trainer.optim import (
    NonFiniteGradientError,
    build_optimizer,
    build_scheduler,
    clip_gradients,
)
from asyncrl.types import Group, TrainBatch
from asyncrl.weight_sync.buckets import ServingCasts
from asyncrl.weight_sync.protocol import LoraAdapter

logger = logging.getLogger(__name__)

_AGGREGATION_MASK = "aggregation_mask"
"""Key of the step tensor holding the mask the loss aggregates over (not a loss input)."""
_OLD_VALUES = "old_values"
"""Key of the critic's step-start values [B, T] (GAE's V and the value clip's centre)."""
_RETURNS = "returns"
"""Key of GAE's returns [B, T], the value loss's target."""
_NOT_LOSS_INPUTS = (_AGGREGATION_MASK, _OLD_VALUES, _RETURNS)
_AGGREGATED_LOSSES = ("policy_loss", "critic/value_loss")
"""Metrics that are a micro-batch's aggregated loss: reported like ``loss``, each micro-batch's value times its
accumulation weight, summed, so they are the mini-batch's loss whatever the split (a token-weighted mean of
micro-batch aggregates is not, under the sequence-mean aggregations)."""
_TRAINED_TOKEN_METRICS = ("entropy", "opsm/", "m2po/")
"""Metrics that are a mean over a micro-batch's trained tokens (its loss mask): merged over micro-batches
weighted by those. Every other loss metric is a mean over the tokens the loss counts (the aggregation mask:
less what mismatch correction or K3 rejection drop), merged weighted by those, so that either merge is the
mini-batch's own mean whichever rank and micro-batch each row lands in."""


def needs_reference_copy(loss_config: LossConfig, config: TrainerConfig) -> bool:
    """Whether the trainer needs a second copy of the model as its reference: for a KL penalty without LoRA
    (with LoRA the reference is the base with the adapters off)."""
    return loss_config.needs_reference and config.lora is None


class Trainer:
    """Owns the policy model's optimisation: optimizer, schedule, step counter and policy version.

    ``version`` is the policy version of the current weights; ``train_step(groups, version)`` trains them and
    moves to ``version + 1``. ``step`` counts train steps (the schedule's clock).
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainerConfig,
        loss_config: LossConfig,
        advantage_config: AdvantageConfig,
        ref_model: nn.Module | None = None,
        *,
        pad_token_id: int = 0,
        version: int = 0,
        parallel: Parallelism | None = None,
        critic: CriticConfig | None = None,
        critic_body: nn.Module | None = None,
        critic_weights: Path | None = None,
        recompute_behaviour: bool = False,
        serving_dtype: str | None = None,
    ) -> None:
        self.serving_dtype = serving_dtype
        """The engines' dtype (``engine.dtype`` resolved): ``sync_tensors`` casts to it once, on this trainer's
        device, so every transport ships it; None: the master dtype as it is."""
        _check_parts(config, loss_config, advantage_config, ref_model, critic, critic_body, critic_weights)
        # A separate critic copies the policy's body first: before LoRA wraps it (the critic trains full
        # weights) and before FSDP2 shards it (a sharded module cannot be copied).
        value_model = None
        if critic is not None and critic.type == "separate":
            value_model = separate_value_model(model, critic_body, self._packed_rows(config))
        self.peft_model = attach_lora(model, config.lora, config.seed) if config.lora is not None else None
        """The ``PeftModel`` wrapper with LoRA (``trainer.lora``); ``model`` is then the model inside it."""
        if self.peft_model is not None:
            model = self.peft_model.get_base_model()
        self.model = model.eval()
        self.config = config
        self.loss_config = loss_config
        self.advantage_config = advantage_config
        self.ref_model = ref_model.eval().requires_grad_(False) if ref_model is not None else None
        self.pad_token_id = pad_token_id
        self.parallel = parallel or SingleProcess()
        self.recompute_behaviour = recompute_behaviour
        """The run's ``deterministic`` switch: tokens generated by the current weights get the trainer's own
        step-start log-probs as behaviour log-probs (``own_behaviour``), not the engine's."""
        if config.activation_checkpointing:
            enable_activation_checkpointing(model)
        shared_head = head_for(model) if critic is not None and critic.type == "shared_trunk" else None
        self.policy = self._log_prob_module(model, shared_head)
        self.reference = self._reference_module(loss_config)
        self.optimizer = build_optimizer(model, config)  # after sharding: the optimizer holds the shards
        self.scheduler = build_scheduler(self.optimizer, config)
        self.critic = (
            self._make_critic(critic, shared_head, value_model, critic_weights)
            if critic is not None
            else None
        )
        self._init_progress(version)

    def _init_progress(self, version: int) -> None:
        """Where training stands, moved on by each train step: the step (the schedule's clock), the policy
        version, the updates skipped for a non-finite gradient, the last step's split over ranks and the
        checkpoint that holds this state."""
        self.step = 0
        self.version = version
        self.skipped_in_a_row = 0
        """Optimizer updates skipped in a row for a non-finite gradient norm (``_skip_update``); checkpointed,
        so a resumed run fails at the same update as the uninterrupted one."""
        self._skipped_this_step = 0
        self.split_metrics: dict[str, float] = {}
        """How evenly the last step's mini-batches were dealt over ranks (``_split_metrics``); empty in one
        process. Kept apart from ``train_step``'s metrics, which are the step's numbers and the same for any
        split of its rows (the sharded tests hold them to the single process's); the rank actor reports both."""
        self.saved_in: Path | None = None
        """The checkpoint directory that holds this trainer's state as it is now: set by a save or a load
        (``trainer.checkpoint``), cleared by a train step. A save of that step again rewrites only its
        ``extra`` (``checkpoint.relink_saved``)."""

    def _reference_module(self, loss_config: LossConfig) -> TokenLogProbModule | None:
        """π_ref's log-prob module: the separate reference model, or with LoRA the policy's own module (run with
        the adapters off, see ``_reference_mode``); None when nothing needs it."""
        if self.ref_model is not None:
            return self._log_prob_module(self.ref_model)
        if self.peft_model is not None and loss_config.needs_reference:
            return self.policy
        return None

    def _reference_mode(self) -> contextlib.AbstractContextManager:
        """What ``reference`` runs under: with LoRA the adapters switched off (the frozen base is π_ref)."""
        return self.peft_model.disable_adapter() if self.peft_model is not None else contextlib.nullcontext()

    def _gradient_mode(self) -> contextlib.AbstractContextManager:
        """What a gradient forward and its backward run under: LoRA's adapter dropout on, if it has one."""
        return adapter_dropout(self.model) if self.peft_model is not None else contextlib.nullcontext()

    def _dropout_rng(self) -> contextlib.AbstractContextManager:
        """LoRA's adapter dropout draws from a generator seeded by (seed, step, rank) (``seeded_dropout``)."""
        lora = self.config.lora
        if lora is None or lora.dropout == 0:
            return contextlib.nullcontext()
        return seeded_dropout([self.config.seed, self.step, self.parallel.rank], self.device)

    def _log_prob_module(self, model: nn.Module, value_head: nn.Module | None = None) -> TokenLogProbModule:
        config = self.config
        module = TokenLogProbModule(
            model,
            chunk_size=config.logprob_chunk_size,
            temperature=config.temperature,
            packed_row_tokens=self._packed_row_tokens,
            value_head=value_head,
        )
        self.parallel.shard(module)
        return module

    @property
    def _packed_row_tokens(self) -> int | None:
        return self._packed_rows(self.config)

    @staticmethod
    def _packed_rows(config: TrainerConfig) -> int | None:
        return config.packed_row_tokens if config.sequence_packing else None

    def _make_critic(
        self,
        config: CriticConfig,
        shared_head: nn.Module | None,
        value_model: nn.Module | None,
        weights: Path | None,
    ) -> Critic:
        """The shared head (already sharded inside ``self.policy``), or the separate value model, sharded here
        (a body on the meta device reads its shards from ``weights``, else from the policy's files)."""
        if shared_head is not None:
            return make_critic(config, shared_head, self.config)
        assert value_model is not None
        if self.config.activation_checkpointing:
            enable_activation_checkpointing(value_model.body)
        self.parallel.shard(value_model, weights)
        return make_critic(config, value_model, self.config)

    @property
    def trains_policy(self) -> bool:
        """False during the critic's warm-up steps, when only the critic learns."""
        return self.critic is None or self.step >= self.critic.config.warmup_steps

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def train_step(self, groups: Sequence[Group], policy_version: int) -> dict[str, float]:
        """Train on ``groups`` (generated up to ``policy_version``, the current weights) and return metrics."""
        if policy_version != self.version:
            raise ValueError(
                f"train_step got policy_version {policy_version}, but the trainer is at {self.version}"
            )
        started = time.perf_counter()
        self.saved_in = None  # from here on the state differs from any checkpoint's
        lr = self.scheduler.get_last_lr()[0] if self.trains_policy else 0.0  # the rate this step trains at
        critic_lr = self.critic.scheduler.get_last_lr()[0] if self.critic is not None else None
        batch = self.make_batch(groups)
        plans = [
            plan_mini_batches(batch.num_samples, self.config.num_mini_batches, self._shuffle(epoch))
            for epoch in range(self.config.ppo_epochs)
        ]
        policy = self._step_start_policy(batch)
        if self.recompute_behaviour:
            assert policy is not None
            batch = replace(batch, behaviour_logprobs=own_behaviour(batch, policy["logprobs"], self.version))
        fixed, start_metrics = self._step_start_logprobs(batch, policy)
        fixed[_AGGREGATION_MASK], correction_metrics = self._aggregation_mask(batch, fixed)
        start_metrics |= correction_metrics
        if self.critic is not None:
            batch, start_metrics = self._with_gae(batch, fixed, start_metrics)
        metrics = MetricMerger()
        self._skipped_this_step = 0
        splits = [self._split(batch, rows) for plan in plans for rows in plan]
        with self._dropout_rng():
            for split in splits:
                metrics.add(self._optimizer_step(batch, fixed, split), weight=1.0)
        self.split_metrics = self._split_metrics(splits)
        if self.trains_policy:  # the policy's schedule counts its own steps: it starts after a critic warm-up
            self.scheduler.step()
        if self.critic is not None:
            self.critic.scheduler.step()
        self.step += 1
        self.version = policy_version + 1
        elapsed = time.perf_counter() - started
        skipped = {"skipped_updates": float(self._skipped_this_step)}
        step_metrics = self._step_metrics(batch, lr, critic_lr, elapsed)
        return {**metrics.result(), **start_metrics, **skipped, **step_metrics}

    def make_batch(self, groups: Sequence[Group]) -> TrainBatch:
        """Advantages of ``groups``' rewards and the padded batch, on the model's device (GAE's advantages are
        0 here: they need the critic's values, computed at step start)."""
        trajectories, group_ids = flatten_groups(groups)
        if self.critic is not None:
            advantages_b = torch.zeros(len(trajectories))
        else:
            rewards_b = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
            advantages_b = compute_advantages(
                self.advantage_config.name, rewards_b, torch.tensor(group_ids), self.advantage_config
            )
        batch = build_train_batch(groups, advantages_b, pad_token_id=self.pad_token_id)
        return batch.to(self.device)

    def _with_gae(
        self, batch: TrainBatch, fixed: dict[str, torch.Tensor], metrics: dict[str, float]
    ) -> tuple[TrainBatch, dict[str, float]]:
        """The batch with GAE advantages from the step-start values (in ``fixed``, where the returns the value
        loss regresses on are put too), and the critic's step-start metrics added."""
        targets = gae_targets(batch.token_rewards, fixed[_OLD_VALUES], batch.loss_mask, self.advantage_config)
        fixed[_RETURNS] = targets.returns
        return replace(batch, advantages=targets.advantages), {**metrics, **targets.metrics}

    def _split(self, batch: TrainBatch, rows: list[int]) -> RowSplit:
        """``rows`` dealt over the ranks by the tokens their micro-batches will compute (``row_split``): the
        same on every rank, from the lengths every rank holds."""
        lengths = batch.attention_mask[rows].sum(dim=1).tolist()
        return balanced_split(
            rows,
            lengths,
            self.parallel.world_size,
            self.config.max_tokens_per_microbatch,
            packed=self.config.sequence_packing,
        )

    def _split_metrics(self, splits: list[RowSplit]) -> dict[str, float]:
        """``rank_token_imbalance``: the largest rank's planned tokens over the ranks' mean, averaged over the
        step's mini-batches (1.0 is even; every rank waits for the largest). Nothing in one process."""
        if self.parallel.world_size == 1:
            return {}
        return {"rank_token_imbalance": sum(s.imbalance for s in splits) / len(splits)}

    def _step_metrics(
        self, batch: TrainBatch, lr: float, critic_lr: float | None, elapsed: float
    ) -> dict[str, float]:
        num_tokens = float(batch.attention_mask.sum())
        critic = self.critic
        critic_metrics = (
            {}
            if critic is None or critic_lr is None
            else {
                "critic/lr": critic_lr,
                "critic/warmup": float(self.step <= critic.config.warmup_steps),  # the step just trained
            }
        )
        return {
            **critic_metrics,
            "lr": lr,
            "num_samples": float(batch.num_samples),
            "num_tokens": num_tokens,
            "num_trained_tokens": float(batch.loss_mask.sum()),
            "train_time_s": elapsed,
            "train_tokens_per_s": num_tokens * self.config.ppo_epochs / max(elapsed, 1e-9),
            "version": float(self.version),
        }

    @property
    def adapter(self) -> LoraAdapter | None:
        """What makes this trainer's weight updates adapter-only (LoRA); None: they are full updates."""
        return adapter_spec(self.model) if self.peft_model is not None else None

    def sync_tensors(self) -> dict[str, torch.Tensor]:
        """What an engine needs to serve the current weights, as detached views (DTensors under FSDP2): the
        adapter pairs with LoRA (``trainer.lora.adapter_tensors``), else every weight with the output layer
        named explicitly (``models.loading.state_dict_for_sync``). In ``serving_dtype`` when set: cast here, once,
        where the weights live (each rank casts its shards, so a sharded gather moves serving-dtype bytes), every
        cast held at once: ``serving_tensors`` is the same without holding them."""
        return dict(self.serving_tensors())

    def serving_tensors(self) -> Mapping[str, torch.Tensor] | ServingCasts:
        """``sync_tensors`` for a transport that takes them one at a time: with ``serving_dtype``, casts made
        only as they are read (``weight_sync.buckets.ServingCasts``: a publication then holds the served model
        once, the transport's copy, not a dict of casts beside it); without, the views themselves."""
        named = (
            adapter_tensors(self.model) if self.peft_model is not None else state_dict_for_sync(self.model)
        )
        if self.serving_dtype is None:
            return named
        return ServingCasts(named, self.serving_dtype)

    def state_for_sync(self) -> dict[str, torch.Tensor]:
        """A snapshot (copies) of ``sync_tensors``, which the next step cannot change."""
        return {name: tensor.clone() for name, tensor in self.sync_tensors().items()}

    def state_dict(self) -> dict:
        """Everything but the model weights needed to resume training exactly (see checkpoint.py)."""
        critic = {} if self.critic is None else {"critic": self.critic.state_dict()}
        return {
            **critic,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "version": self.version,
            "skipped_in_a_row": self.skipped_in_a_row,
        }

    def load_state_dict(self, state: dict) -> None:
        if ("critic" in state) != (self.critic is not None):
            raise ValueError(
                "checkpoint and run disagree on the critic: the checkpoint "
                f"{'has' if 'critic' in state else 'has no'} critic state, the run "
                f"{'has a critic section' if self.critic is not None else 'has none'}"
            )
        self.saved_in = None  # the caller (``checkpoint.load_checkpoint``) names where it loaded from
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.step = int(state["step"])
        self.version = int(state["version"])
        self.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))  # absent from older checkpoints

    def _shuffle(self, epoch: int) -> torch.Generator | None:
        """Mini-batch shuffling seeded by (seed, step, epoch): resumes reproduce it without saved RNG state."""
        if not self.config.shuffle_mini_batches or self.config.num_mini_batches == 1:
            return None
        seed = np.random.SeedSequence([self.config.seed, self.step, epoch]).generate_state(1)[0]
        return torch.Generator().manual_seed(int(seed))

    def _step_start_policy(self, batch: TrainBatch) -> dict[str, torch.Tensor] | None:
        """The policy's no-grad outputs [B, T] at step start (log-probs, and a shared value head's values), for
        every row of the step (each rank computes its share, then all are exchanged), or None when nothing of
        the step reads them. One forward serves all: at step start the proximal policy is the trainer's
        behaviour recompute (and ``recompute_behaviour``'s), and a value head on the policy's trunk reads the
        same hidden states."""
        loss_config = self.loss_config
        shared = self.critic is not None and self.critic.shared
        needed = loss_config.needs_proximal_forward or loss_config.needs_train_behaviour or shared
        if not (needed or self.recompute_behaviour):
            return None
        names = ("logprobs", "values") if shared else ("logprobs",)
        return self._no_grad_outputs(self.policy, batch, names)

    def _step_start_logprobs(
        self, batch: TrainBatch, policy: dict[str, torch.Tensor] | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The no-grad [B, T] inputs the loss config asks for, from the weights at step start (``policy``: the
        policy's outputs, ``_step_start_policy``, run here when not given): batch-wide statistics, M2PO's mask
        among them, need every row; and the metrics of what they decided."""
        if policy is None:
            policy = self._step_start_policy(batch)
        fixed: dict[str, torch.Tensor] = {}
        metrics: dict[str, float] = {}
        loss_config = self.loss_config
        shared = self.critic is not None and self.critic.shared
        if policy is not None:
            if loss_config.needs_proximal_forward:
                fixed["proximal_logprobs"] = policy["logprobs"]
            if loss_config.needs_train_behaviour:
                fixed["train_behaviour_logprobs"] = policy["logprobs"]
            if shared:
                fixed[_OLD_VALUES] = policy["values"]
        if self.critic is not None and not shared:
            fixed[_OLD_VALUES] = self._no_grad_outputs(self.critic.module, batch, ("values",))["values"]
        if self.reference is not None:
            with self._reference_mode():
                fixed["ref_logprobs"] = self._logprobs_no_grad(self.reference, batch)
        if loss_config.m2po is not None:
            log_ratio = fixed["train_behaviour_logprobs"] - batch.behaviour_logprobs
            fixed["m2po_mask"], metrics["m2po/second_moment"] = m2po_keep(
                log_ratio, batch.loss_mask, loss_config.m2po.threshold
            )
        return fixed, metrics

    def _aggregation_mask(
        self, batch: TrainBatch, fixed: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The mask the loss aggregates over: the loss mask, less what mismatch correction and K3 rejection
        drop; and the correction's metrics over the whole batch.

        The correction is computed per row from step-start tensors, so it is the same whichever micro-batch a
        row lands in; accumulation weights use it so that dropped tokens leave every denominator. Its metrics
        are the batch's here: the loss reports them per micro-batch too, where quantiles and per-sequence
        shares cannot be merged into the batch's (``_accumulate`` drops those).
        """
        if not self.loss_config.replaces_behaviour:
            return batch.loss_mask, {}
        correction = compute_step_start_correction(
            fixed["train_behaviour_logprobs"], batch.behaviour_logprobs, batch.loss_mask, self.loss_config
        )
        return batch.loss_mask * correction.mask, dict(correction.metrics)

    def _logprobs_no_grad(self, module: nn.Module, batch: TrainBatch) -> torch.Tensor:
        """``module``'s log-probs [B, T] of every row (``_no_grad_outputs``)."""
        return self._no_grad_outputs(module, batch, ("logprobs",))["logprobs"]

    @torch.no_grad()
    def _no_grad_outputs(
        self, module: nn.Module, batch: TrainBatch, names: tuple[str, ...]
    ) -> dict[str, torch.Tensor]:
        """``module``'s outputs ``names`` ([B, T] each: logprobs, values) for every row: this rank computes its
        share (``_split``), ranks exchange shares."""
        rows = list(self._split(batch, list(range(batch.num_samples))).ranks[self.parallel.rank])
        shares = {name: torch.zeros_like(batch.loss_mask[rows]) for name in names}
        local = self._plan_micro_batches(select_rows(batch, rows)) if rows else []
        passes = agreed_count(self.parallel, len(local))  # before any pass: the count is a collective too
        for micro in local:
            sub = select_rows(batch, [rows[i] for i in micro])
            width = sub.input_ids.shape[1]
            outputs = self._outputs(module, sub)
            for name in names:
                shares[name][torch.tensor(micro, device=batch.loss_mask.device), :width] = outputs[name]
        for _ in range(passes - len(local)):
            self._outputs(module, _probe(batch))  # keeps FSDP2's all-gathers in step
        self.parallel.reshard(module)  # no backward follows to free what the passes gathered
        return {name: self._exchanged(rows, share) for name, share in shares.items()}

    def _outputs(self, module: nn.Module, micro: TrainBatch) -> dict[str, torch.Tensor]:
        """A log-prob module's log-probs (and values of a head on its trunk), or a value model's values."""
        out = self._forward(module, micro)
        if isinstance(out, TokenLogProbs):
            return {"logprobs": out.logprobs, "values": out.values}
        return {"values": out}

    def _exchanged(self, rows: list[int], share: torch.Tensor) -> torch.Tensor:
        """The [B, T] tensor assembled from every rank's (rows, [rows, T] share); one process: its share."""
        if self.parallel.world_size == 1:
            return share
        parts = self.parallel.gather((rows, share.cpu()))
        full = torch.zeros((sum(len(r) for r, _ in parts), share.shape[1]), dtype=share.dtype)
        for part_rows, part in parts:
            full[part_rows] = part
        return full.to(share.device)

    def _plan_micro_batches(self, batch: TrainBatch) -> list[list[int]]:
        """Micro-batches within the token budget: real tokens when packing, padded rows × width otherwise."""
        packed = self.config.sequence_packing
        return plan_micro_batches(
            sequence_lengths(batch), self.config.max_tokens_per_microbatch, packed=packed
        )

    def _forward(self, module: nn.Module, micro: TrainBatch) -> TokenLogProbs | torch.Tensor:
        """``TokenLogProbs`` of a log-prob module, values [B, T] of a value model."""
        with autocast(self.device, self.config.compute_dtype):
            return module(micro.input_ids, micro.attention_mask, micro.loss_mask)

    def _optimizer_step(
        self, batch: TrainBatch, fixed: dict[str, torch.Tensor], split: RowSplit
    ) -> dict[str, float]:
        """Accumulate the gradient of one mini-batch over its micro-batches, clip it and step the optimizer.

        Each rank trains its share of ``split``'s rows; the loss and metrics returned are the whole
        mini-batch's."""
        rows, mine = list(split.rows), list(split.ranks[self.parallel.rank])
        mini, mini_fixed = _take(batch, fixed, mine) if mine else (None, {})
        local = local_denominator(mini_fixed[_AGGREGATION_MASK]) if mine else torch.zeros(3)
        total = combine(self.parallel.gather(local))
        metrics, losses = MetricMerger(), {"loss": 0.0}
        plans = self._plan_micro_batches(mini) if mini is not None else []
        passes = agreed_count(self.parallel, len(plans))
        try:
            for index in range(passes):
                # Sharded accumulation reduces after every pass; unsharded only with the mini-batch's last.
                for module in self._trained_modules():
                    self.parallel.sync_gradients(module, index == passes - 1)
                if index < len(plans):
                    micro, micro_fixed = _take(mini, mini_fixed, plans[index])
                    for key, value in self._accumulate(micro, micro_fixed, total, metrics).items():
                        losses[key] = losses.get(key, 0.0) + value
                else:  # a pass that changes nothing, so this rank's collectives match the others'
                    self._empty_pass(_probe(batch))
            step_metrics = self._step_optimizers()
        finally:  # gradients live only within their mini-batch (``_free_gradients``)
            self._free_gradients()
        ranks = self.parallel.gather((metrics, losses))
        # The accumulation weights carry x world_size (undoing FSDP's average): divide it out of the sums.
        summed: dict[str, float] = {}
        for _, part in ranks:
            for key, value in part.items():
                summed[key] = summed.get(key, 0.0) + value / self.parallel.world_size
        merged = MetricMerger.union(m for m, _ in ranks).result()
        if "masked_fraction" in merged:
            merged["masked_fraction"] = _masked_fraction(batch, fixed, rows)
        return {**merged, **summed, **step_metrics}

    def _free_gradients(self) -> None:
        """Drop every gradient once its mini-batch stepped (or failed), so none outlives it: the next
        mini-batch starts from none, and between steps the trainer holds no gradient (under ``runtime.switch``
        the engine generates beside the trainer's state: fp32 gradients would be as large as the master
        weights). Each optimizer covers what it steps, the policy's whether or not it trained this step (a
        critic's warm-up drops its gradient; a shared critic's passes run through the policy)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.optimizer.zero_grad(set_to_none=True)

    def _trained_modules(self) -> list[nn.Module]:
        """The modules a pass runs backward through: the policy (unless a separate critic warms up alone) and a
        separate critic."""
        modules = [self.policy] if self._runs_policy else []
        if self.critic is not None and not self.critic.shared:
            modules.append(self.critic.module)
        return modules

    @property
    def _runs_policy(self) -> bool:
        """Whether passes run the policy: to train it, or to read a value head on its trunk."""
        return self.trains_policy or (self.critic is not None and self.critic.shared)

    def _step_optimizers(self) -> dict[str, float]:
        """Clip and step the policy (not during the critic's warm-up: its gradient is dropped) and the critic;
        skip both when either gradient norm is not finite (``_skip_update``).

        Why both: a shared critic's loss flows through the policy's trunk, so a non-finite value gradient is in
        the policy's too; one rule for every critic keeps the update all or nothing. The norms are global (a
        DTensor norm is all-reduced), so every rank takes the same branch."""
        norms = {"grad_norm": 0.0}
        if self.trains_policy:
            norms["grad_norm"] = clip_gradients(self.model.parameters(), self.config.max_grad_norm)
        if self.critic is not None:
            norms["critic/grad_norm"] = clip_gradients(
                self.critic.module.parameters(), self.critic.config.max_grad_norm
            )
        if not all(math.isfinite(norm) for norm in norms.values()):
            self._skip_update(norms)
            return {name: norm for name, norm in norms.items() if math.isfinite(norm)}
        if self.trains_policy:
            self.optimizer.step()
        if self.critic is not None:
            self.critic.optimizer.step()
        self.skipped_in_a_row = 0
        return norms

    def _skip_update(self, norms: dict[str, float]) -> None:
        """Count a skipped update (its gradients are dropped with every other's, ``_free_gradients``), warn, and
        fail by name past ``trainer.max_consecutive_skipped_updates`` in a row.

        What stays as it was: the weights and AdamW's moments and step count. What goes on: the train step, its
        learning-rate schedule (a function of the step, so a resume agrees) and the policy version, whose
        unchanged weights are published like any others."""
        self.skipped_in_a_row += 1
        self._skipped_this_step += 1
        limit = self.config.max_consecutive_skipped_updates
        where = f"train step {self.step} (policy version {self.version})"
        if self.skipped_in_a_row > limit:
            raise NonFiniteGradientError(
                f"{where}: gradient norm {norms} is not finite, {self.skipped_in_a_row} optimizer updates "
                f"in a row; trainer.max_consecutive_skipped_updates is {limit}"
            )
        if self.parallel.rank == 0:
            logger.warning(
                "%s: gradient norm %s is not finite; optimizer update skipped, weights unchanged "
                "(%d in a row, trainer.max_consecutive_skipped_updates: %d)",
                where,
                norms,
                self.skipped_in_a_row,
                limit,
            )

    def _empty_pass(self, probe: TrainBatch) -> None:
        """Forward and backward ``probe`` through every trained module with a zero loss."""
        zero = torch.zeros((), device=self.device)
        for module in self._trained_modules():
            out = self._forward(module, probe)
            for tensor in self._outputs_of(out):
                zero = zero + tensor.sum() * 0.0
        zero.backward()

    @staticmethod
    def _outputs_of(out: TokenLogProbs | torch.Tensor) -> list[torch.Tensor]:
        if isinstance(out, torch.Tensor):
            return [out]
        return [out.logprobs] + ([out.values] if out.values is not None else [])

    def _accumulate(
        self,
        micro: TrainBatch,
        fixed: dict[str, torch.Tensor],
        total: GlobalDenominator,
        metrics: MetricMerger,
    ) -> dict[str, float]:
        """Forward and backward one micro-batch with its loss scaled to its share of the mini-batch's loss
        (of every rank's rows); return that share of the policy loss (``loss``) and of each
        ``_AGGREGATED_LOSSES`` metric. Other metrics are merged weighted by the tokens each is a mean over
        (``_TRAINED_TOKEN_METRICS``)."""
        with self._gradient_mode():
            out = self._forward(self.policy, micro) if self._runs_policy else None
            num_tokens = float(micro.loss_mask.sum())
            loss = objective = torch.zeros((), device=self.device)
            step_metrics: dict[str, float] = {}
            if self.trains_policy:
                loss_tensors = {k: v for k, v in fixed.items() if k not in _NOT_LOSS_INPUTS}
                inputs = self._loss_inputs(micro, loss_tensors, out)
                loss, step_metrics = compute_policy_loss(self.loss_config.name, inputs, self.loss_config)
                step_metrics["entropy"] = float(out.entropy.sum()) / max(num_tokens, 1.0)
                objective = loss
            if self.critic is not None:
                value, value_metrics = self._value_loss(micro, fixed, out)
                objective = objective + self.critic.config.value_loss_coef * value
                step_metrics |= value_metrics
            weight = global_accumulation_weight(
                self.loss_config, fixed[_AGGREGATION_MASK], total, self.parallel.world_size
            )
            if (
                objective.requires_grad
            ):  # the loss of a micro-batch with no trained token is still a graph (see
                (
                    objective * weight
                ).backward()  # TokenLogProbModule), so every rank differentiates every pass
        shares = {key: step_metrics.pop(key) * weight for key in _AGGREGATED_LOSSES if key in step_metrics}
        step_metrics = {k: v for k, v in step_metrics.items() if not k.startswith(CORRECTION_METRICS)}
        per_trained = {k: v for k, v in step_metrics.items() if k.startswith(_TRAINED_TOKEN_METRICS)}
        metrics.add(per_trained, weight=num_tokens)
        counted = float(fixed[_AGGREGATION_MASK].sum())
        metrics.add({k: v for k, v in step_metrics.items() if k not in per_trained}, weight=counted)
        return {"loss": float(loss.detach()) * weight, **shares}

    def _value_loss(
        self, micro: TrainBatch, fixed: dict[str, torch.Tensor], out: TokenLogProbs | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of the critic's values on this micro-batch (the shared head's come with the
        policy's forward ``out``), aggregated like the policy loss."""
        critic = self.critic
        assert critic is not None
        values = out.values if critic.shared else self._forward(critic.module, micro)
        return value_loss(
            values,
            fixed[_OLD_VALUES],
            fixed[_RETURNS],
            fixed[_AGGREGATION_MASK],
            clip=critic.config.value_clip,
            aggregation=self.loss_config.aggregation,
            norm_length=self.loss_config.norm_length,
        )

    def _loss_inputs(
        self, micro: TrainBatch, fixed: dict[str, torch.Tensor], out: TokenLogProbs
    ) -> PolicyLossInputs:
        return PolicyLossInputs(
            logprobs=out.logprobs,
            behaviour_logprobs=micro.behaviour_logprobs,
            advantages=micro.advantages,
            loss_mask=micro.loss_mask,
            token_versions=micro.token_versions,
            current_version=self.version,
            sequence_rewards=micro.rewards,
            **fixed,
        )


def own_behaviour(batch: TrainBatch, policy: torch.Tensor, version: int) -> torch.Tensor:
    """Behaviour log-probs [B, T] in which every trained token generated at ``version`` (the trainer's weights
    now) carries ``policy``, the trainer's own log-prob of it at step start; older tokens keep the engine's.

    Why: an engine's log-probs depend on which requests shared its batches, which depends on timing, so two
    runs of one seed (a run and its kill/resume twin, sync and α = 0) would train on log-probs differing in
    the last bits. The trainer's own forward is a function of the batch alone: the same distribution (same
    weights, same temperature, ``RunConfig._check_deterministic``), computed reproducibly. Tokens of older
    versions cannot be recomputed (their weights are gone) and keep the engine's values; untrained tokens
    keep 0.
    """
    current = (batch.token_versions == version) & (batch.loss_mask > 0)
    return torch.where(current, policy, batch.behaviour_logprobs)


def _probe(batch: TrainBatch) -> TrainBatch:
    """The first two tokens of row 0: the input of a rank's padding pass, which runs every module only so that
    FSDP2's collectives line up (its outputs are discarded, or enter the loss times zero: no gradient).
    Row 0 itself could be the batch's longest sample, a 9k-token forward and backward for nothing."""
    row = select_rows(batch, [0])
    width = min(2, row.input_ids.shape[1])
    return replace(
        row,
        input_ids=row.input_ids[:, :width],
        attention_mask=row.attention_mask[:, :width],
        loss_mask=row.loss_mask[:, :width],
        behaviour_logprobs=row.behaviour_logprobs[:, :width],
        token_versions=row.token_versions[:, :width],
        advantages=row.advantages[:, :width],
        token_rewards=row.token_rewards[:, :width],
    )


def _masked_fraction(batch: TrainBatch, fixed: dict[str, torch.Tensor], rows: list[int]) -> float:
    """The share of the mini-batch's positions (``rows`` x its longest row) its loss does not count: prompt,
    padding, dropped by a correction. Computed from the whole mini-batch, which every rank holds: its
    micro-batches' shares, token-weighted, depend on how rows were split over ranks and micro-batches."""
    _, taken = _take(batch, {_AGGREGATION_MASK: fixed[_AGGREGATION_MASK]}, rows)
    mask = taken[_AGGREGATION_MASK]
    return float(1 - mask.sum() / max(mask.numel(), 1))


def _take(
    batch: TrainBatch, tensors: dict[str, torch.Tensor], rows: list[int]
) -> tuple[TrainBatch, dict[str, torch.Tensor]]:
    """Rows ``rows`` of ``batch`` and of the [B, T] tensors aligned with it, trimmed to the same width."""
    sub = select_rows(batch, rows)
    index = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)
    width = sub.input_ids.shape[1]
    return sub, {name: t[index, :width] for name, t in tensors.items()}


def _check_parts(
    config: TrainerConfig,
    loss_config: LossConfig,
    advantage_config: AdvantageConfig,
    ref_model: nn.Module | None,
    critic: CriticConfig | None,
    critic_body: nn.Module | None,
    critic_weights: Path | None,
) -> None:
    """Refuse, by the setting at fault, a trainer whose parts do not go together (``Trainer.__init__``)."""
    if config.lora is not None and ref_model is not None:
        raise ValueError(
            "trainer.lora: the reference policy is the base model with the adapters off; pass no ref_model"
        )
    if loss_config.needs_reference and ref_model is None and config.lora is None:
        raise ValueError("loss.kl.beta > 0 needs a reference model (Trainer(ref_model=...)), got none")
    check_critic(advantage_config.name, critic)
    if critic_body is not None and critic_weights is None and has_meta_parameters(critic_body):
        raise ValueError("a critic body on the meta device needs critic_weights, the directory of its shards")
