"""Batched prefill: the chunks of one step share one padded forward pass and compute what they would alone."""

from __future__ import annotations

import pytest
import torch
from engine_testlib import drain, engine, hf_greedy, reference_logprobs, request

from asyncrl.engine.model_runner import ModelRunner, padding_groups, shared_prefills
from asyncrl.engine.scheduler import Chunk
from asyncrl.engine.sequence import Sequence

PROMPTS = [[5, 6, 7, 8, 9], [20, 21, 22], [30, 31, 32, 33, 34, 35, 36, 37, 38], [40, 41, 42, 43, 44, 45, 46]]


@pytest.mark.parametrize(
    ("lengths", "groups"),
    [
        ([8, 8, 7, 6], [[0, 1, 2, 3]]),
        ([3, 9, 1], [[1, 0], [2]]),
        ([100, 5, 5, 5], [[0, 1], [2, 3]]),
        ([3], [[0]]),
        ([], []),
    ],
)
def test_padding_groups_bound_the_padding_longest_first(lengths, groups):
    assert padding_groups(lengths) == groups


def sequences(prompts: list[list[int]] = PROMPTS) -> list[Sequence]:
    seqs = [Sequence.from_request(request(str(i), prompt), 0) for i, prompt in enumerate(prompts)]
    for slot, seq in enumerate(seqs):
        seq.slot = slot
    return seqs


def runner(model) -> ModelRunner:
    return ModelRunner(model, num_slots=len(PROMPTS), max_len=32)


def run_steps(model, steps: list[list[tuple[int, int, int]]], batched: bool) -> tuple[ModelRunner, list]:
    """Run (sequence, start, num_tokens) chunks step by step, all at once or one chunk per call."""
    seqs, core, logits = sequences(), runner(model), []
    for step in steps:
        chunks = [Chunk(seqs[i], start, n) for i, start, n in step]
        for group in [chunks] if batched else [[chunk] for chunk in chunks]:
            logits.extend(core.run([], group, len(seqs)))
    return core, logits


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_one_padded_pass_matches_prefilling_one_by_one(request, name):
    model = request.getfixturevalue(name)
    # Step 1: three whole prompts and the first 4 tokens of the last; step 2: its rest at offset 4.
    steps = [[(0, 0, 5), (1, 0, 3), (2, 0, 9), (3, 0, 4)], [(3, 4, 3)]]
    batched, batched_logits = run_steps(model, steps, batched=True)
    alone, alone_logits = run_steps(model, steps, batched=False)
    assert len(batched_logits) == len(alone_logits) == 4
    for got, want in zip(batched_logits, alone_logits, strict=True):
        torch.testing.assert_close(torch.log_softmax(got, -1), torch.log_softmax(want, -1), atol=1e-5, rtol=0)
    for layer in range(len(model.model.layers)):
        for slot, prompt in enumerate(PROMPTS):
            got_k, got_v = batched.cache.view(layer, slice(slot, slot + 1), len(prompt))
            want_k, want_v = alone.cache.view(layer, slice(slot, slot + 1), len(prompt))
            torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=0)
            torch.testing.assert_close(got_v, want_v, atol=1e-5, rtol=0)


def test_prompts_admitted_in_one_step_match_hf_after_one_forward(qwen2):
    core = engine(qwen2, max_running_requests=4, max_prefill_tokens_per_step=64)
    for i, prompt in enumerate(PROMPTS):
        core.add_request(request(str(i), prompt, temperature=0, max_new_tokens=6, ignore_eos=True))
    forwards = []
    hook = qwen2.model.embed_tokens.register_forward_hook(lambda *args: forwards.append(1))
    try:
        core.step()
    finally:
        hook.remove()
    assert len(forwards) == 1
    assert core.scheduler.kv_tokens_cached == sum(len(p) for p in PROMPTS)
    out = drain(core)
    for i, prompt in enumerate(PROMPTS):
        assert out[str(i)].token_ids == hf_greedy(qwen2, prompt, 6)
        assert out[str(i)].logprobs == pytest.approx(
            reference_logprobs(qwen2, prompt, out[str(i)].token_ids), abs=1e-4
        )


def test_shared_prefills_pair_repeated_prompts_that_start_at_zero():
    a, b, c, d, e = sequences([[1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 2, 3], [1, 2, 3]])
    chunks = [Chunk(a, 0, 3), Chunk(b, 0, 3), Chunk(c, 0, 3), Chunk(d, 0, 2), Chunk(e, 1, 2)]
    unique, copies = shared_prefills(chunks)
    assert unique == [chunks[0], chunks[2], chunks[3], chunks[4]]
    assert copies == [(chunks[0], chunks[1])]


def test_a_group_sharing_one_prompt_is_prefilled_once_and_copied(qwen2):
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[2], PROMPTS[2]]
    seqs, core = sequences(prompts), runner(qwen2)
    shapes = []
    hook = qwen2.model.embed_tokens.register_forward_hook(lambda m, args, out: shapes.append(out.shape[:2]))
    try:
        logits = core.run([], [Chunk(seq, 0, len(seq.token_ids)) for seq in seqs], len(seqs))
    finally:
        hook.remove()
    assert shapes == [(2, 9)]
    assert torch.equal(logits[0], logits[2]) and torch.equal(logits[0], logits[3])
    _, alone_logits = run_steps(qwen2, [[(2, 0, 9)]], batched=False)
    torch.testing.assert_close(logits[0], alone_logits[0], atol=1e-5, rtol=0)
    for layer in range(len(qwen2.model.layers)):
        for slot in (2, 3):
            got = core.cache.view(layer, slice(slot, slot + 1), 9)
            want = core.cache.view(layer, slice(0, 1), 9)
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_group_samples_on_copied_kv_keep_exact_logprobs(qwen2):
    core = engine(qwen2, max_running_requests=4, max_prefill_tokens_per_step=64)
    for i in range(4):
        core.add_request(request(str(i), PROMPTS[3], max_new_tokens=8, ignore_eos=True, seed=i))
    out = drain(core)
    assert len({tuple(g.token_ids) for g in out.values()}) > 1
    for generation in out.values():
        assert generation.logprobs == pytest.approx(
            reference_logprobs(qwen2, PROMPTS[3], generation.token_ids), abs=1e-4
        )
