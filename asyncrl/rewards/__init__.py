"""Reward functions (registered by name or imported by path) and the concurrent, fault-tolerant service."""

from asyncrl.rewards.registry import RewardFn, get_reward, register_reward, registered_rewards
from asyncrl.rewards.service import (
    ConfiguredReward,
    RewardResult,
    RewardService,
    RewardStatus,
    make_reward_fn,
)

__all__ = [
    "ConfiguredReward",
    "RewardFn",
    "RewardResult",
    "RewardService",
    "RewardStatus",
    "get_reward",
    "make_reward_fn",
    "register_reward",
    "registered_rewards",
]
