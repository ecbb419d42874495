"""Counter-based sampling uniforms: u = f(seed, position), computed on the logits' device with no state.

Why stateless: a request's uniform for its n-th output token depends only on its seed and n, so a seeded request
samples the same tokens run to run, on CPU or CUDA, alone or in any batch, and after an interruption or a
migration (nothing but the seed travels; the position is the number of output tokens so far). The hash is
splitmix64's finaliser written in int64 tensor ops (multiplication wraps modulo 2^64, right shifts are made
logical by masking), so every device computes the same bits; ``reference_uniform`` is the same function in
Python integers, which the tests hold the tensor version to.
"""

from __future__ import annotations

import torch

_GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1
_BITS = 24
"""Uniform bits kept: every multiple of 2^-24 in [0, 1) is exact in float32, the dtype the sampler compares in."""


def as_int64(value: int) -> int:
    """``value`` modulo 2^64 as a signed 64-bit integer (any Python int seed fits an int64 tensor this way)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def counter_uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One float32 uniform in [0, 1) per (seed, position) pair of two int64 tensors, on their device."""
    key = _mix(seeds)
    bits = _mix(key + (positions + 1) * as_int64(_GAMMA))
    return _shift_right(bits, 64 - _BITS).float() * 2.0**-_BITS


def reference_uniform(seed: int, position: int) -> float:
    """``counter_uniforms`` for one pair, in plain Python integers."""
    key = _mix_int(seed & _MASK64)
    bits = _mix_int((key + (position + 1) * _GAMMA) & _MASK64)
    return (bits >> (64 - _BITS)) * 2.0**-_BITS


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic: it copies the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shift_right(z, 30)) * as_int64(_MUL1)
    z = (z ^ _shift_right(z, 27)) * as_int64(_MUL2)
    return z ^ _shift_right(z, 31)


def _mix_int(z: int) -> int:
    z = ((z ^ (z >> 30)) * _MUL1) & _MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & _MASK64
    return z ^ (z >> 31)
