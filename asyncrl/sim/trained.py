"""What a run trains, as FLOPs and bytes: the policy (every weight, or LoRA adapters on a frozen base) and PPO's
critic (a separate decoder body, or a value head on the policy's trunk). ``sim.derive`` turns these into the
trainer's and the weight update's seconds.

Key decisions (per trained token, A = the weights a token multiplies, ``ModelShape.active_params_per_token``;
F = one forward, 2A + attention's QKᵀ and AV; L = the adapter weights a token multiplies):
- Full training is forward F + backward 2F: activation gradients 2A plus weight gradients 2A, and attention's
  backward twice its forward (the classic 3F, "6N" per token).
- LoRA freezes every base weight: no weight-gradient GEMMs for them, so training is 3F − 2A (forward 2A,
  activation gradients 2A: the "4N" against "6N"), plus the adapters' own forward 2L and backward 4L. AdamW,
  its gradients and the weight update cover the adapters only: the trainer publishes adapter pairs
  (``Trainer.sync_tensors``: ``adapter_tensors``), never merged weights.
- A separate critic is a decoder body without the output layer (its own weights, trained in full even with
  LoRA: ``Trainer`` copies or loads it before LoRA wraps the policy): its own 3F_body to train, F_body of
  no-grad forward for the step-start values GAE reads, and its own AdamW over its body.
- A shared-trunk critic is a value head (hidden + 1 weights) on the policy's hidden states: its forward 2·hidden
  and backward 4·hidden FLOPs per token are about 10⁻⁶ of the policy's 6A (hidden/A for any shape here), and
  its value loss joins the policy's loss, so the trunk's backward is the one the policy runs anyway. What it
  can add is a forward: the step-start values come from the policy's no-grad pass (``_step_start_policy``),
  which then runs even when the loss trusts the engine's log-probs (``cost.logprob_passes: 0``).
- Where the settings come from: the same ones ``asyncrl plan`` plans memory with (``memory.train_config``'s
  critic and ``trainer.lora``, else ``memory.critic`` and ``memory.lora_rank``), so a candidate's time and
  memory describe one run.
- A separate critic's shape: ``critic.model_path``'s own (its ``config.json``, in a folder or the offline hub
  cache) when the training config names one, else the policy's; one that cannot be read falls back to the
  policy's with the reason kept (``sim.critic_shape``, which the memory plan uses too). Without a training
  config, ``memory.critic_model``'s shape (a named shape, a ``config.json`` or a cached hub id; one that does
  not read is an error), else a copy of the policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config.run import load_run_config
from asyncrl.config.sim import SimConfig
from asyncrl.sim.critic_shape import CriticShape, critic_model_shape, resolve_critic_shape
from asyncrl.sim.model_shape import ModelShape, resolve_shape

ADAMW_BYTES_PER_PARAM = 32
"""AdamW's step reads and writes float32 master weights, gradients and two moments: ~16 B read and 16 B written
per trained parameter."""


@dataclass(frozen=True)
class TrainedParts:
    """The run's critic (``none``, ``separate``, ``shared_trunk``) and LoRA rank (0: every weight trains)."""

    critic: str = "none"
    lora_rank: int = 0
    critic_shape: CriticShape | None = None
    """A separate critic's body as ``critic.model_path`` or ``memory.critic_model`` names it
    (``sim.critic_shape``); None: a copy of the policy."""

    def critic_body(self, policy: ModelShape) -> ModelShape:
        """The shape a separate critic's body is costed at."""
        return self.critic_shape.shape if self.critic_shape is not None else policy


def trained_parts(config: SimConfig) -> TrainedParts:
    """``config``'s critic and LoRA: from the training config ``memory.train_config`` names, else ``memory``'s
    keys (the module docstring)."""
    memory = config.memory
    if not memory.train_config:  # the config allows critic_model with a separate critic only
        body = critic_model_shape(memory.critic_model) if memory.critic_model is not None else None
        return TrainedParts(memory.critic, memory.lora_rank, body)
    run = load_run_config(memory.train_config)
    lora = run.trainer.lora
    critic, body = run.critic, None
    if critic is not None and critic.model_path is not None:
        body = resolve_critic_shape(critic, resolve_shape(config.model))
    return TrainedParts(
        critic.type if critic is not None else "none", lora.rank if lora is not None else 0, body
    )


