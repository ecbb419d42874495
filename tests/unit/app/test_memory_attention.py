"""The plan's attention-mask term per ``model.attn_implementation``: counted under sdpa and eager (a dense
block-diagonal mask per micro-batch, and what each layer keeps of it for backward), absent under flex and flash
attention, and checked against torch's CPU allocator: the bytes a forward keeps for backward grow with the
packed rows' width as the term says (within ±15 %)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from asyncrl.app import memory_plan as mp
from asyncrl.config.run import load_run_config
from asyncrl.sim.model_shape import resolve_shape, shape_from_hf_config
from asyncrl.testing.allocated import AllocatedBytes
from asyncrl.trainer.activation_checkpointing import enable_activation_checkpointing
from asyncrl.trainer.logprobs import compute_token_logprobs

SHAPE = Qwen2Config(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
    max_position_embeddings=1024,
)
TOKENS = 512
SAMPLE = 64
"""Eight 64-token samples: rows of 128 hold two each, a row of 512 all eight (no padding either way)."""


def _terms(*overrides: str, max_len: int | None = SAMPLE, shape=None) -> dict[str, mp.Term]:
    config = load_run_config(None, [f"trainer.max_tokens_per_microbatch={TOKENS}", *overrides])
    shape = shape or shape_from_hf_config(SHAPE.to_dict())
    return {t.name: t for t in mp.trainer_role(config, shape, device="cpu", max_len=max_len).terms}


def test_sdpa_counts_the_float_copy_of_the_mask_every_layer_keeps() -> None:
    shape = resolve_shape("qwen3-8b")
    config = ["model.dtype=bfloat16", "trainer.packed_row_tokens=2048"]
    masks = _terms(*config, shape=shape, max_len=1024)["attention masks"]
    area = TOKENS * TOKENS  # rows never wider than the micro-batch
    assert masks.bytes == shape.num_layers * area * 2
    long = load_run_config(None, ["trainer.max_tokens_per_microbatch=16384", *config])
    terms = {t.name: t for t in mp.trainer_role(long, shape, max_len=1024).terms}
    area = 8 * 2048 * 2048  # 16k tokens in rows of 2,048
    assert terms["attention masks"].bytes == shape.num_layers * area * 2
    assert "rows of 2,048 tokens" in terms["attention masks"].how


def test_a_sample_longer_than_a_row_widens_every_row() -> None:
    narrow = _terms("trainer.packed_row_tokens=128", max_len=64)["attention masks"].bytes
    wide = _terms("trainer.packed_row_tokens=128", max_len=256)["attention masks"].bytes
    assert wide == 2 * narrow  # rows as wide as the longest sample: 2 × 256² against 4 × 128²


def test_eager_keeps_every_heads_softmax_per_layer() -> None:
    sdpa = _terms("model.attn_implementation=sdpa")["attention masks"].bytes
    eager = _terms("model.attn_implementation=eager")["attention masks"].bytes
    area = TOKENS * TOKENS  # the default rows of 512: one row, the whole micro-batch
    assert sdpa == 4 * area * 4  # 4 layers' float32 copy
    assert eager == 4 * area * SHAPE.num_attention_heads * 4  # 4 layers' float32 softmax of every head


@pytest.mark.parametrize(
    "attention", ["flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4"]
)
def test_flex_and_flash_attention_have_no_square_term(attention: str) -> None:
    terms = _terms("model.device=cuda", "model.dtype=bfloat16", f"model.attn_implementation={attention}")
    assert "attention masks" not in terms


@pytest.mark.parametrize(("attention", "mask_element"), [("sdpa", 1), ("eager", 4)])
def test_checkpointing_keeps_the_mask_and_one_layers_copy_in_the_recompute(attention, mask_element) -> None:
    overrides = ["trainer.activation_checkpointing=true", "trainer.logprob_chunk_size=1"]
    terms = _terms(*overrides, f"model.attn_implementation={attention}")
    area = TOKENS * TOKENS
    assert terms["attention masks"].bytes == area * mask_element  # the checkpointed layers' input
    layer = TOKENS * mp.layer_activation_bytes_per_token(shape_from_hf_config(SHAPE.to_dict()), 4)
    copy = 4 if attention == "sdpa" else SHAPE.num_attention_heads * 4
    assert terms["recompute"].bytes == layer + area * copy


def _kept_for_backward(attention: str, row_tokens: int, checkpointing: bool) -> int:
    """Bytes a packed forward leaves allocated for backward (the level after it returns)."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(SHAPE).eval()
    model.set_attn_implementation(attention)
    if checkpointing:
        enable_activation_checkpointing(model)
    ids = torch.randint(0, SHAPE.vocab_size, (TOKENS // SAMPLE, SAMPLE))
    mask = torch.ones_like(ids)
    with AllocatedBytes() as trace:
        out = compute_token_logprobs(model, ids, mask, mask, chunk_size=64, packed_row_tokens=row_tokens)
        trace.mark("forward")
    del out
    return trace.at("forward")[0]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-checkpointing", "checkpointing"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_mask_term_matches_the_allocator(attention: str, checkpointing: bool) -> None:
    """One micro-batch in rows of 512 against rows of 128: every other saved tensor is the same size (the rows
    hold no padding), so the difference is the masks' (512² against 4 × 128²). Measured equal to the byte."""
    measured = _kept_for_backward(attention, 512, checkpointing) - _kept_for_backward(
        attention, 128, checkpointing
    )
    common = [f"model.attn_implementation={attention}", f"trainer.activation_checkpointing={checkpointing}"]
    wide = _terms(*common, "trainer.packed_row_tokens=512")["attention masks"].bytes
    narrow = _terms(*common, "trainer.packed_row_tokens=128")["attention masks"].bytes
    assert abs((wide - narrow) - measured) <= 0.15 * measured, (wide - narrow, measured)
