"""The built-in engine's logits are float32 from its serving-dtype head and hidden states, as the trainer's are
(``models.float32_projection``): a bf16 engine's log-prob of each token it samples equals a float64 reference
of the same bf16 head and final hidden state within float32 rounding, where rounding the logits to bf16 (what
``lm_head(hidden)`` returned before) missed it by ~0.03 nats on this head. Both decode paths: per-step shapes
and the bucketed static one (``engine.decode_graphs: on``; eager on CPU, captured as CUDA graphs on CUDA).

Device-aware: ``scripts/gpu-smoke.sh`` reruns this file with ``ASYNCRL_TEST_DEVICE=cuda``, where the projection
takes cuBLAS's float32-output path and the static decode step is really captured over it.
"""

from __future__ import annotations

import pytest
import torch
from engine_testlib import engine, request, tiny_llama

PROMPT = [5, 17, 9, 41, 3]
NEW_TOKENS = 8


def _wide_head(dtype: torch.dtype) -> torch.nn.Module:
    """tiny_llama (untied head) with its head scaled so the logits spread as a real model's do (std ~4, top
    ~11), where bf16's step (0.0625 at 8-16) moves a log-prob by hundredths of a nat; the tiny model's own
    (std 0.8, top ~2) are too small for bf16's rounding to show as clearly."""
    model = tiny_llama(seed=2)
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)
    return model.to(dtype)


def _generate_recording_hidden(core) -> tuple[list[int], list[float], list[torch.Tensor]]:
    """Sample one request (temperature 1, no truncation: the log-probs are the model's own), recording the
    final-norm output row each of its tokens was projected from (slot 0: the engine's only request).

    The hook copies the norm's output into a fixed buffer rather than keeping it from Python: on CUDA a captured
    decode graph replays that copy with the step, where a Python hook runs only while the graph is captured."""
    norm = core.model.model.norm
    buffer = norm.weight.new_zeros(64, norm.weight.shape[0])  # rows: more than any step of one request has

    def keep(_module, _inputs, out: torch.Tensor) -> None:
        buffer[: out.shape[0]].copy_(out)

    hook = norm.register_forward_hook(keep)
    hidden: list[torch.Tensor] = []
    finished = {}
    try:
        core.add_request(
            request("r", PROMPT, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=3, ignore_eos=True)
        )
        while core.has_work():  # each step: one forward (the prefill, then a decode), one token
            finished.update({g.request_id: g for g in core.step()})
            hidden.append(buffer[0].clone())
    finally:
        hook.remove()
    out = finished["r"]
    assert len(hidden) == len(out.token_ids) == NEW_TOKENS
    return list(out.token_ids), list(out.logprobs), hidden


@pytest.mark.parametrize("mode", ["off", "on"])
def test_a_bfloat16_engines_logprobs_equal_a_float64_projection_of_its_bf16_head(mode):
    core = engine(_wide_head(torch.float32), dtype="bfloat16", decode_graphs=mode)
    tokens, logprobs, hidden = _generate_recording_hidden(core)
    head = core.model.lm_head.weight
    assert head.dtype == hidden[0].dtype == torch.bfloat16
    taken = torch.tensor(tokens, device=head.device)[:, None]
    # [tokens, vocab]: the exact products of the bf16 inputs
    logits64 = torch.stack(hidden).double() @ head.double().T
    assert logits64.max(-1).values.min().item() > 8  # the spread the test needs (``_wide_head``)
    expected = logits64.log_softmax(-1).gather(1, taken)[:, 0]
    assert logprobs == pytest.approx(expected.tolist(), abs=1e-4, rel=0)
    # what the tolerance tells apart: the same logits rounded to bf16, as ``lm_head`` returned them
    rounded = logits64.to(torch.bfloat16).double().log_softmax(-1).gather(1, taken)[:, 0]
    assert (rounded - expected).abs().max().item() > 1e-2


@pytest.mark.parametrize("mode", ["off", "on"])
def test_a_float32_engines_logprobs_are_those_of_its_own_lm_head(mode):
    """Float32 weights: the projection is the head's own product, so a float32 engine is unchanged, bit for bit."""
    core = engine(_wide_head(torch.float32), decode_graphs=mode)
    tokens, logprobs, hidden = _generate_recording_hidden(core)
    with (
        torch.inference_mode()
    ):  # row by row, as the engine projected them (one row's product is not a batch's)
        rows = [core.model.lm_head(h[None])[0] for h in hidden]
    expected = [row.log_softmax(-1)[t].item() for row, t in zip(rows, tokens, strict=True)]
    assert logprobs == expected
