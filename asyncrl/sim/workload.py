"""The simulated workload: response lengths and reward outcomes as pure functions of (seed, request id).

Request ids are ``"{uid}@{epoch}#{index}"`` (the producer's), so every draw is reproducible whichever
engine or step a request lands in, and a continued request keeps its length. A prompt's own factors (its
length scale and pass rate) depend on its uid only: the same prompt is as hard in every epoch.
"""

from __future__ import annotations

import json
import math
import random
import zlib
from collections.abc import Sequence
from pathlib import Path

from asyncrl.config.sim import LengthConfig, SimRewardConfig


def prompt_uid(request_id: str) -> str:
    """The dataset uid of a request id ``uid@epoch#index`` (the request id itself if it has no ``@``)."""
    return request_id.rpartition("#")[0].rpartition("@")[0] or request_id


def unit_hash(seed: int, text: str) -> float:
    """A uniform number in [0, 1) from (seed, text): cheap and stable across processes."""
    return zlib.crc32(f"{seed}\0{text}".encode()) / 2**32


def read_empirical_lengths(path: str) -> list[int]:
    """Lengths from a JSONL file: one number, or an object with a ``length`` key, per line."""
    lengths = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        value = row["length"] if isinstance(row, dict) else row
        if not isinstance(value, int | float) or value < 1:
            raise ValueError(f"{path}:{number}: a length must be a number >= 1, got {value!r}")
        lengths.append(int(value))
    if not lengths:
        raise ValueError(f"{path}: no lengths found")
    return lengths


class LengthModel:
    """``length(request_id)``: the tokens a response would run to, clipped to [1, max_new_tokens]."""

    def __init__(self, config: LengthConfig, max_new_tokens: int, seed: int) -> None:
        self.config = config
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self._empirical: Sequence[int] = read_empirical_lengths(config.path) if config.path else ()
        self._prompt_factors: dict[str, float] = {}

    def __call__(self, request_id: str) -> int:
        uid = prompt_uid(request_id)
        key = uid if self.config.per_prompt else request_id
        rng = random.Random(zlib.crc32(f"{self.seed}\0{key}".encode()))
        raw = self._draw(rng) * self._prompt_factor(uid)
        return max(1, min(self.max_new_tokens, round(raw)))

    def _draw(self, rng: random.Random) -> float:
        cfg = self.config
        if cfg.distribution == "constant":
            return cfg.mean
        if cfg.distribution == "lognormal":
            return cfg.mean * math.exp(cfg.sigma * rng.gauss(0.0, 1.0) - cfg.sigma**2 / 2)
        if cfg.distribution == "pareto":
            scale = cfg.mean * (cfg.pareto_shape - 1) / cfg.pareto_shape
            return scale * (1.0 - rng.random()) ** (-1.0 / cfg.pareto_shape)
        return float(rng.choice(self._empirical))

    def _prompt_factor(self, uid: str) -> float:
        sigma = self.config.prompt_sigma
        if sigma == 0:
            return 1.0
        if uid not in self._prompt_factors:
            rng = random.Random(zlib.crc32(f"{self.seed}\0prompt\0{uid}".encode()))
            self._prompt_factors[uid] = math.exp(sigma * rng.gauss(0.0, 1.0) - sigma**2 / 2)
        return self._prompt_factors[uid]


class PassRates:
    """Per-prompt pass rate ~ Beta(alpha, beta) and a Bernoulli reward per response."""

    def __init__(self, config: SimRewardConfig, seed: int) -> None:
        self.config = config
        self.seed = seed
        self._rates: dict[str, float] = {}

    def rate(self, uid: str) -> float:
        if uid not in self._rates:
            rng = random.Random(zlib.crc32(f"{self.seed}\0rate\0{uid}".encode()))
            self._rates[uid] = rng.betavariate(self.config.pass_rate_alpha, self.config.pass_rate_beta)
        return self._rates[uid]

    def reward(self, request_id: str) -> float:
        """1.0 with the prompt's pass rate, else 0.0; fixed per request id."""
        return float(unit_hash(self.seed, request_id) < self.rate(prompt_uid(request_id)))