def policy_train_flops(shape: ModelShape, context: float, lora_rank: int) -> float:
    """FLOPs of the policy's forward and backward on one token attending to ``context`` positions."""
    forward = shape.forward_flops_per_token(context)
    if not lora_rank:
        return 3 * forward
    frozen_weight_gradients = 2 * shape.active_params_per_token
    return 3 * forward - frozen_weight_gradients + 6 * shape.active_lora_params(lora_rank)


def no_grad_pass_flops(shape: ModelShape, context: float, lora_rank: int) -> float:
    """FLOPs of one no-grad forward of the policy (its adapters applied; a reference pass with them off costs
    2L less, which is left in)."""
    return shape.forward_flops_per_token(context) + 2 * shape.active_lora_params(lora_rank)


def critic_flops(
    shape: ModelShape, context: float, critic: str, body: ModelShape | None = None
) -> tuple[float, float]:
    """(training FLOPs, no-grad FLOPs) per trained token that ``critic`` adds to the policy's (``shape``); a
    separate critic's at its ``body`` shape (default: a copy of the policy's), over the same context."""
    if critic == "separate":
        own = body or shape
        forward = own.forward_flops_per_token(context) - 2 * own.vocab * own.hidden + 2 * (own.hidden + 1)
        return 3 * forward, forward
    head = 2 * (shape.hidden + 1)  # one forward of the value head on the policy's trunk
    if critic == "shared_trunk":
        return 3 * head, head
    if critic != "none":
        raise ValueError(f"critic must be 'none', 'separate' or 'shared_trunk', got {critic!r}")
    return 0.0, 0.0


def no_grad_passes(logprob_passes: int, critic: str) -> int:
    """The policy's no-grad forwards per trained token: ``cost.logprob_passes``, and at least one with a
    shared-trunk critic, whose step-start values ride on it."""
    return max(logprob_passes, 1) if critic == "shared_trunk" else logprob_passes


def trained_params(shape: ModelShape, parts: TrainedParts) -> tuple[int, int]:
    """(the policy's trained parameters: every weight or its adapters, the critic's: body and head or head)."""
    policy = shape.lora_params(parts.lora_rank) if parts.lora_rank else shape.num_params
    body = parts.critic_body(shape)
    separate = body.body_params + body.hidden + 1
    critic = {"none": 0, "separate": separate, "shared_trunk": shape.hidden + 1}[parts.critic]
    return policy, critic


def optimizer_bytes(shape: ModelShape, parts: TrainedParts) -> int:
    """Bytes AdamW moves per step over every trained parameter (policy or its adapters, and the critic)."""
    return ADAMW_BYTES_PER_PARAM * sum(trained_params(shape, parts))


def offloaded_state_bytes(shape: ModelShape, parts: TrainedParts, bytes_per_param: float) -> float:
    """Trainer state the colocated switch moves to host memory, ``cost.switch_offload_bytes_per_param`` read
    as its documented layers: AdamW's two fp32 moments (the first 8 B), the master weights (the next 4), the
    gradients (the rest). Moments and gradients exist for trained parameters only (LoRA: the adapters'); master
    weights for every weight, frozen or not, and the critic's."""
    moments, master, gradients = (
        min(bytes_per_param, 8),
        min(max(bytes_per_param - 8, 0), 4),
        max(bytes_per_param - 12, 0),
    )
    policy, critic = trained_params(shape, parts)
    return (moments + gradients) * (policy + critic) + master * (shape.num_params + critic)


def published_params(shape: ModelShape, lora_rank: int) -> int:
    """Parameters one weight update ships: the adapter pairs with LoRA, else every weight (the critic's are
    never synced)."""
    return shape.lora_params(lora_rank) if lora_rank else shape.num_params
