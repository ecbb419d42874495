"""The root run configuration: one section per part, composed here and loaded from YAML plus overrides.

Adding a part's section is one field below (with its docstring); loading, overrides, ``config show`` and
``config docs`` pick it up from the type hints.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig, check_mode_async_ratio, check_mode_update_policy
from asyncrl.config.engine import EngineConfig
from asyncrl.config.loader import load_config
from asyncrl.config.model import ModelConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.reward import RewardConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.config.task import TaskConfig
from asyncrl.config.trainer import TrainerConfig


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything one asyncrl run needs; ``asyncrl config show`` prints it resolved."""

    seed: int = 0
    """Seed of the run: data order, sampling seeds and model initialisation derive from it."""
    output_dir: str = "runs/default"
    """Directory for checkpoints, metrics and the resolved config of this run."""
    resume: str = ""
    """A checkpoint directory to continue from (model, optimizer, step, data position); empty starts fresh."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The built-in rollout engine (each replica)."""
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    """Routing, timeouts and health of the LLM proxy over the engines."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The prompts trained and evaluated on."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """How responses are verified."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Batch shape, sampling, queue scheduling, replication and filtering."""
    buffer: BufferConfig = field(default_factory=BufferConfig)
    """The async ratio and the buffer's timeouts."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """The paradigm (mode), number of steps and evaluation."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Optimisation: learning rate, epochs, micro-batching, checkpoints."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The policy loss, KL penalty and train-inference mismatch correction."""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """The advantage estimator."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Where the parts run: one process (inline), Ray actors on this machine (local) or a Ray cluster."""

    def __post_init__(self) -> None:
        if not self.output_dir:
            raise ValueError("output_dir must not be empty")
        check_mode_async_ratio(self.controller.mode, self.buffer.async_ratio)
        check_mode_update_policy(self.controller.mode, self.proxy.update_policy)


def load_run_config(path: str | os.PathLike[str] | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a run config from a YAML file (None: defaults only) with dotted overrides such as ``engine.seed=3``."""
    return load_config(RunConfig, path, overrides)
