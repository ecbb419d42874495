"""The shipped warm-start checkpoint loads through the real from_pretrained path and is small."""

from pathlib import Path

import pytest
import torch

from asyncrl.config.task import TaskConfig
from asyncrl.models.loading import load_model_and_tokenizer
from asyncrl.tasks import make_task

CHECKPOINT = Path(__file__).resolve().parents[3] / "asyncrl" / "assets" / "tiny-count"


def test_checkpoint_is_small_safetensors_with_reproduce_command():
    sizes = {p.name: p.stat().st_size for p in CHECKPOINT.iterdir()}
    assert "model.safetensors" in sizes
    assert sum(sizes.values()) <= 20 * 2**20
    assert "asyncrl sft" in (CHECKPOINT / "README.md").read_text()


@pytest.fixture(scope="module")
def loaded():
    return load_model_and_tokenizer(str(CHECKPOINT), device="cpu")


def test_tokenizer_ids_round_trip_on_task_texts(loaded):
    _, tokenizer = loaded
    for sample in make_task(TaskConfig(num_train=5, num_eval=20)).split("eval"):
        for text in (sample.prompt, sample.demonstration):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert tokenizer.decode(ids) == text
    # digits are single tokens and the space before a number is its own token (Qwen2 pre-tokenizer)
    assert len(tokenizer(" 123 45", add_special_tokens=False)["input_ids"]) == 7
    assert tokenizer.eos_token_id == 0 and tokenizer.pad_token_id == 0


def test_model_has_learned_the_task(loaded):
    """The loaded weights are the trained ones: held-out demonstrations cost far less than the
    ln(vocab) ≈ 5.9 nats per token of an untrained model."""
    from asyncrl.trainer.sft import collate, encode_examples, sft_loss

    model, tokenizer = loaded
    assert model.config.model_type == "qwen2"
    held_out = make_task(TaskConfig(num_train=5, num_eval=32)).split("eval")
    batch = collate(encode_examples(tokenizer, held_out), tokenizer.pad_token_id)
    with torch.no_grad():
        assert sft_loss(model, batch).item() < 0.5
