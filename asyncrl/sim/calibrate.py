"""Fitting the simulator's cost models to micro-measurements, and scoring its predictions of real runs
(``bench/sim_vs_real.py``).

Key decision: every fit is a closed-form least-squares fit of the cost model's own formula, so the fitted
parameters mean exactly what ``asyncrl.sim.cost`` does with them (no free shape the simulator cannot replay),
and the points come from the bare parts (engine, trainer, weight transport), never from the runs predicted.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points, neither below 0.

    Why the constraint: a fixed cost or a cost per unit cannot be negative, and a few noisy points with little
    spread in ``xs`` (train steps of nearly equal size) can tilt the line either way. A negative slope gives
    the flat fit (the mean of ``ys``), a negative intercept the best line through the origin.
    """
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"fit_line needs as many xs as ys and at least one point, got {len(xs)}, {len(ys)}")
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return mean_y, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    if slope <= 0:
        return mean_y, 0.0
    intercept = mean_y - slope * mean_x
    if intercept < 0:
        return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return intercept, slope


@dataclass(frozen=True, kw_only=True)
class EngineProfile:
    """One batch size of a profiling pass over the bare engine: ``batch`` requests of ``prompt_tokens``
    tokens joined at once; the first step prefills them all, the later ones only decode."""

    batch: int
    prompt_tokens: int
    first_step_s: float
    decode_step_s: float
    """Median of the decode-only steps."""


@dataclass(frozen=True, kw_only=True)
class EngineCosts:
    """The ``SimEngineConfig`` fields a profile gives (one accelerator; knee at the profiled maximum)."""

    decode_step_s: float
    decode_s_per_request: float
    prefill_s_per_token: float


def fit_engine(profile: Sequence[EngineProfile]) -> EngineCosts:
    """Decode step ``a + b · batch`` (the knee model with its knee past every batch, plus the per-request
    term: on a CPU a step grows with the batch from the first row), and prefill per prompt token as the
    median over batches of (first step - decode step) / (batch x prompt tokens)."""
    if not profile:
        raise ValueError("fit_engine needs at least one profiled batch")
    fixed, per_request = fit_line([p.batch for p in profile], [p.decode_step_s for p in profile])
    prefill = [max(0.0, p.first_step_s - p.decode_step_s) / (p.batch * p.prompt_tokens) for p in profile]
    if fixed <= 0:  # the cost model needs a positive step; a line through the origin puts it all per request
        fixed, per_request = per_request, 0.0
    return EngineCosts(
        decode_step_s=fixed, decode_s_per_request=per_request, prefill_s_per_token=statistics.median(prefill)
    )


def concurrent_slowdown(alone_s: Sequence[float], beside_s: Sequence[float]) -> float:
    """``trainer.concurrent_slowdown``: the median train step beside a generating engine over the median
    alone, at least 1 (the cost model only slows training down)."""
    if not alone_s or not beside_s:
        raise ValueError("concurrent_slowdown needs train steps timed both alone and beside an engine")
    return max(1.0, statistics.median(beside_s) / statistics.median(alone_s))


PASS_RATE_CONCENTRATION_BOUNDS = (0.01, 1e6)
"""Limits of the fitted Beta's ``alpha + beta``: near 0 every prompt is all-right or all-wrong, near the upper
limit every prompt has the same pass rate (no overdispersion left to explain)."""


def fit_pass_rates(rewards_per_prompt: Sequence[Sequence[float]]) -> tuple[float, float]:
    """``(pass_rate_alpha, pass_rate_beta)`` of ``SimRewardConfig`` from rewards sampled ``n`` times per prompt.

    Why a beta-binomial moment fit rather than a Beta fit to each prompt's observed mean: with a few samples
    per prompt the observed means spread far wider than the pass rates behind them, and what dynamic
    filtering drops (groups whose rewards are all equal) depends on exactly that spread. The mean reward
    gives ``alpha / (alpha + beta)``; the variance of the per-prompt reward sums against the binomial one
    gives the concentration ``alpha + beta`` (Var = n m (1 - m) (s + n) / (s + 1)).
    """
    sizes = {len(rewards) for rewards in rewards_per_prompt}
    if len(rewards_per_prompt) < 2 or len(sizes) != 1 or min(sizes) < 2:
        raise ValueError("fit_pass_rates needs >= 2 prompts with the same number (>= 2) of rewards each")
    n = sizes.pop()
    if any(not 0.0 <= reward <= 1.0 for rewards in rewards_per_prompt for reward in rewards):
        raise ValueError("fit_pass_rates needs rewards in [0, 1]")
    sums = [sum(rewards) for rewards in rewards_per_prompt]
    mean = statistics.fmean(sums) / n
    if mean in (0.0, 1.0):
        raise ValueError(f"every sampled reward is {mean:g}: no pass rate to fit beyond it")
    dispersion = statistics.pvariance(sums) / (n * mean * (1 - mean))
    low, high = PASS_RATE_CONCENTRATION_BOUNDS
    concentration = high if dispersion <= 1 else (n - dispersion) / (dispersion - 1)
    concentration = min(high, max(low, concentration))
    return mean * concentration, (1 - mean) * concentration


def write_lengths_jsonl(lengths: Iterable[int], path: str | Path) -> Path:
    """Write lengths one per line, the format ``lengths.distribution: empirical`` reads."""
    path = Path(path)
    path.write_text("".join(json.dumps(int(length)) + "\n" for length in lengths))
    return path


def prediction(real_runs: Sequence[float], simulated: float) -> dict[str, float | bool]:
    """How a simulated value compares with repeated real ones: the real runs' min/median/max, the signed
    error of the prediction against the median (``simulated / median - 1``), and whether it lies within
    the real spread (min to max)."""
    if not real_runs:
        raise ValueError("prediction needs at least one real run")
    median = statistics.median(real_runs)
    if not median > 0:
        raise ValueError(f"the real median must be > 0, got {median}")
    return {
        "real_min": min(real_runs),
        "real_median": median,
        "real_max": max(real_runs),
        "simulated": simulated,
        "error_vs_median": simulated / median - 1,
        "within_real_spread": min(real_runs) <= simulated <= max(real_runs),
    }
