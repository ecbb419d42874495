"""A sharded checkpoint written by 2 FSDP2 ranks resumes onto 1 and onto 3 ranks: the next step's weights equal
those of the run that never stopped (so weights, optimizer moments, schedule, step and version all came back);
its ``model/`` loads with ``AutoModelForCausalLM.from_pretrained``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.critic import CriticConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.models.loading import load_tokenizer
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer import checkpoint
from asyncrl.trainer.distributed.checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess
from asyncrl.trainer.trainer import Trainer


def _trainer(parallel: Parallelism) -> Trainer:
    config = TrainerConfig(lr=1e-3, warmup_steps=3)  # the schedule's position must come back too
    return Trainer(
        tiny_qwen2(), config, LossConfig(name="ppo"), AdvantageConfig(name="grpo"), parallel=parallel
    )


def _groups(step: int):
    return with_model_logprobs(
        random_groups(num_groups=2, group_size=4, seed=10 + step), tiny_qwen2(), noise=0.3
    )


def _full_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        name: p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
        for name, p in trainer.model.named_parameters()
    }


def _sharded(parallel_kind: str) -> Parallelism:
    if parallel_kind == "single":
        return SingleProcess()
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    return FullyShardedParallel("cpu")


def _train_save_continue(root: str) -> dict | None:
    trainer = _trainer(_sharded("fsdp"))
    trainer.train_step(_groups(0), policy_version=0)
    path = save_sharded_checkpoint(root, trainer, extra={"position": 7})
    trainer.train_step(_groups(1), policy_version=1)
    weights = _full_weights(trainer)
    return {"path": str(path), "weights": weights} if trainer.parallel.rank == 0 else None


def _resume_and_step(path: str, parallel_kind: str = "fsdp") -> dict | None:
    trainer = _trainer(_sharded(parallel_kind))
    extra = load_sharded_checkpoint(path, trainer)
    expected = {"position": 7} if trainer.parallel.rank == 0 else {}  # the caller reads rank 0's
    assert (trainer.step, trainer.version, extra) == (1, 1, expected)
    trainer.train_step(_groups(1), policy_version=1)
    weights = _full_weights(trainer)
    return {"weights": weights} if trainer.parallel.rank == 0 else None


def _assert_same_model(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    error = sum(float((got[n] - w).pow(2).sum()) for n, w in want.items()) ** 0.5
    norm = sum(float(w.pow(2).sum()) for w in want.values()) ** 0.5
    assert error / norm <= 1e-6, f"resumed weights differ: relative error {error / norm:.2e}"


def test_two_rank_checkpoint_resumes_on_one_and_on_three_ranks(tmp_path: Path):
    reference = run_ranks(_train_save_continue, 2, str(tmp_path))[0]
    path = reference["path"]
    checkpoint.verify_checkpoint(Path(path))
    assert sorted(p.name for p in (Path(path) / "sharded").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    _assert_same_model(_resume_and_step(path, "single")["weights"], reference["weights"])
    _assert_same_model(run_ranks(_resume_and_step, 3, path)[0]["weights"], reference["weights"])


def test_the_plain_loader_names_a_sharded_checkpoint(tmp_path: Path):
    trainer = _trainer(SingleProcess())
    path = save_sharded_checkpoint(tmp_path, trainer)
    with pytest.raises(ValueError, match="holds sharded weights"):
        checkpoint.load_checkpoint(path, _trainer(SingleProcess()))


def test_a_sharded_checkpoint_carries_a_loadable_model_directory(tmp_path: Path):
    reference = run_ranks(_train_save_continue, 2, str(tmp_path))[0]
    model = tiny_qwen2(seed=5)  # different weights, replaced by the checkpoint's
    checkpoint.load_model_weights(model, Path(reference["path"]) / checkpoint.MODEL_DIR)
    resumed = _trainer(SingleProcess())
    load_sharded_checkpoint(reference["path"], resumed)
    for name, tensor in resumed.model.named_parameters():
        assert torch.equal(dict(model.named_parameters())[name], tensor), name


def _train_and_export(root: str) -> dict | None:
    """One step on two ranks, then a checkpoint whose model/ is in bfloat16 with the shipped tokenizer."""
    trainer = _trainer(_sharded("fsdp"))
    trainer.train_step(_groups(0), policy_version=0)
    tokenizer = load_tokenizer("")
    path = save_sharded_checkpoint(root, trainer, tokenizer=tokenizer, model_dtype=torch.bfloat16)
    weights = _full_weights(trainer)
    return {"path": str(path), "weights": weights} if trainer.parallel.rank == 0 else None


def test_a_sharded_checkpoints_model_directory_loads_with_from_pretrained(tmp_path: Path):
    """Hugging Face's own loader (index, config, tokenizer) gets the trained weights in the export's dtype, the
    tied output layer included."""
    reference = run_ranks(_train_and_export, 2, str(tmp_path))[0]
    directory = Path(reference["path"]) / checkpoint.MODEL_DIR
    assert (directory / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight is model.get_input_embeddings().weight
    loaded = dict(model.named_parameters())
    assert loaded.keys() == reference["weights"].keys()
    for name, trained in reference["weights"].items():
        assert torch.equal(loaded[name], trained.to(torch.bfloat16)), name
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    assert tokenizer.get_vocab() == load_tokenizer("").get_vocab()


CRITICS = ("separate", "shared_trunk")


def _critic_trainer(parallel: Parallelism, kind: str) -> Trainer:
    config = TrainerConfig(lr=1e-3, warmup_steps=3)
    critic = CriticConfig(type=kind, lr=2e-3)
    return Trainer(
        tiny_qwen2(),
        config,
        LossConfig(name="ppo"),
        AdvantageConfig(name="gae"),
        parallel=parallel,
        critic=critic,
    )


def _critic_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    named = [
        *trainer.model.named_parameters(),
        *(("critic." + n, p) for n, p in trainer.critic.module.named_parameters()),
    ]
    return {
        n: p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach().clone() for n, p in named
    }


def _critics_train_save_continue(root: str) -> dict | None:
    out = {}
    for kind in CRITICS:
        trainer = _critic_trainer(_sharded("fsdp"), kind)
        trainer.train_step(_groups(0), policy_version=0)
        path = save_sharded_checkpoint(f"{root}/{kind}", trainer)
        trainer.train_step(_groups(1), policy_version=1)
        out[kind] = (str(path), _critic_weights(trainer))
    return out if trainer.parallel.rank == 0 else None


def test_a_two_rank_critic_checkpoint_resumes_on_one_rank(tmp_path: Path):
    """The critic's weights, optimizer moments and schedule come back too, for both critic types (the shared
    head lives inside the policy's sharded root)."""
    reference = run_ranks(_critics_train_save_continue, 2, str(tmp_path))[0]
    for kind, (path, weights) in reference.items():
        resumed = _critic_trainer(SingleProcess(), kind)
        load_sharded_checkpoint(path, resumed)
        resumed.train_step(_groups(1), policy_version=1)
        _assert_same_model(_critic_weights(resumed), weights)
