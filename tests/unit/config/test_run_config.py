"""The root RunConfig: loading, validation of its own sections, and the documentation convention."""

from __future__ import annotations

import dataclasses

import pytest

from asyncrl.config.base import ConfigError, field_types, from_dict, iter_key_docs, section_type
from asyncrl.config.engine import EngineConfig
from asyncrl.config.loader import parse_yaml, to_yaml
from asyncrl.config.model import ModelConfig
from asyncrl.config.run import RunConfig, load_run_config


def test_defaults_without_a_file():
    cfg = load_run_config(None, [])
    assert cfg == RunConfig()
    assert cfg.model == ModelConfig(path="", dtype="float32", device="auto")


def test_file_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("seed: 7\nmodel:\n  dtype: bfloat16\nengine:\n  max_running_requests: 8\n")
    cfg = load_run_config(str(path), ["engine.kv_on_update=recompute", "output_dir=/tmp/x"])
    assert cfg == RunConfig(
        seed=7,
        output_dir="/tmp/x",
        model=ModelConfig(dtype="bfloat16"),
        engine=EngineConfig(max_running_requests=8, kv_on_update="recompute"),
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.dtype=fp16"], "model.dtype must be one of 'float32', 'bfloat16', 'float16', got 'fp16'"),
        (["model.device=gpu"], "model.device must be one of 'auto', 'cpu', 'cuda', got 'gpu'"),
        (["output_dir=''"], "output_dir must not be empty"),
        (["modle.path=x"], "override 'modle.path=x': unknown key 'modle' (did you mean 'model'?)"),
    ],
)
def test_bad_values_are_config_errors(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_run_config(None, overrides)
    assert str(info.value).startswith(message)


def test_a_removed_key_says_it_was_removed_and_why_from_a_file_and_an_override(tmp_path):
    """``runtime.switch.offload_grads`` went when the trainer began freeing its gradients after every step:
    an old config is told so, not pointed at a near-miss sibling key."""
    why = "was removed: the trainer frees its gradients after every optimizer step"
    old = tmp_path / "old.yaml"
    old.write_text("runtime:\n  switch:\n    offload_grads: true\n")
    with pytest.raises(ConfigError, match=f"key 'runtime.switch.offload_grads' {why}.*delete it"):
        load_run_config(old, [])
    with pytest.raises(ConfigError, match=f"override 'runtime.switch.offload_grads=false': .* {why}"):
        load_run_config(None, ["runtime.switch.offload_grads=false"])


def test_section_validation_holds_when_built_directly():
    with pytest.raises(ValueError, match="model.dtype must be one of"):
        ModelConfig(dtype="int8")


def test_resolved_yaml_round_trips():
    cfg = load_run_config(None, ["model.path=/models/a", "engine.max_model_len=256", "seed=3"])
    assert from_dict(RunConfig, parse_yaml(to_yaml(cfg))) == cfg


def test_every_key_of_the_run_config_is_documented():
    """Convention: each field of every section carries an attribute docstring (``asyncrl config docs``)."""
    undocumented = [d.key for d in iter_key_docs(RunConfig) if not d.doc]
    assert undocumented == []


def test_every_section_is_frozen_and_keyword_only():
    sections = [section_type(tp) for tp in field_types(RunConfig).values()]
    for section in [RunConfig, *filter(None, sections)]:
        assert section.__dataclass_params__.frozen, section.__name__
        assert all(f.kw_only for f in dataclasses.fields(section)), section.__name__


def test_lora_on_vllm_sizes_its_lora_support_and_refuses_what_it_cannot_serve():
    config = load_run_config(None, ["trainer.lora.rank=8", "engine.backend=vllm"])
    assert config.engine.vllm.max_lora_rank == 8
    assert load_run_config(None, ["trainer.lora.rank=8"]).engine.vllm.max_lora_rank == 0  # built-in engine
    with pytest.raises(ConfigError, match="cannot run controller.mode='partial_rollout'"):
        load_run_config(
            None, ["trainer.lora.rank=8", "engine.backend=vllm", "controller.mode=partial_rollout"]
        )
    with pytest.raises(ConfigError, match="needs weight_sync.type object_store"):
        load_run_config(
            None,
            [
                "trainer.lora.rank=8",
                "engine.backend=vllm",
                "runtime.type=local",
                "weight_sync.type=broadcast",
                "proxy.max_engine_restarts=0",
            ],
        )
    with pytest.raises(ConfigError, match="below trainer.lora.rank=8"):
        load_run_config(None, ["trainer.lora.rank=8", "engine.backend=vllm", "engine.vllm.max_lora_rank=4"])
