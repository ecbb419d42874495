"""Sharded loading fills every rank's shards with the right rows: three FSDP2 ranks (uneven chunks) load a tied
Qwen2 saved in bfloat16 over several indexed files into float32 shards; the gathered model equals
``from_pretrained``'s in float32, buffers (rotary ``inv_freq``) and the tied output layer included. A file that
disagrees with the model fails by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.config.model import ModelConfig
from asyncrl.models.loading import load_configured_model, load_configured_skeleton, load_tokenizer, save_tiny
from asyncrl.models.tiny import build_tiny_model
from asyncrl.testing.ranks import run_ranks


def _save(directory: Path, **shape: int) -> str:
    model = build_tiny_model(
        hidden_size=96, num_heads=4, num_kv_heads=2, num_layers=2, vocab_size=301, **shape
    )
    model = model.to(torch.bfloat16)
    model.save_pretrained(directory, max_shard_size="100KB")  # several files and an index
    load_tokenizer("").save_pretrained(directory)
    return str(directory)


def _gathered(path: str) -> tuple[dict[str, torch.Tensor], bool] | None:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    model, _ = load_configured_skeleton(ModelConfig(path=path))
    FullyShardedParallel("cpu", weights=Path(path)).shard(model)
    state = {n: (t.full_tensor() if hasattr(t, "full_tensor") else t) for n, t in model.state_dict().items()}
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    return (state, tied) if torch.distributed.get_rank() == 0 else None


def test_three_ranks_load_their_rows_of_an_indexed_bfloat16_model(tmp_path: Path):
    path = _save(tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors.index.json").is_file()
    state, tied = run_ranks(_gathered, 3, path)[0]
    want = load_configured_model(ModelConfig(path=path, device="cpu"))[0].state_dict()
    assert tied
    assert state.keys() == want.keys()
    for name, tensor in want.items():
        assert state[name].dtype == torch.float32, name
        assert torch.equal(state[name], tensor), name


def _shard_from(path: str, weights: str) -> None:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    model, _ = load_configured_skeleton(ModelConfig(path=path))
    FullyShardedParallel("cpu", weights=Path(weights)).shard(model)


def test_a_file_of_another_shape_is_named(tmp_path: Path):
    path = _save(tmp_path / "model")
    other = build_tiny_model(hidden_size=96, num_heads=4, num_kv_heads=2, num_layers=2, vocab_size=300)
    save_tiny(other, load_tokenizer(""), tmp_path / "other")
    with pytest.raises(RuntimeError, match=r"model.embed_tokens.weight: the files hold shape \(300, 96\)"):
        run_ranks(_shard_from, 1, path, str(tmp_path / "other"))
