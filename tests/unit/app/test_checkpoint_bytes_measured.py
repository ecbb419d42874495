"""``asyncrl doctor``'s checkpoint size against the bytes real checkpoints of a small tied Qwen3 put on disk:
the sharded format (DCP shards plus the Hugging Face ``model/`` export in bfloat16, with the tokenizer) and the
one-process format, each within 3 % of the directory's files. An estimate of the master weights and the moments
alone (the export and DCP's second copy of the tied output layer left out) is 25 % short here.

The trainer runs in one process: DCP writes the same tensors, at their global shapes, whatever the number of
ranks (only the number of ``.distcp`` files changes), so the plan is asked about the same run on 2 ranks."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from asyncrl.app import memory_plan as mp
from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.run import load_run_config
from asyncrl.config.trainer import TrainerConfig
from asyncrl.models.loading import load_tokenizer
from asyncrl.sim.model_shape import shape_from_hf_config
from asyncrl.trainer.checkpoint import MODEL_DIR, save_checkpoint
from asyncrl.trainer.distributed.checkpoint import save_sharded_checkpoint
from asyncrl.trainer.distributed.parallel import SingleProcess
from asyncrl.trainer.trainer import Trainer

SHAPE = Qwen3Config(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=4096,
    tie_word_embeddings=True,  # DCP writes it twice, the export once
    max_position_embeddings=128,
)
"""2.2 M parameters: large enough that files' headers and DCP's per-tensor records (~0.2 MB) are under 1 %."""


def _trainer_with_moments() -> Trainer:
    """A trainer whose AdamW holds both moments of every weight, as after any step (a zero gradient creates
    them without a forward pass)."""
    torch.manual_seed(0)
    trainer = Trainer(
        Qwen3ForCausalLM(SHAPE),
        TrainerConfig(lr=1e-3),
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
        parallel=SingleProcess(),
    )
    for parameter in trainer.model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    trainer.optimizer.step()
    return trainer


def _bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def test_the_estimate_matches_the_bytes_both_checkpoint_formats_write(tmp_path: Path) -> None:
    trainer = _trainer_with_moments()
    shape = shape_from_hf_config(SHAPE.to_dict())
    common = ["model.dtype=float32", "engine.dtype=bfloat16"]
    sharded_config = load_run_config(
        None, [*common, "runtime.type=local", "trainer.num_workers=2", "rollout.num_engines=2"]
    )
    sharded = save_sharded_checkpoint(
        tmp_path / "sharded", trainer, tokenizer=load_tokenizer(""), model_dtype=torch.bfloat16
    )
    estimate = mp.checkpoint_bytes(sharded_config, shape, "cpu")
    export = next(t for t in estimate.parts if t.name == "model/")
    assert abs(estimate.each / _bytes(sharded) - 1) < 0.03, (estimate, _bytes(sharded))
    assert abs(export.bytes / _bytes(sharded / MODEL_DIR) - 1) < 0.03

    one_process = save_checkpoint(tmp_path / "one", trainer)
    estimate = mp.checkpoint_bytes(load_run_config(None, common), shape, "cpu")
    assert abs(estimate.each / _bytes(one_process) - 1) < 0.03, (estimate, _bytes(one_process))
