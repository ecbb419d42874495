"""Tiny Qwen2 models: seeded construction, exact save/load round trip, tied embeddings in weight sync."""

from __future__ import annotations

import pytest
import torch

from asyncrl.models import loading
from asyncrl.models.loading import (
    load_model_and_tokenizer,
    resolve_model_path,
    save_tiny,
    state_dict_for_sync,
)
from asyncrl.models.tiny import build_tiny_model

IDS = torch.tensor([[5, 17, 42, 3, 99, 7]])


def test_config_fields_and_defaults():
    model = build_tiny_model(
        hidden_size=64, num_layers=3, num_heads=4, vocab_size=300, tie_word_embeddings=False
    )
    config = model.config
    assert config.model_type == "qwen2" and type(model).__name__ == "Qwen2ForCausalLM"
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 3, 4)
    assert (config.num_key_value_heads, config.intermediate_size, config.vocab_size) == (4, 256, 300)
    assert config.tie_word_embeddings is False and model.lm_head.weight is not model.model.embed_tokens.weight
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (0, 0)


def test_construction_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected_draw = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_model(hidden_size=32, num_heads=2, num_layers=1, vocab_size=300, seed=5)
    assert torch.equal(torch.rand(1), expected_draw)
    b = build_tiny_model(hidden_size=32, num_heads=2, num_layers=1, vocab_size=300, seed=5)
    c = build_tiny_model(hidden_size=32, num_heads=2, num_layers=1, vocab_size=300, seed=6)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_heads_must_divide_hidden_size():
    with pytest.raises(ValueError, match=r"hidden_size \(30\) must be divisible by num_heads \(4\)"):
        build_tiny_model(hidden_size=30, num_heads=4)


def test_save_and_load_give_the_same_logits_and_keep_the_tie(tiny_pair, tiny_dir):
    model, _ = tiny_pair
    loaded, _ = load_model_and_tokenizer(str(tiny_dir), "float32", "cpu")
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, model(IDS).logits)


def test_untied_model_round_trips(tmp_path, tiny_pair):
    _, tokenizer = tiny_pair
    model = build_tiny_model(
        hidden_size=32, num_heads=2, num_layers=1, vocab_size=len(tokenizer), tie_word_embeddings=False
    )
    loaded, _ = load_model_and_tokenizer(str(save_tiny(model, tokenizer, tmp_path)), device="cpu")
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, model(IDS).logits)


def test_load_casts_to_the_requested_dtype(tiny_dir):
    loaded, _ = load_model_and_tokenizer(str(tiny_dir), "bfloat16", "cpu")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_sync_state_dict_updates_an_untied_receiver_fully(tiny_pair):
    """A tied sender's tensors make an untied receiver identical; names from named_parameters would not."""
    sender, _ = tiny_pair
    receiver = build_tiny_model(hidden_size=64, num_heads=2, num_layers=2, vocab_size=sender.config.vocab_size,
                                tie_word_embeddings=False, seed=99)  # fmt: skip
    assert "lm_head.weight" not in dict(
        sender.named_parameters()
    )  # the trap: shared tensors are deduplicated
    tensors = state_dict_for_sync(sender)
    assert torch.equal(tensors["lm_head.weight"], sender.model.embed_tokens.weight)
    receiver.load_state_dict(tensors, strict=True)
    with torch.no_grad():
        assert torch.equal(receiver(IDS).logits, sender(IDS).logits)


def test_missing_model_directory_is_named(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=f"model.path: no model directory \\(config.json\\) at {tmp_path}"
    ):
        resolve_model_path(str(tmp_path))
    with pytest.raises(ValueError, match="dtype must be one of 'float32', 'bfloat16', 'float16', got 'int8'"):
        load_model_and_tokenizer(str(tmp_path), "int8")


def test_empty_path_means_the_embedded_default(monkeypatch, tiny_dir, tmp_path):
    monkeypatch.setattr(loading, "DEFAULT_MODEL_DIR", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="the embedded default model: no model directory"):
        resolve_model_path("")
    monkeypatch.setattr(loading, "DEFAULT_MODEL_DIR", tiny_dir)
    assert resolve_model_path("") == tiny_dir


def test_auto_device_follows_cuda_availability():
    assert loading.resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert loading.resolve_device("cpu") == torch.device("cpu")
