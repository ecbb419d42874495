"""The generation-bound workload has the long tail the issue asks for, and its model builds into a cache dir."""

from __future__ import annotations

import numpy as np
from transformers import AutoModelForCausalLM

from bench.workloads import GENERATION_BOUND, QUICK, cached_model_dir


def test_generation_bound_lengths_are_long_tailed_and_k_exceeds_n() -> None:
    lengths = GENERATION_BOUND.lengths.sample(10_000, seed=0)
    assert np.percentile(lengths, 99) / np.median(lengths) >= 8
    assert GENERATION_BOUND.max_running_requests > GENERATION_BOUND.samples_per_step
    assert GENERATION_BOUND.samples_per_prompt > 1


def test_model_is_built_once_into_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ASYNCRL_BENCH_CACHE", str(tmp_path))
    first = cached_model_dir(QUICK)
    mtime = (first / "config.json").stat().st_mtime
    assert cached_model_dir(QUICK) == first and (first / "config.json").stat().st_mtime == mtime
    model = AutoModelForCausalLM.from_pretrained(first)
    assert (
        model.config.hidden_size == QUICK.model.hidden
        and model.config.intermediate_size == QUICK.model.intermediate
    )
