"""The ROLL Flash report's bounds (Propositions 1 and 2) as pure functions, and the split they recommend.

Notation (per sample): μ_gen mean and L_gen maximum generation time on one worker, μ_train training time on
one worker, E reuse (epochs), K workers in all, N samples per step, α the async ratio, β the share of
workers that train (the rest generate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl.config.sim import SimConfig

MEAN_TOKENS = 100
"""Tokens of a mean response in ``proposition_config`` (one decode step = μ_gen / MEAN_TOKENS)."""


def queue_completion_bound(num_samples: int, num_workers: int, mu_gen: float, l_gen: float) -> float:
    """Proposition 1: Q samples on K queue-scheduled workers finish within Q·μ_gen/K + L_gen."""
    return num_samples * mu_gen / num_workers + l_gen


def sync_step_bound(n: int, k: int, mu_gen: float, l_gen: float, mu_train: float, epochs: int) -> float:
    """Proposition 2, Sync: N/K·(μ_gen + E·μ_train) + L_gen."""
    return n / k * (mu_gen + epochs * mu_train) + l_gen


def async_step_bound_at(
    beta: float, n: int, k: int, mu_gen: float, l_gen: float, mu_train: float, epochs: int, alpha: float
) -> float:
    """Proposition 2, Async at split β: max(N·μ_gen/((1-β)K) + L_gen/((α+1)(1-β)), E·N·μ_train/(βK))."""
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    generate = n * mu_gen / ((1 - beta) * k) + l_gen / ((alpha + 1) * (1 - beta))
    train = epochs * n * mu_train / (beta * k)
    return max(generate, train)


def optimal_train_share(
    n: int, k: int, mu_gen: float, l_gen: float, mu_train: float, epochs: int, alpha: float
) -> float:
    """β* = E·N·μ_train / (N·μ_gen + K·L_gen/(α+1) + E·N·μ_train): the split balancing the two pools."""
    train = epochs * n * mu_train
    return train / (n * mu_gen + k * l_gen / (alpha + 1) + train)


def async_step_bound(
    n: int, k: int, mu_gen: float, l_gen: float, mu_train: float, epochs: int, alpha: float
) -> float:
    """Proposition 2, Async at β*: N/K·(μ_gen + E·μ_train) + L_gen/(α+1)."""
    return n / k * (mu_gen + epochs * mu_train) + l_gen / (alpha + 1)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A recommended split: β*, how many of the K workers train and generate, and the two bounds."""

    beta: float
    num_train_workers: int
    num_rollout_workers: int
    alpha: float
    sync_bound_s: float
    async_bound_s: float

    @property
    def speedup_bound(self) -> float:
        return self.sync_bound_s / self.async_bound_s


def recommend(
    n: int, k: int, mu_gen: float, l_gen: float, mu_train: float, epochs: int, alpha: float
) -> Plan:
    """β* and its bounds; the worker counts round β*·K to a whole number, leaving each pool at least one."""
    if min(n, k, epochs) < 1 or k < 2:
        raise ValueError(f"N >= 1, K >= 2 and E >= 1 are needed, got N={n}, K={k}, E={epochs}")
    if min(mu_gen, mu_train, alpha) < 0 or l_gen < mu_gen:
        raise ValueError(
            f"times and alpha must be >= 0 and L_gen >= mu_gen, got {mu_gen}, {l_gen}, {mu_train}, {alpha}"
        )
    beta = optimal_train_share(n, k, mu_gen, l_gen, mu_train, epochs, alpha)
    num_train = min(k - 1, max(1, round(beta * k)))
    return Plan(
        beta=beta,
        num_train_workers=num_train,
        num_rollout_workers=k - num_train,
        alpha=alpha,
        sync_bound_s=sync_step_bound(n, k, mu_gen, l_gen, mu_train, epochs),
        async_bound_s=async_step_bound(n, k, mu_gen, l_gen, mu_train, epochs, alpha),
    )


def proposition_config(
    *,
    mu_gen: float,
    l_gen: float,
    mu_train: float,
    epochs: int,
    samples: int,
    alpha: float,
    steps: int,
    rollout_workers: int,
    train_workers: int | None,
    mode: str,
) -> SimConfig:
    """Proposition 2's abstract workload as a simulation: one engine whose ``rollout_workers`` slots are the
    generating workers (queue scheduling), lengths lognormal with mean μ_gen and at most L_gen, a trainer at
    μ_train per sample per worker; ``train_workers`` None trains on the rollout workers (colocated sync).

    The slots stand for independent single-accelerator workers fed from one queue, not a tensor-parallel
    group: ``gpus_per_engine`` stays 1 (it would split each step's compute). Used to check the simulator
    against the bounds (tests, ``bench/sim_studies.py``)."""
    from asyncrl.config.base import from_dict
    from asyncrl.config.sim import SimConfig
    from asyncrl.modes import async_ratio_for

    max_tokens = max(MEAN_TOKENS, round(MEAN_TOKENS * l_gen / mu_gen))
    trainer = {
        "num_gpus": train_workers or rollout_workers,
        "epochs": epochs,
        "gpu_s_per_token": mu_train / (MEAN_TOKENS + 1),
        "step_overhead_s": 0.0,
    }
    return from_dict(
        SimConfig,
        {
            "prompt_tokens": 1,
            "timeline": "none",
            "lengths": {"distribution": "lognormal", "mean": float(MEAN_TOKENS), "sigma": 1.0},
            "engine": {
                "max_running_requests": rollout_workers,
                "knee_batch": rollout_workers,
                "decode_step_s": mu_gen / MEAN_TOKENS,
                "weight_update_s": 0.0,
            },
            "trainer": trainer,
            "rollout": {
                "num_engines": 1,
                "rollout_batch_size": samples,
                "num_return_sequences": 1,
                "max_new_tokens": max_tokens,
            },
            "buffer": {"async_ratio": async_ratio_for(mode, alpha)},
            "controller": {"mode": mode, "num_steps": steps, "wait_for_weight_sync": False},
        },
    )
