"""The trainer: one ``train_step`` turns groups of trajectories into PPO-style optimizer steps.

    groups ─► advantages [B] ─► TrainBatch ─► step-start log-probs (no grad: proximal / train-behaviour / ref,
    only those the loss config needs) ─► for each PPO epoch, for each mini-batch:
        micro-batches by token budget ─► forward + registered loss ─► backward (accumulate) ─► clip ─► AdamW step
    ─► scheduler step ─► version + 1

Key decisions: the trainer never branches on the loss name, only on which inputs the loss config says it needs
(``LossConfig.needs_*``). Gradient accumulation weights each micro-batch's loss by its share of the mini-batch's
aggregation denominator (its mask count for token-mean, its counted sequences for the sequence means), so the
accumulated gradient equals the gradient of the whole mini-batch's loss. Dropout stays off (eval mode), so the
recomputed step-start log-probs equal the first forward's exactly and π_θ/π_prox starts at 1.

Data parallelism is the same code (``distributed.parallel``): every rank builds the whole batch (so advantages
see whole groups), takes its strided share of each mini-batch's rows, and weighs its micro-batches by their share
of the *global* denominator, agreed before any backward (``distributed.normalisation``); ranks agree on the
number of passes so FSDP2's collectives line up. One process is the world of size 1.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import nn

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
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
from asyncrl.trainer.distributed.normalisation import (
    GlobalDenominator,
    combine,
    global_accumulation_weight,
    local_denominator,
)
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess, agreed_count, local_rows
from asyncrl.trainer.logprobs import TokenLogProbModule, TokenLogProbs, autocast
from asyncrl.trainer.lora import (
    adapter_dropout,
    adapter_spec,
    adapter_tensors,
    attach_lora,
    seeded_dropout,
)
from asyncrl.trainer.losses import PolicyLossInputs, compute_policy_loss
from asyncrl.trainer.mismatch import compute_step_start_correction
from asyncrl.trainer.offpolicy import m2po_keep
from asyncrl.trainer.optim import build_optimizer, build_scheduler, clip_gradients
from asyncrl.types import Group, TrainBatch
from asyncrl.weight_sync.protocol import LoraAdapter

_AGGREGATION_MASK = "aggregation_mask"
"""Key of the step tensor holding the mask the loss aggregates over (not a loss input)."""


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
    ) -> None:
        if config.lora is not None and ref_model is not None:
            raise ValueError(
                "trainer.lora: the reference policy is the base model with the adapters off; pass no ref_model"
            )
        if loss_config.needs_reference and ref_model is None and config.lora is None:
            raise ValueError("loss.kl.beta > 0 needs a reference model (Trainer(ref_model=...)), got none")
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
        if config.activation_checkpointing:
            enable_activation_checkpointing(model)
        self.policy = self._log_prob_module(model)
        self.reference = self._reference_module(loss_config)
        self.optimizer = build_optimizer(model, config)  # after sharding: the optimizer holds the shards
        self.scheduler = build_scheduler(self.optimizer, config)
        self.step = 0
        self.version = version

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

    def _log_prob_module(self, model: nn.Module) -> TokenLogProbModule:
        config = self.config
        module = TokenLogProbModule(
            model,
            chunk_size=config.logprob_chunk_size,
            temperature=config.temperature,
            packed_row_tokens=config.packed_row_tokens if config.sequence_packing else None,
        )
        self.parallel.shard(module)
        return module

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
        lr = self.scheduler.get_last_lr()[0]
        batch = self.make_batch(groups)
        plans = [
            plan_mini_batches(batch.num_samples, self.config.num_mini_batches, self._shuffle(epoch))
            for epoch in range(self.config.ppo_epochs)
        ]
        fixed, start_metrics = self._step_start_logprobs(batch)
        fixed[_AGGREGATION_MASK] = self._aggregation_mask(batch, fixed)
        metrics = _MetricMerger()
        with self._dropout_rng():
            for plan in plans:
                for rows in plan:
                    metrics.add(self._optimizer_step(batch, fixed, rows), weight=1.0)
        self.scheduler.step()
        self.step += 1
        self.version = policy_version + 1
        elapsed = time.perf_counter() - started
        return {**metrics.result(), **start_metrics, **self._step_metrics(batch, lr, elapsed)}

    def make_batch(self, groups: Sequence[Group]) -> TrainBatch:
        """Advantages of ``groups``' rewards and the padded batch, on the model's device."""
        trajectories, group_ids = flatten_groups(groups)
        rewards_b = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
        advantages_b = compute_advantages(
            self.advantage_config.name, rewards_b, torch.tensor(group_ids), self.advantage_config
        )
        batch = build_train_batch(groups, advantages_b, pad_token_id=self.pad_token_id)
        return batch.to(self.device)

    def _step_metrics(self, batch: TrainBatch, lr: float, elapsed: float) -> dict[str, float]:
        num_tokens = float(batch.attention_mask.sum())
        return {
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
        named explicitly (``models.loading.state_dict_for_sync``)."""
        if self.peft_model is not None:
            return adapter_tensors(self.model)
        return state_dict_for_sync(self.model)

    def state_for_sync(self) -> dict[str, torch.Tensor]:
        """A snapshot (copies) of ``sync_tensors``, which the next step cannot change."""
        return {name: tensor.clone() for name, tensor in self.sync_tensors().items()}

    def state_dict(self) -> dict:
        """Everything but the model weights needed to resume training exactly (see checkpoint.py)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "version": self.version,
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        self.version = int(state["version"])

    def _shuffle(self, epoch: int) -> torch.Generator | None:
        """Mini-batch shuffling seeded by (seed, step, epoch): resumes reproduce it without saved RNG state."""
        if not self.config.shuffle_mini_batches or self.config.num_mini_batches == 1:
            return None
        seed = np.random.SeedSequence([self.config.seed, self.step, epoch]).generate_state(1)[0]
        return torch.Generator().manual_seed(int(seed))

    def _step_start_logprobs(self, batch: TrainBatch) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The no-grad [B, T] log-prob inputs the loss config asks for, from the weights at step start, for
        every row of the step (each rank computes its share, then all are exchanged: batch-wide statistics,
        M2PO's mask among them, need every row), and the metrics of what they decided."""
        fixed: dict[str, torch.Tensor] = {}
        metrics: dict[str, float] = {}
        loss_config = self.loss_config
        if loss_config.needs_proximal_forward or loss_config.needs_train_behaviour:
            # One forward serves both: at step start the proximal policy is the trainer's behaviour recompute.
            policy = self._logprobs_no_grad(self.policy, batch)
            if loss_config.needs_proximal_forward:
                fixed["proximal_logprobs"] = policy
            if loss_config.needs_train_behaviour:
                fixed["train_behaviour_logprobs"] = policy
        if self.reference is not None:
            with self._reference_mode():
                fixed["ref_logprobs"] = self._logprobs_no_grad(self.reference, batch)
        if loss_config.m2po is not None:
            log_ratio = fixed["train_behaviour_logprobs"] - batch.behaviour_logprobs
            fixed["m2po_mask"], metrics["m2po/second_moment"] = m2po_keep(
                log_ratio, batch.loss_mask, loss_config.m2po.threshold
            )
        return fixed, metrics

    def _aggregation_mask(self, batch: TrainBatch, fixed: dict[str, torch.Tensor]) -> torch.Tensor:
        """The mask the loss aggregates over: the loss mask, less what mismatch correction and K3 rejection
        drop.

        The correction is computed per row from step-start tensors, so it is the same whichever micro-batch a
        row lands in; accumulation weights use it so that dropped tokens leave every denominator.
        """
        if not self.loss_config.replaces_behaviour:
            return batch.loss_mask
        correction = compute_step_start_correction(
            fixed["train_behaviour_logprobs"], batch.behaviour_logprobs, batch.loss_mask, self.loss_config
        )
        return batch.loss_mask * correction.mask

    @torch.no_grad()
    def _logprobs_no_grad(self, module: nn.Module, batch: TrainBatch) -> torch.Tensor:
        """``module``'s log-probs of every row: this rank computes its strided share, ranks exchange shares."""
        rows = local_rows(self.parallel, list(range(batch.num_samples)))
        share = torch.zeros_like(batch.loss_mask[rows])
        local = self._plan_micro_batches(select_rows(batch, rows)) if rows else []
        passes = agreed_count(self.parallel, len(local))  # before any pass: the count is a collective too
        for micro in local:
            sub = select_rows(batch, [rows[i] for i in micro])
            width = sub.input_ids.shape[1]
            share[torch.tensor(micro, device=share.device), :width] = self._forward(module, sub).logprobs
        for _ in range(passes - len(local)):
            self._forward(module, select_rows(batch, [0]))  # keeps FSDP2's all-gathers in step
        return self._exchanged(rows, share)

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

    def _forward(self, module: nn.Module, micro: TrainBatch) -> TokenLogProbs:
        with autocast(self.device, self.config.compute_dtype):
            return module(micro.input_ids, micro.attention_mask, micro.loss_mask)

    def _optimizer_step(
        self, batch: TrainBatch, fixed: dict[str, torch.Tensor], rows: list[int]
    ) -> dict[str, float]:
        """Accumulate the gradient of one mini-batch over its micro-batches, clip it and step the optimizer.

        Each rank trains its share of ``rows``; the loss and metrics returned are the whole mini-batch's."""
        mine = local_rows(self.parallel, rows)
        mini, mini_fixed = _take(batch, fixed, mine) if mine else (None, {})
        local = local_denominator(mini_fixed[_AGGREGATION_MASK]) if mine else torch.zeros(3)
        total = combine(self.parallel.gather(local))
        self.optimizer.zero_grad(set_to_none=True)
        metrics, loss = _MetricMerger(), 0.0
        plans = self._plan_micro_batches(mini) if mini is not None else []
        passes = agreed_count(self.parallel, len(plans))
        for index in range(passes):
            # Gradients are reduced across ranks once, with the mini-batch's last pass.
            self.parallel.sync_gradients(self.policy, index == passes - 1)
            if index < len(plans):
                micro, micro_fixed = _take(mini, mini_fixed, plans[index])
                loss += self._accumulate(micro, micro_fixed, total, metrics)
            else:  # a pass that changes nothing, so this rank's collectives match the others'
                (self._forward(self.policy, select_rows(batch, [0])).logprobs.sum() * 0.0).backward()
        grad_norm = clip_gradients(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        ranks = self.parallel.gather((metrics, loss))
        loss = sum(part for _, part in ranks) / self.parallel.world_size
        return {**_MetricMerger.union(m for m, _ in ranks).result(), "loss": loss, "grad_norm": grad_norm}

    def _accumulate(
        self,
        micro: TrainBatch,
        fixed: dict[str, torch.Tensor],
        total: GlobalDenominator,
        metrics: _MetricMerger,
    ) -> float:
        """Forward and backward one micro-batch with its loss scaled to its share of the mini-batch's loss
        (of every rank's rows); return that share. Metrics are weighted by the micro-batch's trained tokens."""
        with self._gradient_mode():
            out = self._forward(self.policy, micro)
            loss_tensors = {k: v for k, v in fixed.items() if k != _AGGREGATION_MASK}
            inputs = self._loss_inputs(micro, loss_tensors, out)
            loss, loss_metrics = compute_policy_loss(self.loss_config.name, inputs, self.loss_config)
            weight = global_accumulation_weight(
                self.loss_config, fixed[_AGGREGATION_MASK], total, self.parallel.world_size
            )
            if loss.requires_grad:  # the loss of a micro-batch with no trained token is still a graph (see
                (loss * weight).backward()  # TokenLogProbModule), so every rank differentiates every pass
        num_tokens = float(micro.loss_mask.sum())
        entropy = float(out.entropy.sum()) / max(num_tokens, 1.0)
        metrics.add({**loss_metrics, "entropy": entropy}, weight=num_tokens)
        return float(loss.detach()) * weight

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


class _MetricMerger:
    """Combines per-part metrics: keys ending in ``_min``/``_max`` take the min/max, others a weighted mean."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}
        self._extremes: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float) -> None:
        for key, value in metrics.items():
            if key.endswith(("_min", "_max")):
                pick = min if key.endswith("_min") else max
                self._extremes[key] = pick(self._extremes.get(key, value), value)
            else:
                self._sums[key] = self._sums.get(key, 0.0) + weight * value
                self._weights[key] = self._weights.get(key, 0.0) + weight

    @classmethod
    def union(cls, parts: Iterable[_MetricMerger]) -> _MetricMerger:
        """One merger holding every part's sums, weights and extremes (e.g. one per rank)."""
        merged = cls()
        for part in parts:
            for key, value in part._sums.items():
                merged._sums[key] = merged._sums.get(key, 0.0) + value
                merged._weights[key] = merged._weights.get(key, 0.0) + part._weights[key]
            for key, value in part._extremes.items():
                pick = min if key.endswith("_min") else max
                merged._extremes[key] = pick(merged._extremes.get(key, value), value)
        return merged

    def result(self) -> dict[str, float]:
        means = {k: s / self._weights[k] if self._weights[k] > 0 else 0.0 for k, s in self._sums.items()}
        return {**means, **self._extremes}


def _take(
    batch: TrainBatch, tensors: dict[str, torch.Tensor], rows: list[int]
) -> tuple[TrainBatch, dict[str, torch.Tensor]]:
    """Rows ``rows`` of ``batch`` and of the [B, T] tensors aligned with it, trimmed to the same width."""
    sub = select_rows(batch, rows)
    index = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)
    width = sub.input_ids.shape[1]
    return sub, {name: t[index, :width] for name, t in tensors.items()}
