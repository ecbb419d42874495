"""``asyncrl export`` of a sharded checkpoint reads the master weights from its DCP shards (``sharded/``), not its
serving export (``model/``, bf16): a float32 export written from a 2-rank FSDP2 checkpoint equals the fp32 masters
bit for bit (an upcast of ``model/`` would not), and a bfloat16 export equals ``model/`` bit for bit, because
``model/`` is the masters rounded to bf16."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from asyncrl.app.export import export_model
from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.run import load_run_config
from asyncrl.config.trainer import TrainerConfig
from asyncrl.models.loading import load_tokenizer, save_tiny
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.checkpoint import MODEL_DIR
from asyncrl.trainer.distributed.checkpoint import save_sharded_checkpoint
from asyncrl.trainer.trainer import Trainer


def _base_model(directory: Path) -> Path:
    """A tiny tied Qwen2 with the shipped tokenizer, written as the run's ``model.path``."""
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return save_tiny(Qwen2ForCausalLM(config), load_tokenizer(""), directory)


def _checkpoint_on_two_ranks(base: str, root: str) -> dict | None:
    """Masters that are the base weights moved off the bf16 grid (as training moves them), sharded by FSDP2
    over 2 ranks and checkpointed with a bfloat16 ``model/``, as a GPU run writes it."""
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1e-3 * torch.randn(parameter.shape, generator=generator))
    trainer = Trainer(
        model,
        TrainerConfig(),
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
        parallel=FullyShardedParallel("cpu"),
    )
    path = save_sharded_checkpoint(root, trainer, model_dtype=torch.bfloat16)
    masters = {
        name: p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
        for name, p in trainer.model.named_parameters()
    }
    return {"path": str(path), "masters": masters} if trainer.parallel.rank == 0 else None


def _loaded(directory: Path) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    return {name: p.detach() for name, p in model.named_parameters()}


def test_a_float32_export_of_a_sharded_checkpoint_is_the_masters_bit_for_bit(tmp_path: Path) -> None:
    base = _base_model(tmp_path / "base")
    written = run_ranks(_checkpoint_on_two_ranks, 2, str(base), str(tmp_path / "checkpoints"))[0]
    path, masters = Path(written["path"]), written["masters"]
    config = load_run_config(None, [f"model.path={base}", "model.dtype=float32"])

    exported = _loaded(export_model(path, tmp_path / "fp32", config, "float32"))
    assert exported.keys() == masters.keys()
    for name, master in masters.items():
        assert exported[name].dtype == torch.float32
        assert torch.equal(exported[name], master), name
    serving = _loaded(path / MODEL_DIR)
    assert any(not torch.equal(serving[name].float(), master) for name, master in masters.items())

    in_bf16 = _loaded(export_model(path, tmp_path / "bf16", config, "bfloat16"))
    for name, weight in serving.items():
        assert weight.dtype == in_bf16[name].dtype == torch.bfloat16
        assert torch.equal(in_bf16[name], weight), name
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "fp32", local_files_only=True)
    assert tokenizer.get_vocab() == load_tokenizer("").get_vocab()
