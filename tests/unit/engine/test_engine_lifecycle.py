"""Abort, pause / update weights / resume, stop conditions and bad input on the synchronous core."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_testlib import CharTokenizer, drain, engine, hf_greedy, reference_logprobs, request, tiny_qwen2

from asyncrl.types import FinishReason, Request

PROMPT = [5, 6, 7, 8, 9, 10]


def new_weights(model) -> dict[str, torch.Tensor]:
    return {
        name: t.clone() for name, t in tiny_qwen2(seed=1).state_dict().items() if name != "lm_head.weight"
    }


def test_abort_returns_exactly_the_tokens_so_far(qwen2):
    core = engine(qwen2)
    core.add_request(request("a", PROMPT, temperature=0, max_new_tokens=20, ignore_eos=True))
    core.add_request(request("b", PROMPT[:3], temperature=0, max_new_tokens=5, ignore_eos=True))
    for _ in range(4):
        core.step()
    partial = core.abort("a")
    assert partial.finish_reason is FinishReason.ABORT
    assert partial.token_ids == hf_greedy(qwen2, PROMPT, 4)
    assert len(partial.logprobs) == len(partial.versions) == 4
    assert core.abort("a") is None
    assert drain(core)["b"].token_ids == hf_greedy(qwen2, PROMPT[:3], 5)  # the others keep going


def test_abort_of_a_waiting_request_returns_no_tokens(qwen2):
    core = engine(qwen2, max_running_requests=1)
    core.add_request(request("a", PROMPT, max_new_tokens=5))
    core.add_request(request("b", PROMPT, max_new_tokens=5))
    core.step()
    assert core.abort("b").token_ids == []


def keep_reference(old, new, prompt, output, num_old_kv) -> list[float]:
    """Log-probs when the first ``num_old_kv`` positions keep old-weight KV and the rest use the new weights."""
    ids = torch.tensor([prompt + output])
    with torch.inference_mode():
        cache = old(ids[:, :num_old_kv], use_cache=True).past_key_values
        logits = new(ids[:, num_old_kv:], past_key_values=cache, use_cache=True).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    first = len(prompt) - num_old_kv  # row of the logits predicting output[0]
    return [logprobs[first - 1 + i, t].item() for i, t in enumerate(output) if first - 1 + i >= 0]


@pytest.mark.parametrize("kv_on_update", ["keep", "recompute"])
def test_update_weights_mid_flight_new_tokens_follow_new_weights(kv_on_update):
    model = tiny_qwen2()
    old = copy.deepcopy(model)
    core = engine(model, kv_on_update=kv_on_update)
    core.add_request(request("r", PROMPT, max_new_tokens=10, ignore_eos=True))
    for _ in range(4):
        core.step()
    core.pause()
    assert core.step() == []
    weights = new_weights(model)
    core.update_weights(weights, version=3)
    core.resume()
    out = drain(core)["r"]
    assert out.versions == [0] * 4 + [3] * 6
    new = tiny_qwen2(seed=1)
    assert out.logprobs[:4] == pytest.approx(reference_logprobs(old, PROMPT, out.token_ids[:4]), abs=1e-4)
    if kv_on_update == "recompute":
        expected = reference_logprobs(new, PROMPT, out.token_ids)[4:]
    else:
        expected = keep_reference(old, new, PROMPT, out.token_ids, num_old_kv=len(PROMPT) + 3)[-6:]
    assert out.logprobs[4:] == pytest.approx(expected, abs=1e-4)


def test_update_weights_rejects_bad_state_dicts_and_keeps_old_weights(qwen2):
    core = engine(qwen2)
    core.add_request(request("r", PROMPT, temperature=0, max_new_tokens=6, ignore_eos=True))
    core.step()
    good = new_weights(qwen2)
    bad_shape = {**good, "model.norm.weight": torch.ones(3)}
    with pytest.raises(ValueError, match="'model.norm.weight' has shape \\(3,\\), expected \\(64,\\)"):
        core.update_weights(bad_shape, version=1)
    with pytest.raises(ValueError, match="unknown tensor 'model.nope'"):
        core.update_weights({**good, "model.nope": torch.ones(1)}, version=1)
    missing = {k: v for k, v in good.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ValueError, match="missing tensor.*model.layers.1.mlp.up_proj.weight"):
        core.update_weights(missing, version=1)
    tied_conflict = {**good, "lm_head.weight": good["model.embed_tokens.weight"] + 1}
    with pytest.raises(ValueError, match="tied tensors"):
        core.update_weights(tied_conflict, version=1)
    out = drain(core)["r"]
    assert out.token_ids == hf_greedy(tiny_qwen2(), PROMPT, 6) and out.versions == [0] * 6


def test_tied_lm_head_alone_and_partial_updates(qwen2):
    model = tiny_qwen2()
    core = engine(model)
    head = torch.randn(300, 64)
    core.update_weights([("lm_head.weight", head)], version=1, partial=True)
    assert torch.equal(model.model.embed_tokens.weight, head)
    assert core.version == 1


def test_untied_model_requires_lm_head(llama):
    core = engine(llama)
    weights = {k: v.clone() for k, v in llama.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match="missing tensor.*lm_head.weight"):
        core.update_weights(weights, version=1)


def test_stop_tokens_eos_and_max_new_tokens(qwen2):
    greedy = hf_greedy(qwen2, PROMPT, 12)
    core = engine(qwen2)
    core.add_request(request("stop", PROMPT, temperature=0, max_new_tokens=12, stop_token_ids=(greedy[3],)))
    core.add_request(request("len", PROMPT, temperature=0, max_new_tokens=5, ignore_eos=True))
    out = drain(core)
    cut = greedy.index(greedy[3]) + 1
    assert (out["stop"].token_ids, out["stop"].finish_reason) == (greedy[:cut], FinishReason.STOP)
    assert (out["len"].token_ids, out["len"].finish_reason) == (greedy[:5], FinishReason.LENGTH)
    eos_core = engine(qwen2)
    eos_core.eos_token_ids = frozenset({greedy[2]})
    eos_core.add_request(request("eos", PROMPT, temperature=0, max_new_tokens=12))
    eos_core.add_request(request("ignored", PROMPT, temperature=0, max_new_tokens=12, ignore_eos=True))
    out = drain(eos_core)
    assert out["eos"].token_ids == greedy[: greedy.index(greedy[2]) + 1]
    assert out["ignored"].token_ids == greedy


def test_stop_string_ends_right_after_its_token(qwen2):
    greedy = hf_greedy(qwen2, PROMPT, 12)
    text = CharTokenizer().decode(greedy)
    stop = text[4:6]
    core = engine(qwen2, tokenizer=CharTokenizer())
    core.add_request(request("s", PROMPT, temperature=0, max_new_tokens=12, stop_strings=(stop,)))
    out = drain(core)["s"]
    assert out.token_ids == greedy[: text.index(stop) + 2]
    assert out.finish_reason is FinishReason.STOP and out.text.endswith(stop)


def test_context_limit_ends_with_length(qwen2):
    core = engine(qwen2, max_model_len=10)
    core.add_request(request("r", PROMPT, temperature=0, max_new_tokens=50, ignore_eos=True))
    out = drain(core)["r"]
    assert (len(out.token_ids), out.finish_reason) == (4, FinishReason.LENGTH)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Request(request_id="empty", prompt_token_ids=[]), "request empty: empty prompt"),
        (
            Request(request_id="long", prompt_token_ids=list(range(40))),
            "request long: prompt \\+ prefix is 40",
        ),
        (Request(request_id="oov", prompt_token_ids=[1, 300]), "request oov: token ids must be in"),
        (
            Request(request_id="kw", prompt_token_ids=[1], sampling={"temprature": 1.0}),
            "request kw: unknown sampling",
        ),
        (
            Request(request_id="val", prompt_token_ids=[1], sampling={"top_p": 0}),
            "request val: top_p must be",
        ),
        (
            Request(request_id="stop", prompt_token_ids=[1], sampling={"stop_strings": ["x"]}),
            "request stop: stop_strings need",
        ),
    ],
)
def test_bad_requests_raise_naming_the_request_and_the_engine_keeps_serving(qwen2, bad, message):
    core = engine(qwen2, max_model_len=32)
    core.add_request(request("ok", PROMPT, temperature=0, max_new_tokens=4, ignore_eos=True))
    core.step()
    with pytest.raises(ValueError, match=message):
        core.add_request(bad)
    assert drain(core)["ok"].token_ids == hf_greedy(qwen2, PROMPT, 4)


def test_duplicate_in_flight_id_is_rejected_and_dict_params_are_accepted(qwen2):
    core = engine(qwen2)
    core.add_request(
        Request(request_id="d", prompt_token_ids=[1, 2], sampling={"max_new_tokens": 3, "seed": 1})
    )
    with pytest.raises(ValueError, match="request d: a request with this id is already in flight"):
        core.add_request(request("d", [1, 2]))
    assert len(drain(core)["d"].token_ids) <= 3


def test_a_published_update_is_applied_and_an_older_one_refused_before_any_copy(qwen2):
    from asyncrl.weight_sync import InProcessSync, WeightSyncError

    core = engine(qwen2)
    sync = InProcessSync()
    weights = new_weights(qwen2)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]  # trainers always send the output layer
    core.update_weights(sync.publish(2, weights), version=2)
    assert torch.equal(dict(qwen2.named_parameters())["model.norm.weight"], weights["model.norm.weight"])
    stale = {name: torch.zeros_like(t) for name, t in weights.items()}
    with pytest.raises(WeightSyncError, match="weight update v1 is older than the served v2; refused"):
        core.update_weights(sync.publish(1, stale), version=1)
    assert torch.equal(dict(qwen2.named_parameters())["model.norm.weight"], weights["model.norm.weight"])
