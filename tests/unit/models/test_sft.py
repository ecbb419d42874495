"""Warm start: prompt tokens carry no loss, the loss falls on a tiny run, the LR schedule is exact, micro-batches
bound memory without changing a step."""

import copy
from dataclasses import replace

import pytest
import torch

from asyncrl.config.sft import SFTConfig
from asyncrl.config.task import TaskConfig
from asyncrl.data import TaskSample, make_task, render_prompt
from asyncrl.data.base import prompt_token_ids
from asyncrl.models.sft import (
    IGNORE_INDEX,
    EncodedExample,
    chat_response_text,
    collate,
    encode_example,
    lr_at,
    micro_batches,
    sft_loss,
    train_steps,
)
from asyncrl.models.tiny import build_tiny_model
from asyncrl.models.tokenizer import train_tokenizer
from asyncrl.serve.chat_format import PromptStops

SAMPLE = TaskSample(uid="u", prompt="count 8 to 10:", answer="8 9 10", demonstration=" 8 9 10")


@pytest.fixture(scope="module")
def tokenizer():
    texts = [
        s.prompt + s.demonstration for s in make_task(TaskConfig(num_train=300, num_eval=5)).split("train")
    ]
    return train_tokenizer(texts, 300)


def test_encode_labels_only_response_and_eos(tokenizer):
    example = encode_example(tokenizer, SAMPLE)
    prompt_ids = tokenizer("count 8 to 10:", add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(" 8 9 10", add_special_tokens=False)["input_ids"]
    assert example.input_ids == prompt_ids + response_ids + [tokenizer.eos_token_id]
    assert example.labels == [IGNORE_INDEX] * len(prompt_ids) + response_ids + [tokenizer.eos_token_id]
    # every digit and space is its own token, so " 8 9 10" is 7 tokens, then EOS
    assert len(response_ids) == 7


CHAT_SAMPLE = replace(SAMPLE, uid="chat", messages=({"role": "user", "content": SAMPLE.prompt},))


def test_a_chat_row_is_trained_to_end_with_the_templates_end_of_turn_not_eos(tokenizer):
    """Sampling stops a templated turn at ``<|im_end|>`` (``PromptStops``), so that is the ending trained: the
    demonstration then ``<|im_end|>``, as the template renders the turn; the newline ChatML renders after it is
    never sampled (the turn stopped) and is not trained."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end != tokenizer.eos_token_id  # the Qwen-Base case: EOS <|endoftext|>, turns end <|im_end|>
    prompt = render_prompt(CHAT_SAMPLE, tokenizer)
    assert chat_response_text(tokenizer, CHAT_SAMPLE, prompt) == " 8 9 10<|im_end|>\n"
    example = encode_example(tokenizer, CHAT_SAMPLE)
    prompt_ids = prompt_token_ids(CHAT_SAMPLE, tokenizer)
    response_ids = tokenizer(" 8 9 10", add_special_tokens=False)["input_ids"]
    assert example.input_ids == prompt_ids + response_ids + [im_end]
    assert example.labels == [IGNORE_INDEX] * len(prompt_ids) + response_ids + [im_end]
    assert PromptStops(tokenizer)(CHAT_SAMPLE) == (im_end,)  # the token rollouts of this prompt stop at


def test_a_template_that_rewrites_the_prompt_for_the_answer_is_refused_naming_the_sample(tokenizer):
    rewriting = copy.deepcopy(tokenizer)
    rewriting.chat_template = "{{ messages | length }}" + tokenizer.chat_template
    with pytest.raises(ValueError, match="sample chat: the chat template renders the demonstration's turn"):
        encode_example(rewriting, CHAT_SAMPLE)


def test_collate_pads_right_without_labels():
    from asyncrl.models.sft import EncodedExample

    batch = collate(
        [EncodedExample(input_ids=[5, 6, 7], labels=[-100, 6, 7]), EncodedExample(input_ids=[8], labels=[8])],
        pad_token_id=0,
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_loss_ignores_prompt_tokens(tokenizer):
    model = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, vocab_size=len(tokenizer), seed=0)
    example = encode_example(tokenizer, SAMPLE)
    batch = collate([example], tokenizer.pad_token_id)
    changed = batch["input_ids"].clone()
    changed[0, 1] = (changed[0, 1] + 1) % len(tokenizer)  # a prompt token, also a prompt *label* position
    changed_labels = batch["labels"].clone()
    assert changed_labels[0, 1] == IGNORE_INDEX
    logits = model(input_ids=batch["input_ids"]).logits[0, :-1]
    targets = batch["labels"][0, 1:]
    keep = targets != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[keep], targets[keep])
    assert sft_loss(model, batch).item() == pytest.approx(expected.item(), rel=1e-6)
    assert int(keep.sum()) == 8


def test_loss_decreases_on_a_tiny_run(tokenizer):
    samples = make_task(TaskConfig(type="count", num_train=64, num_eval=5, max_items=4)).split("train")
    examples = [encode_example(tokenizer, s) for s in samples]
    model = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, vocab_size=len(tokenizer), seed=0)
    config = SFTConfig(max_steps=20, batch_size=8, lr=5e-3, warmup_steps=2, log_every=0, label_smoothing=0.0)
    losses = train_steps(model, examples, config, tokenizer.pad_token_id)
    assert len(losses) == 20
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5


def test_lr_schedule_exact_values():
    assert lr_at(0, peak=1.0, warmup_steps=4, total_steps=14) == 0.25
    assert lr_at(3, peak=1.0, warmup_steps=4, total_steps=14) == 1.0
    assert lr_at(4, peak=1.0, warmup_steps=4, total_steps=14) == 1.0
    assert lr_at(9, peak=1.0, warmup_steps=4, total_steps=14) == pytest.approx(0.55)
    assert lr_at(14, peak=1.0, warmup_steps=4, total_steps=14) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 100, "num_heads": 3}, "divisible"),
        ({"max_steps": 0}, "sft.max_steps"),
        ({"output_dir": ""}, "sft.output_dir"),
        ({"architecture": "llama"}, "sft.architecture"),
        ({"num_heads": 4, "num_kv_heads": 3}, "divisible by sft.num_kv_heads"),
        ({"head_dim": 64}, "qwen3 setting"),
        ({"intermediate_size": 0}, "sft.intermediate_size"),
    ],
)
def test_sft_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        SFTConfig(**overrides)


def test_mean_and_pass_at_k():
    from asyncrl.models.sft import mean_and_pass_at_k

    assert mean_and_pass_at_k([[1.0, 0.0, 0.0, 0.0], [0.0] * 4, [1.0] * 4]) == (5 / 12, 2 / 3)


def test_length_batches_group_similar_lengths_and_cover_everything():
    import random

    from asyncrl.models.sft import length_batches

    lengths = [5, 90, 6, 91, 7, 92]
    batches = length_batches(lengths, 3, random.Random(0))
    assert sorted(sorted(b) for b in batches) == [[0, 2, 4], [1, 3, 5]]


def test_label_smoothing_matches_torch_reference(tokenizer):
    model = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, vocab_size=len(tokenizer), seed=0)
    batch = collate([encode_example(tokenizer, SAMPLE)], tokenizer.pad_token_id)
    logits = model(input_ids=batch["input_ids"]).logits[0, :-1]
    targets = batch["labels"][0, 1:]
    keep = targets != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[keep], targets[keep], label_smoothing=0.1)
    assert sft_loss(model, batch, label_smoothing=0.1).item() == pytest.approx(expected.item(), rel=1e-6)
    with pytest.raises(ValueError, match="sft.label_smoothing"):
        SFTConfig(label_smoothing=1.0)


def test_micro_batches_stay_within_the_token_budget_and_a_long_example_stands_alone():
    examples = [EncodedExample(input_ids=[1] * n, labels=[1] * n) for n in (3, 4, 4, 10, 2)]
    parts = micro_batches(examples, max_tokens=8)
    assert [[len(e.input_ids) for e in part] for part in parts] == [[3, 4], [4], [10], [2]]
    assert [e for part in parts for e in part] == examples


def test_a_micro_batched_step_equals_the_whole_batch_step(tokenizer):
    """The token budget bounds memory, not the recipe: the accumulated step lands on the same weights."""
    samples = make_task(TaskConfig(type="count", num_train=16, num_eval=5, max_items=12)).split("train")
    examples = [encode_example(tokenizer, s) for s in samples]
    longest = max(len(e.input_ids) for e in examples)
    weights = []
    for budget in (longest * len(examples), longest):  # one micro-batch; one example per micro-batch
        model = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, vocab_size=len(tokenizer), seed=0)
        config = SFTConfig(
            max_steps=2, batch_size=16, warmup_steps=0, log_every=0, max_tokens_per_microbatch=budget
        )
        losses = train_steps(model, examples, config, tokenizer.pad_token_id)
        weights.append((losses, [p.detach().clone() for p in model.parameters()]))
    (whole_losses, whole), (micro_losses, micro) = weights
    assert micro_losses == pytest.approx(whole_losses, rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(whole, micro, strict=True))
