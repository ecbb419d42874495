"""Fixtures for the engine tests: tiny random models built by engine_testlib, and vLLM's modules faked."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest
import transformers
from engine_testlib import tiny_llama, tiny_qwen2


@pytest.fixture(scope="module")
def qwen2() -> transformers.Qwen2ForCausalLM:
    return tiny_qwen2()


@pytest.fixture(scope="module")
def llama() -> transformers.LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture
def fake_vllm_modules(monkeypatch):
    """``vllm.SamplingParams`` and ``RequestOutputKind``, as the worker's ``op_add`` imports them."""
    vllm = ModuleType("vllm")
    vllm.SamplingParams = lambda **kwargs: kwargs
    sampling_params = ModuleType("vllm.sampling_params")
    sampling_params.RequestOutputKind = SimpleNamespace(DELTA="delta")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling_params)
