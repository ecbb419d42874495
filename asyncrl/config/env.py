"""Configuration of agentic rollout: which environment, and how the EnvManagers run their episodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config.env_kinds import EnvFaultConfig, GymnasiumConfig, SokobanConfig, ToolUseConfig

BUILTIN_ENVS = ("count_chain", "copy_chain", "sokoban", "tool_use", "gymnasium")


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """The environment each EnvManager runs; built by ``asyncrl.envs.make_env``."""

    type: str = "count_chain"
    """'count_chain' (built-in multi-turn counting game), 'copy_chain' (built-in multi-turn copying game in
    the format of the default ``copy`` task), 'sokoban' (text Sokoban, ``env.sokoban``), 'tool_use' (arithmetic
    with a calculator and a sandboxed Python tool, ``env.tool_use``), 'gymnasium' (any text gymnasium env,
    ``env.gymnasium``), or a dotted path 'pkg.module:factory' to a callable taking this
    config and returning an Env."""
    num_turns: int = 3
    """count_chain, copy_chain: requests per episode (the episode terminates after the last answer)."""
    max_start: int = 50
    """count_chain: the first number of an episode is drawn from 1..max_start."""
    min_span: int = 2
    """count_chain: fewest numbers asked for in one turn."""
    max_span: int = 4
    """count_chain: most numbers asked for in one turn."""
    median_items: float = 3.0
    """copy_chain: median number of letters to copy in one turn (long-tailed like the ``copy`` task's
    ``task.median_items``; the defaults here are the ones ``tiny-copy`` was trained on)."""
    length_sigma: float = 1.0
    """copy_chain: sigma of the log-normal number of letters; larger makes the length tail longer."""
    max_items: int = 40
    """copy_chain: letters per turn are clipped to [1, max_items]; bounds the longest answer."""
    sokoban: SokobanConfig = field(default_factory=SokobanConfig)
    """sokoban: room size, boxes, difficulty and rewards."""
    tool_use: ToolUseConfig = field(default_factory=ToolUseConfig)
    """tool_use: questions, tools and penalties."""
    gymnasium: GymnasiumConfig = field(default_factory=GymnasiumConfig)
    """gymnasium: which gymnasium env and how actions are named."""
    faults: EnvFaultConfig = field(default_factory=EnvFaultConfig)
    """Any type: latency and faults injected around the env (experiments; all off by default)."""

    def __post_init__(self) -> None:
        if self.type not in BUILTIN_ENVS and ":" not in self.type:
            raise ValueError(
                f"env.type must be one of {', '.join(map(repr, BUILTIN_ENVS))} or a dotted path "
                f"'pkg.module:factory', got {self.type!r}"
            )
        for name in ("num_turns", "max_start", "min_span", "max_items"):
            if getattr(self, name) < 1:
                raise ValueError(f"env.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_span < self.min_span:
            raise ValueError(f"env.max_span must be >= env.min_span={self.min_span}, got {self.max_span}")
        if not 1.0 <= self.median_items <= self.max_items:
            raise ValueError(
                f"env.median_items must be in [1, env.max_items={self.max_items}], got {self.median_items}"
            )
        if self.length_sigma < 0:
            raise ValueError(f"env.length_sigma must be >= 0, got {self.length_sigma}")
        if self.type == "gymnasium" and not self.gymnasium.id:
            raise ValueError("env.gymnasium.id must name a gymnasium env for env.type 'gymnasium'")


@dataclass(frozen=True, kw_only=True)
class EnvManagerConfig:
    """How episodes are run: env groups, redundancy, env-level async vs batch stepping, timeouts.

    A training step takes ``rollout.rollout_batch_size`` groups of ``rollout.num_return_sequences``
    trajectories. Each env group resets ``group_size`` envs with one seed and completes once
    ``rollout.num_return_sequences`` of its episodes have ended trainable; ``num_env_groups`` groups run at
    once. Either count above the batch's needs is redundancy against slow and failing environments.
    """

    num_env_groups: int = 8
    """Env groups running at once; beyond ``rollout.rollout_batch_size`` they are redundant, and the ones
    still running when their batch is trained are aborted and recorded."""
    group_size: int = 8
    """Episodes (envs) per group, all reset with the group's seed; beyond ``rollout.num_return_sequences``
    the slowest episodes of a group are aborted and recorded once enough have finished."""
    stepping: Literal["async", "batch"] = "async"
    """async: each env steps as soon as its own response is ready and asks for the next one at once
    (environment-level async rollout). batch: the baseline, every episode of a round waits for all the others
    after each generation and after each env step."""
    step_timeout_s: float = 600.0
    """An env reset or step taking longer fails its episode (recorded) and the env is replaced."""
    episode_replays: int = 0
    """Failed episodes (env error or timeout) a group may play again, each on its slot's replaced env with the
    group's seed, when the group's running episodes could no longer give it ``rollout.num_return_sequences``
    trainable ones. 0: a group whose episodes fail is trained short (fewer samples), at once. Above 0 groups stay
    full, as ROLL's GroupQueue requires (a group is ready only with group_size trajectories), and a failure
    costs the replay's time unless redundant episodes (``group_size`` above the group) cover it. Async
    stepping only (a replay cannot join a batch round's lockstep)."""
    max_turns: int = 16
    """An episode still running after this many model turns ends as truncated."""
    max_context_tokens: int = 4096
    """An episode whose next request (context + rollout.max_new_tokens) would exceed this ends as truncated."""
    chat_format: Literal["plain", "template"] = "plain"
    """plain: observations are appended as they are (the built-in environments' format). template: each
    observation is a user message of the tokenizer's chat template (an env's ``tools`` attribute rendered
    into the first), each response closed as the template closes an assistant turn; responses stay the tokens
    sampled, so a template that rewrites earlier turns changes nothing already in the context."""

    def __post_init__(self) -> None:
        for name in ("num_env_groups", "group_size", "max_turns", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"env_manager.{name} must be >= 1, got {getattr(self, name)}")
        if self.stepping not in ("async", "batch"):
            raise ValueError(f"env_manager.stepping must be one of 'async', 'batch', got {self.stepping!r}")
        if self.episode_replays < 0:
            raise ValueError(f"env_manager.episode_replays must be >= 0, got {self.episode_replays}")
        if self.episode_replays and self.stepping != "async":
            raise ValueError(
                f"env_manager.episode_replays={self.episode_replays} needs env_manager.stepping='async' (a "
                f"replay cannot join a batch round's lockstep), got {self.stepping!r}"
            )
        if self.step_timeout_s <= 0:
            raise ValueError(f"env_manager.step_timeout_s must be > 0, got {self.step_timeout_s}")
        if self.chat_format not in ("plain", "template"):
            raise ValueError(
                f"env_manager.chat_format must be 'plain' or 'template', got {self.chat_format!r}"
            )


def check_env_manager_fits(manager: EnvManagerConfig, group_size: int, groups_per_batch: int) -> None:
    """Env groups must be able to fill a batch: ``group_size >= rollout.num_return_sequences`` and
    ``num_env_groups >= rollout.rollout_batch_size``."""
    if manager.group_size < group_size:
        raise ValueError(
            f"env_manager.group_size={manager.group_size} must be >= rollout.num_return_sequences={group_size}"
        )
    if manager.num_env_groups < groups_per_batch:
        raise ValueError(
            f"env_manager.num_env_groups={manager.num_env_groups} must be >= "
            f"rollout.rollout_batch_size={groups_per_batch}"
        )
