"""LoRA runs end to end: inline, a run stopped and resumed trains exactly what an uninterrupted one trains (same
batches, same adapters bit for bit); on Ray with a 2-rank FSDP2 trainer a run trains, checkpoints adapters and
resumes; ``asyncrl export`` merges a LoRA checkpoint into a model that ``asyncrl eval`` scores as training did."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from short_runs import SHORT_RUN, SYNC_EVERY_GROUP, train, trained

from asyncrl.app.evaluate import evaluate_model
from asyncrl.app.export import export_model
from asyncrl.config.run import load_run_config
from asyncrl.metrics.tracker import read_metrics

LORA_RUN = (
    "trainer.keep_last_checkpoints=null",
    "trainer.lr=1e-3",
    "trainer.lora.rank=8",
    "trainer.lora.dropout=0.1",  # its random state must come back on resume too
    *SYNC_EVERY_GROUP,  # deterministic: bit-equal adapters across a resume are its contract
)


def train_lora(out: Path, steps: int, *overrides: str, resume: bool = False) -> None:
    train(out, steps, *LORA_RUN, *overrides, resume=resume)


def adapter(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(out / "checkpoints" / f"step_{step:08d}" / "adapter" / "adapter_model.safetensors")


def test_a_resumed_lora_run_continues_exactly(tmp_path):
    train_lora(tmp_path / "whole", 4)
    train_lora(tmp_path / "split", 2)
    train_lora(tmp_path / "split", 4, resume=True)
    assert trained(tmp_path / "split") == trained(tmp_path / "whole")
    whole, split = adapter(tmp_path / "whole", 4), adapter(tmp_path / "split", 4)
    assert whole.keys() == split.keys() and all("lora_" in name for name in whole)
    for name in whole:
        assert torch.equal(split[name], whole[name]), name
    assert not torch.equal(adapter(tmp_path / "whole", 1)[name], whole[name])  # the adapters did train
    adapter_bytes = sum(t.numel() * t.element_size() for t in whole.values())
    shipped = {r["weight_sync/bytes"] for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")}
    assert shipped == {adapter_bytes}, "weight sync shipped more (or less) than the adapters"


def test_export_merges_the_adapters_into_a_model_that_evaluates_like_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    train_lora(run, 2)
    exported = export_model(run, tmp_path / "exported")
    config = load_run_config(None, [*SHORT_RUN, *LORA_RUN, "controller.eval_prompts=8"])
    from_checkpoint = asyncio.run(evaluate_model(config, str(run / "checkpoints" / "step_00000002")))
    exported_config = load_run_config(
        None, [*SHORT_RUN, *LORA_RUN, "controller.eval_prompts=8", f"model.path={exported}"]
    )
    assert asyncio.run(evaluate_model(exported_config, None)) == from_checkpoint


@pytest.mark.ray
@pytest.mark.slow
def test_a_lora_run_on_ray_with_an_fsdp2_trainer_checkpoints_adapters_and_resumes(tmp_path):
    out = tmp_path / "run"
    ray_run = (
        "runtime.type=local",
        "runtime.train_num_cpus=1",
        "runtime.rollout_num_cpus=1",
        "trainer.num_workers=2",
    )
    train_lora(out, 2, *ray_run)
    checkpoint = out / "checkpoints" / "step_00000002"
    assert (checkpoint / "adapter" / "adapter_model.safetensors").is_file()
    assert (checkpoint / "sharded").is_dir() and not (checkpoint / "model").exists()
    train_lora(out, 3, *ray_run, resume=True)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    resumed = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    assert {x["first_version"] for x in resumed if x["event"] == "trained" and x["step"] == 3} == {2}
    assert not torch.equal(
        adapter(out, 3)["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"],
        adapter(out, 2)["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"],
    )
