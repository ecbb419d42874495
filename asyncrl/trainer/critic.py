"""PPO's critic: a value head, on a decoder body of its own (``separate``) or on the policy's (``shared_trunk``).

The value at position t is the head applied to the hidden state at t − 1 — the state the policy was in when it
chose token t — so values align with log-probs (``batching.py``) and are computed only where the loss mask is 1.
The head starts at zero (every value 0), so the first GAE advantages are plain returns and nothing random enters
them. The critic owns its optimizer and schedule; its weights are never synced to the engines (only the policy's
are: ``Trainer.model`` is the policy alone).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from asyncrl.config.critic import CriticConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.logprobs import decoder_body, decoder_hidden, values_from_hidden
from asyncrl.trainer.optim import build_optimizer, build_scheduler


def value_head(hidden_size: int, dtype: torch.dtype, device: torch.device) -> nn.Linear:
    """A linear map from the hidden state to one value, zero-initialised."""
    head = nn.Linear(hidden_size, 1, dtype=dtype, device=device)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


class ValueModel(nn.Module):
    """A separate critic: decoder ``body`` and ``head``; ``forward`` gives values [B, T] aligned like log-probs.

    Like ``TokenLogProbModule``, with gradients on the result is always a graph through every parameter (a
    micro-batch with no trained token probes row 0's last token and multiplies by zero), so FSDP2 ranks run
    backward through the same modules.
    """

    def __init__(self, body: nn.Module, head: nn.Module, *, packed_row_tokens: int | None) -> None:
        super().__init__()
        self.body = body
        self.head = head
        self.packed_row_tokens = packed_row_tokens

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
    ) -> torch.Tensor:
        last = int(attention_mask[0].sum()) - 1
        probe = torch.is_grad_enabled() and last > 0 and not bool((loss_mask[:, 1:] > 0).any())
        if probe:
            loss_mask = torch.zeros_like(loss_mask)
            loss_mask[0, last] = 1
        hidden = decoder_hidden(self.body, input_ids, attention_mask, self.packed_row_tokens)
        values = values_from_hidden(hidden, self.head, loss_mask)
        return values * 0.0 if probe else values


@dataclass
class Critic:
    """The trained critic: ``module`` is the ``ValueModel`` (separate) or the value head inside the policy's
    ``TokenLogProbModule`` (shared_trunk); ``optimizer`` and ``scheduler`` step its parameters only."""

    config: CriticConfig
    module: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    @property
    def shared(self) -> bool:
        return self.config.type == "shared_trunk"

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def head_for(model: nn.Module) -> nn.Linear:
    """A zero value head sized, typed and placed for ``model``'s hidden states; on the host when ``model`` is a
    skeleton on the meta device (a sharded trainer's: the head is real, and sharding keeps it, see
    ``sharded_load``)."""
    parameter = next(model.parameters())
    device = torch.device("cpu") if parameter.is_meta else parameter.device
    return value_head(model.config.hidden_size, parameter.dtype, device)


def separate_value_model(
    policy: nn.Module, body: nn.Module | None, packed_row_tokens: int | None
) -> ValueModel:
    """A separate critic on ``body`` (a decoder body, e.g. loaded from ``critic.model_path``), or on a copy of the
    policy's body when None; in eval mode (dropout off, as the policy)."""
    body = copy.deepcopy(decoder_body(policy)) if body is None else body
    return ValueModel(body, head_for(body), packed_row_tokens=packed_row_tokens).eval()


def make_critic(config: CriticConfig, module: nn.Module, trainer_config: TrainerConfig) -> Critic:
    """The critic over ``module`` (already sharded when the trainer is), with AdamW at ``critic.lr`` (else
    trainer.lr) following the trainer's warm-up and schedule."""
    optimizer = build_optimizer(module, trainer_config, lr=config.lr)
    return Critic(config, module, optimizer, build_scheduler(optimizer, trainer_config))
