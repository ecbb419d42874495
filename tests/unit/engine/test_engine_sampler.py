"""The sampler draws from, and reports log-probs of, exactly the documented distribution."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.engine.sampler import sample_quantiles
from asyncrl.types import SamplingParams

PROBS = [0.05, 0.5, 0.15, 0.3]  # token 1 most likely, then 3, 2, 0
LOGITS = torch.tensor([PROBS]).log()
GRID = [(i + 0.5) / 1000 for i in range(1000)]


def sample_grid(params: SamplingParams, logits: torch.Tensor = LOGITS):
    out = sample_quantiles(logits.repeat(len(GRID), 1), [params] * len(GRID), GRID)
    counts = {t: out.token_ids.count(t) / len(GRID) for t in set(out.token_ids)}
    logprob_of = dict(zip(out.token_ids, out.logprobs, strict=True))
    return counts, logprob_of


def assert_distribution(params: SamplingParams, expected: dict[int, float]):
    counts, logprob_of = sample_grid(params)
    assert set(counts) == set(expected)
    for token, p in expected.items():
        assert counts[token] == pytest.approx(p, abs=2e-3)
        assert math.exp(logprob_of[token]) == pytest.approx(p, abs=1e-6)


def test_default_params_sample_the_model_distribution():
    assert_distribution(SamplingParams(), dict(enumerate(PROBS)))


def test_temperature_sharpens_the_reported_distribution():
    scaled = [p**2 for p in PROBS]
    assert_distribution(SamplingParams(temperature=0.5), {t: s / sum(scaled) for t, s in enumerate(scaled)})


def test_top_k_keeps_the_k_most_likely_renormalised():
    assert_distribution(SamplingParams(top_k=2), {1: 0.5 / 0.8, 3: 0.3 / 0.8})


def test_top_p_keeps_the_token_that_crosses_the_mass():
    assert_distribution(SamplingParams(top_p=0.7), {1: 0.5 / 0.8, 3: 0.3 / 0.8})
    assert_distribution(SamplingParams(top_p=0.8), {1: 0.5 / 0.8, 3: 0.3 / 0.8})
    assert_distribution(SamplingParams(top_p=0.81), {1: 0.5 / 0.95, 3: 0.3 / 0.95, 2: 0.15 / 0.95})
    assert_distribution(SamplingParams(top_p=0.1), {1: 1.0})


def test_top_k_and_top_p_combine():
    assert_distribution(
        SamplingParams(top_k=3, top_p=0.9, temperature=1.0), {1: 0.5 / 0.95, 3: 0.3 / 0.95, 2: 0.15 / 0.95}
    )


def test_greedy_reports_the_temperature_one_logprob():
    out = sample_quantiles(LOGITS, [SamplingParams(temperature=0, top_k=2)], [0.99])
    assert out.token_ids == [1]
    assert out.logprobs[0] == pytest.approx(math.log(0.5), abs=1e-6)


def test_rows_do_not_influence_each_other():
    mixed = [
        SamplingParams(top_p=0.7),
        SamplingParams(temperature=0),
        SamplingParams(top_k=1),
        SamplingParams(),
    ]
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    together = sample_quantiles(logits, mixed, [0.3, 0.6, 0.9, 0.45])
    alone = [
        sample_quantiles(logits[i : i + 1], [mixed[i]], [u]) for i, u in enumerate([0.3, 0.6, 0.9, 0.45])
    ]
    assert together.token_ids == [a.token_ids[0] for a in alone]
    assert together.logprobs == pytest.approx([a.logprobs[0] for a in alone], abs=1e-6)


def test_top_k_rows_sample_the_same_through_a_partial_top_k_or_a_full_sort():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    top_k_rows = [SamplingParams(top_k=5, temperature=0.7), SamplingParams(top_k=12, top_p=0.6)]
    uniforms = [0.31, 0.87]
    partial = sample_quantiles(logits[:2], top_k_rows, uniforms)  # every truncating row has a top-k: topk(12)
    with_sort = sample_quantiles(
        logits, [*top_k_rows, SamplingParams(top_p=0.5)], [*uniforms, 0.5]
    )  # needs a sort
    assert with_sort.token_ids[:2] == partial.token_ids
    assert with_sort.logprobs[:2] == pytest.approx(partial.logprobs, abs=1e-6)
