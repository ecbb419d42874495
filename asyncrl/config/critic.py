"""Configuration of PPO's critic: a value model of its own, or a value head on the policy's trunk.

Key decision: the critic's values are computed at train time, from the critic being trained, never at rollout
time: a stale sample then still gets values (and GAE advantages) from today's critic, which is what makes
PPO with a critic usable in the asynchronous modes. Only the policy is synced to the engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from asyncrl.config.model import ModelKeys

CriticType = Literal["separate", "shared_trunk"]
CRITIC_TYPES: tuple[str, ...] = get_args(CriticType)
CRITIC_KEYS: ModelKeys = ("critic.model_path", "critic.revision")
"""The keys that name a separate critic's body and its revision (``models.loading.resolve_model_path``)."""


@dataclass(frozen=True, kw_only=True)
class CriticConfig:
    """The value model PPO's GAE reads (``advantage.name: gae``)."""

    type: CriticType = "separate"
    """'separate': a model of its own (decoder body + value head), with its own optimizer; 'shared_trunk': a
    value head on the policy's decoder, the value loss added to the policy loss (less memory, one forward, but
    the value loss moves the policy's trunk too)."""
    model_path: str | None = None
    """'separate' only: the directory or hub id its body starts from (a causal LM or a base model); null starts
    from a copy of the policy's own weights."""
    revision: str = ""
    """Hub ids in ``critic.model_path``: the branch, tag or commit of the critic's own repository to load (pin a
    commit for a reproducible run); empty: ``main``, never ``model.revision`` (the policy's repository's
    commits are not the critic's). An error with a local directory, as ``model.revision`` is; downloads follow
    ``model.local_files_only``."""
    lr: float | None = None
    """Peak learning rate of the critic's AdamW (the value head's, for 'shared_trunk'); null uses trainer.lr.
    It follows the trainer's warm-up and schedule."""
    max_grad_norm: float | None = 1.0
    """Clip the critic's gradient norm to this before each of its steps; null only measures it."""
    value_clip: float | None = 0.2
    """Clipped value loss: ½·max((V − R)², (V_old + clip(V − V_old, ±value_clip) − R)²), V_old the values at step
    start; null uses the unclipped ½·(V − R)²."""
    value_loss_coef: float = 0.5
    """Weight of the value loss: added to the policy loss for 'shared_trunk'; scales the separate critic's."""
    warmup_steps: int = 0
    """The first this many train steps train only the critic: the policy's weights stay as they are (its
    version still advances, so rollout and staleness run as usual) while the values become meaningful. The
    policy's learning-rate warm-up and schedule start after them."""

    def __post_init__(self) -> None:
        if self.type not in CRITIC_TYPES:
            raise ValueError(
                f"critic.type must be one of {', '.join(map(repr, CRITIC_TYPES))}, got {self.type!r}"
            )
        if self.model_path is not None and self.type != "separate":
            raise ValueError("critic.model_path applies only to critic.type='separate'")
        if self.revision and self.model_path is None:
            raise ValueError(
                f"critic.revision ({self.revision!r}) applies only with critic.model_path: a critic copied from "
                "the policy loads at model.revision"
            )
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"critic.lr must be > 0 or null, got {self.lr}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"critic.max_grad_norm must be > 0 or null, got {self.max_grad_norm}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"critic.value_clip must be > 0 or null, got {self.value_clip}")
        if not self.value_loss_coef > 0:
            raise ValueError(f"critic.value_loss_coef must be > 0, got {self.value_loss_coef}")
        if self.warmup_steps < 0:
            raise ValueError(f"critic.warmup_steps must be >= 0, got {self.warmup_steps}")


def check_critic(advantage_name: str, critic: CriticConfig | None) -> None:
    """GAE needs a critic, and a critic is only read by GAE."""
    if advantage_name == "gae" and critic is None:
        raise ValueError(
            "advantage.name='gae' needs a critic section (critic.type: separate or shared_trunk)"
        )
    if critic is not None and advantage_name != "gae":
        raise ValueError(
            f"critic is set but advantage.name is {advantage_name!r}: only advantage.name='gae' reads values"
        )
