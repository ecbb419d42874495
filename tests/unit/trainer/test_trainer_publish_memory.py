"""A publication into the serving dtype holds the served model once: the inline trainer hands its transport
the casts one at a time (``Trainer.serving_tensors``), so ``in_process`` keeps each fresh cast without cloning
it and ``colocated`` casts straight into its blocks; a dict of every cast beside the transport's own copy held
it twice. Measured with torch's CPU allocator (``AllocatedBytes``), the colocated blocks (shared memory,
outside that allocator) by their bytes; the memory plan's publish term is that one copy."""

from __future__ import annotations

import pytest
import torch
from trainer_fixtures import tiny_qwen2

from asyncrl.app import memory_plan as mp
from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.run import load_run_config
from asyncrl.config.trainer import TrainerConfig
from asyncrl.models.loading import state_dict_for_sync
from asyncrl.runtime.inline import LocalTrainer
from asyncrl.sim.model_shape import shape_from_hf_config
from asyncrl.testing.allocated import AllocatedBytes
from asyncrl.trainer.trainer import Trainer
from asyncrl.weight_sync.buckets import ServingCasts, cast_for_serving
from asyncrl.weight_sync.transports import make_weight_sync


def bf16_trainer() -> Trainer:
    return Trainer(
        tiny_qwen2(), TrainerConfig(), LossConfig(), AdvantageConfig(name="grpo"), serving_dtype="bfloat16"
    )


def served_bytes(trainer: Trainer) -> tuple[int, int]:
    """The served model's bf16 bytes (the tied matrix once) and its largest tensor's."""
    params = {id(p): p for p in trainer.model.parameters()}.values()
    sizes = [p.numel() * 2 for p in params]
    return sum(sizes), max(sizes)


@pytest.mark.parametrize("transport", ["in_process", "colocated"])
def test_a_publication_holds_the_served_model_once_plus_one_tensor(transport):
    trainer = bf16_trainer()
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # fp32 masters, bf16 served
    sync = make_weight_sync(transport)
    local = LocalTrainer(trainer, 1, sync)
    model, largest = served_bytes(trainer)
    try:
        with AllocatedBytes() as trace:
            update = local._publish()  # on this thread: the profiler records the thread it runs on
        held = getattr(sync, "held_bytes", 0)  # the colocated blocks: shared memory, not the allocator
        assert update.nbytes == model
        assert trace.peak + held <= model + largest, (trace.peak, held, model, largest)
        want = dict(cast_for_serving(state_dict_for_sync(trainer.model), "bfloat16"))
        got = dict(make_weight_sync(transport).receive(update))
        assert got.keys() == want.keys()
        for name, tensor in want.items():  # cast while copying: the same bits as a cast on its own
            assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], tensor), name
        if transport == "in_process":
            assert got["lm_head.weight"] is got["model.embed_tokens.weight"], "the tied matrix once"
    finally:
        local.shutdown()
        if transport == "colocated":
            sync.release()


@pytest.mark.parametrize("transport", ["delta", "object_store"])
def test_a_packed_publication_casts_into_its_buffers_without_a_list_of_casts(transport, tmp_path):
    """``delta`` and ``object_store`` pack each bucket into flat host buffers (``pack_state``), which cast as
    they copy straight from the fp32 masters: a list of the bucket's casts beside the buffers held the served
    model twice (inline, the whole model is one bucket). The casts would be torch's (``AllocatedBytes``); the
    buffers are numpy's, outside that allocator, counted by their bytes."""
    trainer = bf16_trainer()
    sync = make_weight_sync(transport, **({"root": tmp_path} if transport == "delta" else {}))
    local = LocalTrainer(trainer, 1, sync)
    model, largest = served_bytes(trainer)
    try:
        with AllocatedBytes() as trace:
            update = local._publish()
        assert trace.peak <= largest, (trace.peak, model, largest)
        want = dict(cast_for_serving(state_dict_for_sync(trainer.model), "bfloat16"))
        got = dict(sync.receive(update))
        assert got.keys() == want.keys()
        for name, tensor in want.items():
            assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], tensor), name
    finally:
        local.shutdown()


def test_the_casts_an_in_process_update_keeps_are_its_own_and_the_rest_are_cloned():
    """A fresh cast is kept as it is (nobody else holds it); a tensor already in the serving dtype is the
    trainer's own and is cloned, so the next step cannot change the published one."""
    master, served = torch.randn(4, 3), torch.randn(5).to(torch.bfloat16)
    casts = ServingCasts({"master": master, "served": served}, "bfloat16")
    assert casts.fresh("master") and not casts.fresh("served")
    update = make_weight_sync("in_process").publish(1, casts)
    kept = dict(update.handle)
    assert torch.equal(kept["master"], master.to(torch.bfloat16))
    served.add_(1.0)
    assert not torch.equal(kept["served"], served), "the trainer's own tensor was cloned"


def test_the_inline_plans_publish_term_is_the_one_copy_held():
    """One served model in the serving dtype (the shape counts no biases: within 1 % here), not two."""
    config = load_run_config(None, ["model.dtype=float32", "engine.dtype=bfloat16"])
    trainer = bf16_trainer()
    shape = shape_from_hf_config(trainer.model.config.to_dict())
    model, _ = served_bytes(trainer)
    (term,) = [t for t in mp.trainer_role(config, shape, "cuda").terms if t.name == "publish copy"]
    assert term.phase == "sync" and abs(term.bytes - model) <= 0.01 * model, (term.bytes, model)
