"""``model.attn_implementation``: the names transformers accepts, refused by name at config load where the
config alone shows it cannot train (CPU, a float32 forward under flash-attn), refused before loading where the
machine cannot run it (no CUDA, no flash-attn), and handed to every Hugging Face model the trainer loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from asyncrl.config.base import ConfigError
from asyncrl.config.model import ATTN_IMPLEMENTATIONS, CUDA_ONLY_ATTENTION, ModelConfig
from asyncrl.config.run import load_run_config
from asyncrl.models.attention import AttentionUnavailable, check_attention
from asyncrl.models.corpus import sample_texts
from asyncrl.models.loading import (
    load_configured_model,
    load_configured_skeleton,
    load_decoder_body,
    load_decoder_skeleton,
    save_tiny,
)
from asyncrl.models.tiny import build_tiny

OUT = ["output_dir=/tmp/attn"]


def test_the_names_are_what_the_installed_transformers_accepts():
    accepted = {"eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()}
    assert set(ATTN_IMPLEMENTATIONS) == {name for name in accepted if not name.startswith("paged|")}


def test_the_default_is_sdpa():
    assert load_run_config(None, OUT).model.attn_implementation == "sdpa"


def test_an_unknown_name_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"model\.attn_implementation.*flash_attention_2"):
        load_run_config(None, [*OUT, "model.attn_implementation=flash_attn2"])


@pytest.mark.parametrize("name", CUDA_ONLY_ATTENTION)
def test_cuda_only_implementations_are_refused_on_a_cpu_model(name):
    overrides = [*OUT, "model.device=cpu", "model.dtype=bfloat16", f"model.attn_implementation={name}"]
    with pytest.raises(
        ConfigError, match=rf"model\.attn_implementation='{name}' does not train on CPU.*sdpa"
    ):
        load_run_config(None, overrides)


@pytest.mark.parametrize("name", ["flash_attention_2", "flash_attention_3", "flash_attention_4"])
def test_flash_attention_on_a_float32_forward_is_refused_naming_the_fixes(name):
    overrides = [*OUT, "model.device=cuda", "model.dtype=float32", f"model.attn_implementation={name}"]
    with pytest.raises(ConfigError, match=r"bfloat16/float16.*model\.dtype: bfloat16.*compute_dtype"):
        load_run_config(None, overrides)
    sharded = ["runtime.type=local", "trainer.num_workers=2"]
    with pytest.raises(ConfigError, match=r"trainer\.mixed_precision: bf16"):
        load_run_config(None, [*overrides, *sharded])


@pytest.mark.parametrize(
    "half",
    [
        ["model.dtype=bfloat16"],
        ["trainer.compute_dtype=bfloat16"],  # float32 weights, autocast forward
        ["runtime.type=local", "trainer.num_workers=2", "trainer.mixed_precision=bf16"],
    ],
)
def test_flash_attention_with_a_half_precision_forward_is_accepted(half):
    overrides = [*OUT, "model.device=cuda", "model.attn_implementation=flash_attention_2", *half]
    assert load_run_config(None, overrides).model.attn_implementation == "flash_attention_2"


@pytest.mark.parametrize("name", ["sdpa", "eager"])
def test_cpu_implementations_pass_the_machine_check(name):
    check_attention(name, torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("name", CUDA_ONLY_ATTENTION)
def test_cuda_only_implementations_are_refused_before_loading_without_cuda(name, tmp_path):
    with pytest.raises(AttentionUnavailable, match=rf"model\.attn_implementation='{name}' needs CUDA.*sdpa"):
        check_attention(name, torch.device("cuda"))
    # model.device auto resolves to cpu here: refused before a weight is read (the directory does not exist)
    config = ModelConfig(path=str(tmp_path / "absent"), dtype="bfloat16", attn_implementation=name)
    with pytest.raises(AttentionUnavailable, match=r"model\.attn_implementation"):
        load_configured_model(config, for_trainer=True)
    with pytest.raises(AttentionUnavailable, match=r"model\.attn_implementation"):
        load_configured_skeleton(config)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    model, tokenizer = build_tiny(
        sample_texts(200), vocab_size=300, hidden_size=32, num_heads=2, num_layers=1
    )
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("tiny"))


def test_every_trainer_load_path_uses_the_configured_implementation(tiny_dir):
    config = ModelConfig(path=str(tiny_dir), device="cpu", attn_implementation="eager")
    models = [
        load_configured_model(config, for_trainer=True)[0],
        load_configured_skeleton(config)[0],  # the sharded trainer's meta-device skeleton
        load_decoder_body(tiny_dir, config),  # a separate critic's body
        load_decoder_skeleton(tiny_dir, config),
    ]
    assert [model.config._attn_implementation for model in models] == ["eager"] * 4
    default = ModelConfig(path=str(tiny_dir), device="cpu")
    assert load_configured_model(default, for_trainer=True)[0].config._attn_implementation == "sdpa"


def test_an_engine_load_ignores_the_trainers_attention(tiny_dir):
    """An engine attends with its own kernels: its load neither uses nor checks a CUDA-only implementation
    (an engine actor on a CPU beside a GPU trainer is not refused)."""
    config = ModelConfig(path=str(tiny_dir), dtype="bfloat16", attn_implementation="flex_attention")
    model, _ = load_configured_model(config, on_host=True)
    assert model.config._attn_implementation == "sdpa"
