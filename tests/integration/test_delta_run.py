"""A real inline run with ``weight_sync.type=delta``: every step ships a delta smaller than the model after the
first (a full snapshot), the files land in the run's directory, old versions are collected, and a resumed run
goes on from its checkpoint through a fresh full snapshot. A float32 trainer feeding a bfloat16 engine
(``engine.dtype``) ships its deltas in bfloat16 (cast once at publish, diffed against the previous cast version)
and the engine serves each version bit for bit."""

from __future__ import annotations

import asyncio
import hashlib
import json

import torch

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.models.loading import state_dict_for_sync
from asyncrl.weight_sync.delta import DeltaWriter

RUN = (
    "controller.num_steps=4",
    "controller.eval_prompts=0",
    "task.num_eval=4",
    "rollout.rollout_batch_size=2",
    "rollout.num_return_sequences=4",
    "rollout.max_new_tokens=12",
    "model.device=cpu",
    "trainer.checkpoint_every=2",
    "weight_sync.type=delta",
    "weight_sync.delta_full_every=3",
    "weight_sync.delta_keep_full=1",
    "reward.name=test_delta_run:length_reward",
    "trainer.lr=1e-3",
)


def length_reward(response_text: str, sample: object) -> float:
    """Longer responses score higher: rewards vary within a group, so every step changes the weights."""
    return float(len(response_text))


def steps(out) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "weight_sync/bytes" in line]


def test_a_delta_run_ships_less_than_the_model_and_resumes(tiny_path, tmp_path):
    out = tmp_path / "run"
    config = load_run_config(None, [*RUN, f"model.path={tiny_path}", f"output_dir={out}"])
    asyncio.run(training.train(config, console=None))
    shipped = [line["weight_sync/bytes"] for line in steps(out)]
    assert len(shipped) == 4
    full = shipped[0]  # v1: the first publish is a full snapshot (with no delta before it)
    assert 0 < shipped[1] < full and 0 < shipped[3] < full, shipped  # deltas only
    assert shipped[2] > full  # v3: a delta and a full snapshot beside it (delta_full_every=3)
    names = sorted(p.name for p in (out / "weight-deltas").iterdir())
    assert names == ["delta-00000003", "delta-00000004", "full-00000003"], names

    resumed = load_run_config(
        None,
        [*RUN, f"model.path={tiny_path}", f"output_dir={out}", "controller.num_steps=6", f"resume={out}"],
    )
    asyncio.run(training.train(resumed, console=None))
    assert [line["step"] for line in steps(out)] == [1, 2, 3, 4, 5, 6]
    assert (out / "weight-deltas" / "delta-00000006").is_dir()


def digests(named) -> dict[str, tuple[str, str]]:
    """Each tensor's dtype and hashed bytes: exact, whatever the dtype."""
    return {
        name: (str(t.dtype), hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy()).hexdigest())
        for name, t in named.items()
    }


def test_a_float32_trainer_ships_bfloat16_deltas_that_the_bfloat16_engine_serves_bit_for_bit(
    tiny_path, tmp_path, monkeypatch
):
    published, served = {}, {}
    write, update_weights = DeltaWriter.write, LLMEngine.update_weights

    def written(self, version, buckets):
        buckets = [dict(bucket) for bucket in buckets]
        published[version] = digests({name: t for bucket in buckets for name, t in bucket.items()})
        return write(self, version, buckets)

    def applied(self, named_tensors, version, **kwargs):
        update_weights(self, named_tensors, version, **kwargs)
        served[version] = digests(state_dict_for_sync(self.model))

    monkeypatch.setattr(DeltaWriter, "write", written)
    monkeypatch.setattr(LLMEngine, "update_weights", applied)
    out = tmp_path / "run"
    mixed = ("model.dtype=float32", "engine.dtype=bfloat16", "weight_sync.delta_full_every=20")
    config = load_run_config(None, [*RUN, *mixed, f"model.path={tiny_path}", f"output_dir={out}"])
    asyncio.run(training.train(config, console=None))

    assert sorted(published) == [1, 2, 3, 4], sorted(published)
    assert {dtype for version in published.values() for dtype, _ in version.values()} == {"torch.bfloat16"}
    for version in range(1, 4):  # every version the engine applied (the last may land after the run stopped)
        assert served[version] == published[version], f"v{version} served differs from what was published"
    assert published[2] != published[1]  # the weights moved: the deltas carried changes
    shipped = [line["weight_sync/bytes"] for line in steps(out)]
    full = shipped[0]  # v1: a full snapshot in bfloat16
    assert all(0 < delta < full for delta in shipped[1:]), shipped
    index = json.loads((out / "weight-deltas" / "delta-00000004" / "index.json").read_text())
    assert {segment["dtype"] for segment in index["segments"]} == {"bfloat16"}
