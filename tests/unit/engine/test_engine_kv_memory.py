"""The engine refuses a KV pool that cannot fit, naming the setting to lower, before allocating any of it."""

from __future__ import annotations

import pytest
import torch
import transformers

from asyncrl.config.engine import EngineConfig
from asyncrl.engine import llm_engine
from asyncrl.engine.kv_cache import KVCache, available_bytes, pool_bytes
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.engine.model_runner import kv_dimensions
from asyncrl.testing.models import tiny_qwen2

MIB = 2**20


def test_pool_bytes_is_what_the_cache_allocates() -> None:
    dims = kv_dimensions(tiny_qwen2())
    cache = KVCache(num_slots=3, max_len=17, device=torch.device("cpu"), **dims)
    allocated = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))
    assert pool_bytes(num_slots=3, max_len=17, **dims) == allocated


def test_host_memory_is_readable_here() -> None:
    free = available_bytes(torch.device("cpu"))
    assert free is not None and free > 0


def test_a_pool_larger_than_free_memory_is_refused_naming_the_settings(monkeypatch) -> None:
    model = tiny_qwen2()
    pool = pool_bytes(num_slots=64, max_len=128, **kv_dimensions(model))
    monkeypatch.setattr(llm_engine, "available_bytes", lambda device: pool // 2)
    with pytest.raises(ValueError) as refused:
        LLMEngine(model, config=EngineConfig(max_running_requests=64))
    message = str(refused.value)
    for named in ("engine.max_model_len", "engine.max_running_requests", "max_position_embeddings"):
        assert named in message
    fitting = int(message.split("at most ")[1].split()[0])
    assert 0 < fitting < 128
    # the length the message offers does fit
    LLMEngine(model, config=EngineConfig(max_running_requests=64, max_model_len=fitting))


def test_the_error_names_max_model_len_when_that_set_the_length(monkeypatch) -> None:
    monkeypatch.setattr(llm_engine, "available_bytes", lambda device: 1)
    with pytest.raises(ValueError, match=r"from engine.max_model_len;"):
        LLMEngine(tiny_qwen2(), config=EngineConfig(max_model_len=100))


def test_a_real_models_default_context_is_refused_on_a_16_gib_device(monkeypatch) -> None:
    """Qwen2-0.5B's shape (on the meta device: nothing allocated) with the defaults: 64 slots of its 32 k
    window would take ~48 GiB; the check says so instead of the process dying while zeroing the pool."""
    config = transformers.Qwen2Config(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        max_position_embeddings=32768,
    )
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(config)
    monkeypatch.setattr(llm_engine, "available_bytes", lambda device: 16 * 1024 * MIB)
    with pytest.raises(ValueError, match=r"needs 48\.0 GiB .*from the model's max_position_embeddings"):
        llm_engine.check_kv_pool_fits(model, EngineConfig(), min(32768, EngineConfig().max_kv_tokens))


def test_cuda_memory_this_process_has_cached_counts_as_available(monkeypatch) -> None:
    """The float32 weights an engine casts to bfloat16 in place stay in PyTorch's cache, which
    ``mem_get_info`` counts as used: reserved-but-unallocated bytes on the engine's device are available."""
    device = torch.device("cuda", 1)
    asked = []

    def reading(value):
        def read(where):
            asked.append(where)
            return value

        return read

    monkeypatch.setattr(torch.cuda, "mem_get_info", reading((10 * MIB, 80 * 1024 * MIB)))
    monkeypatch.setattr(torch.cuda, "memory_reserved", reading(40 * MIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", reading(15 * MIB))
    assert available_bytes(device) == 10 * MIB + 25 * MIB
    assert asked == [device] * 3


def test_the_pool_check_counts_the_cast_away_weights(monkeypatch) -> None:
    """A pool that fits only with the cached bytes counted is accepted; without them it is refused."""
    model = tiny_qwen2()
    need = pool_bytes(num_slots=4, max_len=128, **kv_dimensions(model))
    monkeypatch.setattr(llm_engine, "available_bytes", lambda device: available_bytes(torch.device("cuda")))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda where: (need // 2, 4 * need))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda where: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda where: need)
    llm_engine.check_kv_pool_fits(model, EngineConfig(max_running_requests=4), 128)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda where: 0)
    with pytest.raises(ValueError, match="engine.max_model_len"):
        llm_engine.check_kv_pool_fits(model, EngineConfig(max_running_requests=4), 128)
