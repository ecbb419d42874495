"""Configuration of the training loop: which paradigm runs, for how long, and how it evaluates and saves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config.task import TaskConfig
from asyncrl.modes import ModeError, mode_spec


@dataclass(frozen=True, kw_only=True)
class EvalSetConfig:
    """One held-out set scored during training (``controller.eval_every``)."""

    name: str
    """Names its metrics: ``eval/<name>/mean@k``, ``eval/<name>/pass@k``, ... (letters, digits, - and _)."""
    size: int = 128
    """Prompts scored: the first ``size`` of the set's eval split (agentic runs: held-out env episodes)."""
    temperature: float = 1.0
    """Sampling temperature (1: the policy's own distribution; 0: greedy). The rest of the sampling is the
    run's: ``rollout.top_p``, ``top_k`` and ``stop_strings`` apply here as in rollouts."""
    samples_per_prompt: int = 1
    """Answers sampled per prompt, k of pass@k (a prompt passes when one answer earns ``pass_reward``) and
    mean@k (the mean reward over all answers). Agentic runs: 1."""
    pass_reward: float = 1.0
    """The reward an answer needs to count as a pass."""
    max_new_tokens: int | None = None
    """Longest answer; null: ``rollout.max_new_tokens``."""
    task: TaskConfig | None = None
    """Another dataset (its eval split; e.g. MATH-500 beside a GSM8K run); null: the run's own task."""

    def __post_init__(self) -> None:
        where = f"controller.eval_sets[{self.name}]"
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"controller.eval_sets name must be letters, digits, - and _, got {self.name!r}")
        for name in ("size", "samples_per_prompt"):
            if getattr(self, name) < 1:
                raise ValueError(f"{where}.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"{where}.temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"{where}.max_new_tokens must be >= 1 or null, got {self.max_new_tokens}")


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
    """Sampling temperature of the held-out evaluation (1: the policy's own distribution; 0: greedy). The rest of
    the sampling is the run's: ``rollout.top_p``, ``top_k`` and ``stop_strings`` apply as in rollouts."""
    eval_every: int = 0
    """Score ``eval_sets`` every this many steps during training (and at the last step), logged with the step's
    metrics under ``eval/<set>/...`` with the policy version evaluated; 0: only before and after the run."""
    eval_sets: list[EvalSetConfig] = field(default_factory=list)
    """The held-out sets of ``eval_every``; empty: one set ``heldout`` of ``eval_prompts`` prompts of the run's
    task at ``eval_temperature``, one answer each."""
    eval_share: float = 0.25
    """Async modes: the most of the engines' request slots evaluation may hold at once, so rollout keeps
    going beside it (sync mode evaluates at its barrier, with every slot)."""
    wait_for_weight_sync: bool = False
    """Wait until every engine runs the new weights before the next get_batch. Never needed for correctness
    (a request routed to an engine with a pending update waits for it); under the drain policy True makes every
    step wait for the longest in-flight response, the very tail asynchrony removes."""
    wait_for_older: bool | None = None
    """Whether a batch also waits for older admitted groups still generating that it would otherwise leave to go
    stale (earliest deadline first), so that no admitted group is reclaimed as a straggler: ROLL Flash's
    get_batch, which drains the oldest step's prompts first ("no sample is wasted"). False: the batch takes
    the first B fresh groups to finish and late ones are reclaimed (wasted work, a shorter wait at small α).
    null: the mode decides (``multi_version`` waits, the others do not); ``multi_version`` refuses False."""

    def __post_init__(self) -> None:
        spec = mode_spec(self.mode)  # ModeError naming the allowed modes
        if spec.multi_version and self.wait_for_older is False:
            raise ModeError(
                "controller.mode='multi_version' trains no admitted group stale: controller.wait_for_older "
                "must be true or null, got false"
            )
        if self.num_steps < 1:
            raise ValueError(f"controller.num_steps must be >= 1, got {self.num_steps}")
        if self.eval_prompts < 0:
            raise ValueError(f"controller.eval_prompts must be >= 0, got {self.eval_prompts}")
        if self.eval_temperature < 0:
            raise ValueError(f"controller.eval_temperature must be >= 0, got {self.eval_temperature}")
        if self.eval_every < 0:
            raise ValueError(f"controller.eval_every must be >= 0, got {self.eval_every}")
        if not 0 < self.eval_share <= 1:
            raise ValueError(f"controller.eval_share must be in (0, 1], got {self.eval_share}")
        names = [s.name for s in self.eval_sets]
        if len(set(names)) != len(names):
            raise ValueError(f"controller.eval_sets names must be unique, got {names}")

    @property
    def waits_for_older(self) -> bool:
        """``wait_for_older`` resolved: the mode's choice where it is null."""
        if self.wait_for_older is None:
            return mode_spec(self.mode).multi_version
        return self.wait_for_older

    def periodic_eval_sets(self) -> list[EvalSetConfig]:
        """The sets ``eval_every`` scores (the default one when none is named)."""
        if self.eval_sets:
            return list(self.eval_sets)
        size = max(self.eval_prompts, 1)
        return [EvalSetConfig(name="heldout", size=size, temperature=self.eval_temperature)]
