"""Fixtures for the engine tests: tiny random models built by engine_testlib."""

from __future__ import annotations

import pytest
import transformers
from engine_testlib import tiny_llama, tiny_qwen2


@pytest.fixture(scope="module")
def qwen2() -> transformers.Qwen2ForCausalLM:
    return tiny_qwen2()


@pytest.fixture(scope="module")
def llama() -> transformers.LlamaForCausalLM:
    return tiny_llama()
