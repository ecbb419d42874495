"""The engine computes what Hugging Face computes: greedy tokens, log-probs, under continuous batching."""

from __future__ import annotations

import pytest
import torch
from engine_testlib import drain, engine, hf_greedy, reference_logprobs, request

PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11],
    [20, 21],
    [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42],
    [50],
    [60, 61, 62],
]


@pytest.fixture(params=["qwen2", "llama"])
def model(request):
    return request.getfixturevalue(request.param)


def test_greedy_batch_matches_hf_with_queueing_and_chunked_prefill(model):
    core = engine(model, max_running_requests=2, max_prefill_tokens_per_step=5)
    for i, prompt in enumerate(PROMPTS):
        core.add_request(request(str(i), prompt, temperature=0, max_new_tokens=10, ignore_eos=True))
    out = drain(core)
    for i, prompt in enumerate(PROMPTS):
        assert out[str(i)].token_ids == hf_greedy(model, prompt, 10)
        assert out[str(i)].logprobs == pytest.approx(
            reference_logprobs(model, prompt, out[str(i)].token_ids), abs=1e-4
        )


def test_requests_joining_mid_flight_match_hf(qwen2):
    core = engine(qwen2, max_running_requests=4)
    core.add_request(request("early", PROMPTS[0], temperature=0, max_new_tokens=12, ignore_eos=True))
    finished = {}
    for step, prompt in enumerate(PROMPTS[1:]):
        core.add_request(request(f"late{step}", prompt, temperature=0, max_new_tokens=6, ignore_eos=True))
        for _ in range(2):
            finished.update({g.request_id: g for g in core.step()})
    finished.update(drain(core))
    assert finished["early"].token_ids == hf_greedy(qwen2, PROMPTS[0], 12)
    for step, prompt in enumerate(PROMPTS[1:]):
        assert finished[f"late{step}"].token_ids == hf_greedy(qwen2, prompt, 6)


def test_sampled_logprobs_describe_the_tempered_distribution(qwen2):
    core = engine(qwen2)
    for i, prompt in enumerate(PROMPTS[:3]):
        core.add_request(request(str(i), prompt, temperature=0.7, max_new_tokens=8, ignore_eos=True))
    out = drain(core)
    for i, prompt in enumerate(PROMPTS[:3]):
        tokens = out[str(i)].token_ids
        assert out[str(i)].logprobs == pytest.approx(reference_logprobs(qwen2, prompt, tokens, 0.7), abs=1e-4)


def test_seeded_outputs_do_not_depend_on_batch_composition(qwen2):
    alone = engine(qwen2, seed=3)
    alone.add_request(request("target", PROMPTS[0], max_new_tokens=10, ignore_eos=True))
    crowded = engine(qwen2, seed=3, max_running_requests=3, max_prefill_tokens_per_step=4)
    for i, prompt in enumerate(PROMPTS[1:]):
        crowded.add_request(request(f"other{i}", prompt, max_new_tokens=3 + i, ignore_eos=True, top_p=0.9))
    crowded.add_request(request("target", PROMPTS[0], max_new_tokens=10, ignore_eos=True))
    expected, got = drain(alone)["target"], drain(crowded)["target"]
    assert got.token_ids == expected.token_ids
    assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    other_seed = engine(qwen2, seed=4)
    other_seed.add_request(request("target", PROMPTS[0], max_new_tokens=10, ignore_eos=True))
    assert drain(other_seed)["target"].token_ids != expected.token_ids


def test_prefix_continuation_resumes_like_an_uninterrupted_request(qwen2):
    full = engine(qwen2)
    full.add_request(request("r", PROMPTS[2], max_new_tokens=12, ignore_eos=True, seed=11))
    whole = drain(full)["r"]
    resumed = engine(qwen2)
    continued = request("r", PROMPTS[2], max_new_tokens=12, ignore_eos=True, seed=11)
    continued.prefix_token_ids = whole.token_ids[:5]
    continued.prefix_logprobs = whole.logprobs[:5]
    continued.prefix_versions = [7] * 5
    resumed.add_request(continued)
    out = drain(resumed)["r"]
    assert out.token_ids == whole.token_ids
    assert out.logprobs[:5] == whole.logprobs[:5]
    assert out.logprobs[5:] == pytest.approx(whole.logprobs[5:], abs=1e-5)
    assert out.versions == [7] * 5 + [0] * 7


def test_truncated_sampling_logprobs_match_the_truncated_hf_distribution(llama):
    core = engine(llama)
    core.add_request(request("k", PROMPTS[0], temperature=0.8, top_k=5, max_new_tokens=8, ignore_eos=True))
    core.add_request(request("p", PROMPTS[2], temperature=1.0, top_p=0.5, max_new_tokens=8, ignore_eos=True))
    out = drain(core)
    for rid, prompt, keep in (("k", PROMPTS[0], _top_k(5)), ("p", PROMPTS[2], _top_p(0.5))):
        tokens = out[rid].token_ids
        with torch.inference_mode():
            logits = llama(torch.tensor([prompt + tokens], device=llama.device)).logits[0].float() / (
                0.8 if rid == "k" else 1.0
            )
        for i, token in enumerate(tokens):
            logprobs = torch.log_softmax(keep(torch.log_softmax(logits[len(prompt) - 1 + i], dim=-1)), dim=-1)
            assert out[rid].logprobs[i] == pytest.approx(logprobs[token].item(), abs=1e-4)


def _top_k(k: int):
    def keep(logprobs: torch.Tensor) -> torch.Tensor:
        return logprobs.masked_fill(logprobs < logprobs.topk(k).values[-1], float("-inf"))

    return keep


def _top_p(p: float):
    def keep(logprobs: torch.Tensor) -> torch.Tensor:
        probs, order = logprobs.exp().sort(descending=True)
        num_kept = int((probs.cumsum(0) - probs < p).sum())
        return torch.full_like(logprobs, float("-inf")).scatter(
            0, order[:num_kept], logprobs[order[:num_kept]]
        )

    return keep


def test_slot_compaction_keeps_outputs_exact(qwen2):
    core = engine(qwen2, max_running_requests=4, max_prefill_tokens_per_step=5)
    for i, prompt in enumerate(PROMPTS[:3]):
        core.add_request(request(f"short{i}", prompt[:3], temperature=0, max_new_tokens=2, ignore_eos=True))
    core.add_request(request("long", PROMPTS[2], temperature=0, max_new_tokens=15, ignore_eos=True))
    finished, slots = {}, []
    while core.has_work():
        finished.update({g.request_id: g for g in core.step()})
        slots += [s.slot for s in core.scheduler.running if s.request_id == "long"]
    assert slots[0] == 3 and slots[-1] == 0
    assert finished["long"].token_ids == hf_greedy(qwen2, PROMPTS[2], 15)
    for i, prompt in enumerate(PROMPTS[:3]):
        assert finished[f"short{i}"].token_ids == hf_greedy(qwen2, prompt[:3], 2)
