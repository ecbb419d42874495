"""Configuration of the training loop: which paradigm runs, for how long, and how it evaluates and saves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asyncrl.modes import mode_spec


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    """The training loop ``get_batch → train_step → suspend → model_update → resume``, parameterised by mode."""

    mode: Literal["sync", "one_step_off", "async", "partial_rollout", "multi_version"] = "sync"
    """sync: rollout and training alternate (α = 0). one_step_off: batch k+1 generates while batch k trains
    (α = 1). async: rollout runs ahead up to α versions, one version per trajectory. partial_rollout: weights
    change mid-generation, per-token versions recorded, staleness bounded by start version. multi_version
    (DORA): engines serve up to ⌊α⌋ + 1 versions at once, one version per trajectory; after every update they
    are re-partitioned across versions by pending work and requests migrate with their KV cache; new prompts go
    to the newest version. What each mode fixes: ``asyncrl.modes.MODE_SPECS``; see docs/modes.md."""
    num_steps: int = 20
    """Training steps (policy updates) to run."""
    eval_prompts: int = 128
    """Held-out prompts scored before and after training (agentic runs: held-out env episodes; 0 disables the
    evaluation)."""
    eval_temperature: float = 1.0
    """Sampling temperature of the held-out evaluation (1: the policy's own distribution; 0: greedy)."""
    wait_for_weight_sync: bool = False
    """Wait until every engine runs the new weights before the next get_batch. Never needed for correctness
    (a request routed to an engine with a pending update waits for it); under the drain policy True makes every
    step wait for the longest in-flight response, the very tail asynchrony removes."""

    def __post_init__(self) -> None:
        mode_spec(self.mode)  # ModeError naming the allowed modes
        if self.num_steps < 1:
            raise ValueError(f"controller.num_steps must be >= 1, got {self.num_steps}")
        if self.eval_prompts < 0:
            raise ValueError(f"controller.eval_prompts must be >= 0, got {self.eval_prompts}")
        if self.eval_temperature < 0:
            raise ValueError(f"controller.eval_temperature must be >= 0, got {self.eval_temperature}")
