"""LoRA checkpoints and FSDP2: a checkpoint holds the adapters (peft's format), resumes exactly, merges into the
base for evaluation and export; under FSDP2 (gloo ranks) a LoRA step equals the single-process one, the sharded
checkpoint holds only adapters and resumes onto another world size, and the gathered adapters are the ones
weight sync ships."""

from __future__ import annotations

from pathlib import Path

import peft
import pytest
import torch
from test_trainer_lora import randomise_adapters
from torch.distributed.checkpoint import FileSystemReader
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import LoraConfig, TrainerConfig
from asyncrl.testing.gradients import stepped_gradients
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer import checkpoint
from asyncrl.trainer.distributed.checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess
from asyncrl.trainer.distributed.weights import gathered_buckets
from asyncrl.trainer.trainer import Trainer

LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.1)
NO_DROPOUT = LoraConfig(rank=4, alpha=8.0)
"""Across world sizes: adapter dropout draws differ with the rows each rank holds."""


def _trainer(
    parallel: Parallelism | None = None,
    *,
    lora: LoraConfig | None = LORA,
    scramble: int | None = None,
    num_mini_batches: int = 2,
) -> Trainer:
    config = TrainerConfig(lr=1e-2, warmup_steps=2, num_mini_batches=num_mini_batches, lora=lora)
    trainer = Trainer(
        tiny_qwen2(), config, LossConfig(name="ppo"), AdvantageConfig(name="grpo"), parallel=parallel
    )
    if scramble is not None:  # other adapters than a fresh trainer's: a resume must bring back its own
        randomise_adapters(trainer, seed=scramble, members=("A", "B"))
    return trainer


def _groups(step: int):
    return with_model_logprobs(
        random_groups(num_groups=2, group_size=4, seed=20 + step), tiny_qwen2(), noise=0.3
    )


def _adapters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        name: tensor.clone() for bucket in gathered_buckets(trainer.sync_tensors()) for name, tensor in bucket
    }


def test_a_resumed_lora_trainer_continues_exactly(tmp_path):
    uninterrupted = _trainer()
    for step in range(3):
        uninterrupted.train_step(_groups(step), policy_version=step)

    interrupted = _trainer()
    interrupted.train_step(_groups(0), policy_version=0)
    torch.rand(7)  # the adapter dropout's random state must come back from the checkpoint, not from here
    path = checkpoint.save_checkpoint(tmp_path, interrupted, extra={"position": 3})
    assert (path / checkpoint.ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert not (path / checkpoint.MODEL_DIR).exists()
    resumed = _trainer(scramble=99)  # everything must come from the checkpoint
    assert checkpoint.load_checkpoint(path, resumed) == {"position": 3}
    for step in (1, 2):
        resumed.train_step(_groups(step), policy_version=step)
    want, got = _adapters(uninterrupted), _adapters(resumed)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_lora_and_full_checkpoints_are_not_mixed_up(tmp_path):
    lora_path = checkpoint.save_checkpoint(tmp_path / "lora", _trainer())
    full_path = checkpoint.save_checkpoint(tmp_path / "full", _trainer(lora=None))
    with pytest.raises(ValueError, match="holds LoRA adapters"):
        checkpoint.load_checkpoint(lora_path, _trainer(lora=None))
    with pytest.raises(ValueError, match="holds full weights"):
        checkpoint.load_checkpoint(full_path, _trainer())
    with pytest.raises(ValueError, match="does not fit trainer.lora"):
        checkpoint.load_checkpoint(lora_path, _trainer(lora=LoraConfig(rank=8)))


def test_the_saved_adapter_is_peft_format_and_merges_for_export(tmp_path):
    trainer = _trainer()
    randomise_adapters(trainer)
    path = checkpoint.save_checkpoint(tmp_path, trainer)
    ids = torch.tensor([[5, 9, 31, 2, 77, 140]])
    with torch.no_grad():
        want = trainer.peft_model(input_ids=ids).logits
        loaded = peft.PeftModel.from_pretrained(tiny_qwen2(), str(path / checkpoint.ADAPTER_DIR))
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=0, atol=0)
        merged = checkpoint.served_model(tiny_qwen2(), path)
        assert not isinstance(merged, peft.PeftModel)
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ FSDP2


def _sharded(kind: str) -> Parallelism:
    if kind == "single":
        return SingleProcess()
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    return FullyShardedParallel("cpu")


def _step_and_gather(kind: str) -> dict | None:
    """One optimizer step (one mini-batch: its gradients are the ones compared) from non-zero B matrices, so
    the A matrices get gradients too."""
    trainer = _trainer(_sharded(kind), lora=NO_DROPOUT, num_mini_batches=1)
    randomise_adapters(trainer)
    base = {n: _full(p).clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    with stepped_gradients(trainer, _full) as stepped:  # full_tensor is a collective: every rank
        metrics = trainer.train_step(_groups(0), policy_version=0)
    grads = stepped[-1]
    frozen = {n: _full(p) for n, p in trainer.model.named_parameters() if not p.requires_grad}
    adapters = _adapters(trainer)
    if trainer.parallel.rank != 0:
        return None
    unchanged = all(torch.equal(frozen[n], base[n]) for n in base)
    return {"metrics": metrics, "grads": grads, "adapters": adapters, "base_unchanged": unchanged}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def test_an_fsdp2_lora_step_equals_the_single_process_step():
    sharded = run_ranks(_step_and_gather, 2, "fsdp")[0]
    single = _step_and_gather("single")
    assert sharded["base_unchanged"] and single["base_unchanged"]
    assert sharded["grads"].keys() == single["grads"].keys()
    assert max(float(g.abs().max()) for g in single["grads"].values()) > 0
    for name, grad in single["grads"].items():
        error = float((sharded["grads"][name] - grad).abs().max()) / max(float(grad.abs().max()), 1e-12)
        assert error <= 1e-5, f"gradient of {name}: relative error {error:.2e}"
    assert sharded["adapters"].keys() == single["adapters"].keys()
    for name, tensor in single["adapters"].items():
        torch.testing.assert_close(sharded["adapters"][name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    assert sharded["metrics"]["loss"] == pytest.approx(single["metrics"]["loss"], rel=1e-5, abs=1e-7)


def _save_sharded_then_continue(root: str) -> dict | None:
    trainer = _trainer(_sharded("fsdp"), lora=NO_DROPOUT)
    trainer.train_step(_groups(0), policy_version=0)
    path = save_sharded_checkpoint(root, trainer, extra={"position": 5})
    trainer.train_step(_groups(1), policy_version=1)
    adapters = _adapters(trainer)
    return {"path": str(path), "adapters": adapters} if trainer.parallel.rank == 0 else None


def test_a_sharded_lora_checkpoint_holds_only_adapters_and_resumes_on_one_rank(tmp_path):
    written = run_ranks(_save_sharded_then_continue, 2, str(tmp_path))[0]
    path = Path(written["path"])
    assert (path / checkpoint.ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert not (path / checkpoint.MODEL_DIR).exists()
    saved = FileSystemReader(path / checkpoint.SHARDED_DIR).read_metadata().state_dict_metadata
    adapter_names = {f"model.{n}" for n, p in _trainer().model.named_parameters() if p.requires_grad}
    assert {key for key in saved if key.startswith("model.")} == adapter_names
    resumed = _trainer(SingleProcess(), lora=NO_DROPOUT, scramble=7)
    assert load_sharded_checkpoint(path, resumed) == {"position": 5}
    resumed.train_step(_groups(1), policy_version=1)
    got = _adapters(resumed)
    for name, tensor in written["adapters"].items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-7, msg=name)
