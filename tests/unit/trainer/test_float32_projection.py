"""The trainer's log-probs, entropies and values come from float32 projections of bf16 inputs: they equal a float64
reference computed from the same bf16-rounded weights and hidden states within float32 rounding, where rounding
the logits to bf16 (what ``lm_head(hidden).float()`` did under autocast) misses by up to ~0.06 nats.

Device-aware: ``scripts/gpu-smoke.sh`` reruns them with ``ASYNCRL_TEST_DEVICE=cuda``, where the projection takes
cuBLAS's float32-output path (``torch.mm(..., out_dtype=torch.float32)``) instead of CPU's upcast slices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asyncrl.models.float32_projection import float32_linear
from asyncrl.testing.models import device_under_test
from asyncrl.trainer.logprobs import logprobs_from_hidden, values_from_hidden

VOCAB, HIDDEN, TOKENS = 10_000, 64, 40
"""Over one ``SLICE_ROWS`` (8,192) of vocabulary, so the projection takes two slices of the weight."""
DEVICE = device_under_test()


def _bf16_case(master: torch.dtype):
    """Hidden states [1, TOKENS, HIDDEN] in bf16 and an LM head in ``master`` dtype whose bf16-rounded logits have
    a std near 4 and a top logit near 22 at every position (token 0), as sampled RL tokens see."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, TOKENS, HIDDEN, generator=generator)
    hidden[..., 0] = 6.0  # one direction every state shares ...
    weight = torch.randn(VOCAB, HIDDEN, generator=generator) * (4.0 / HIDDEN**0.5)
    weight[:, 0] = 0.0
    weight[0, 0] = 22.0 / 6.0  # ... that only token 0's row reads: its logit is ~22 everywhere
    head = nn.Linear(HIDDEN, VOCAB, bias=False, dtype=master, device=DEVICE)
    head.weight.data.copy_(weight)
    targets = torch.randint(0, VOCAB, (1, TOKENS), generator=generator)
    targets[0, ::3] = 0  # the confident token, and others from the tail
    return hidden.to(DEVICE, torch.bfloat16).requires_grad_(), head, targets.to(DEVICE)


def _reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
    """Float64 log-probs of ``targets`` (at t from the logits at t − 1) and entropies, from ``hidden`` [T, H] and
    ``weight`` exactly as given (already bf16-rounded), differentiable in both."""
    log_probs = (hidden[:-1] @ weight.T).log_softmax(-1)
    taken = log_probs.gather(-1, targets[1:, None]).squeeze(-1)
    return taken, -(log_probs.exp() * log_probs).sum(-1)


@pytest.mark.parametrize(
    ("master", "autocast"),
    [(torch.bfloat16, False), (torch.float32, True)],
    ids=["bf16-weights(fsdp2-mixed-precision)", "fp32-weights-under-bf16-autocast"],
)
def test_logprobs_and_gradients_equal_a_float64_reference_of_the_bf16_inputs(master, autocast) -> None:
    hidden, head, targets = _bf16_case(master)
    loss_mask = torch.ones(1, TOKENS, device=DEVICE)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
        out = logprobs_from_hidden(hidden, head, targets, loss_mask, chunk_size=16)
    out.logprobs.sum().backward()

    hidden64 = hidden.detach()[0].double().requires_grad_()
    weight64 = head.weight.detach().bfloat16().double().requires_grad_()  # what autocast multiplies with
    want, want_entropy = _reference(hidden64, weight64, targets[0])
    want.sum().backward()

    assert out.logprobs.dtype == torch.float32
    torch.testing.assert_close(out.logprobs[0, 1:].double(), want.detach(), atol=2e-5, rtol=0)
    # The entropy is log Z − Σ p·z: two numbers near 22 cancel, so float32 leaves ~1e-4 (not the projection's).
    torch.testing.assert_close(out.entropy[0, 1:].double(), want_entropy.detach(), atol=2e-4, rtol=0)
    # Backward is mixed precision (the logits' gradient is rounded to bf16, then accumulated in float32), and
    # the hidden gradient is returned in bf16: close to the exact one, not equal.
    assert hidden.grad.dtype == torch.bfloat16 and head.weight.grad.dtype == master
    for got, exact in [(hidden.grad[0, :-1], hidden64.grad[:-1]), (head.weight.grad, weight64.grad)]:
        assert float((got.double() - exact).norm() / exact.norm()) < 1e-2


def test_values_equal_a_float64_reference_of_the_bf16_inputs() -> None:
    """A value head under bf16 autocast: values near 3.7 would round to bf16's step of 1/64 there."""
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, TOKENS, HIDDEN, generator=generator)
    head = nn.Linear(HIDDEN, 1, device=DEVICE)
    head.weight.data = torch.randn(1, HIDDEN, generator=generator).to(DEVICE) * 0.5
    head.bias.data.fill_(3.7)
    hidden = hidden.to(DEVICE)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        values = values_from_hidden(hidden.bfloat16(), head, torch.ones(1, TOKENS, device=DEVICE))
    weight, bias = head.weight.detach().bfloat16().double(), head.bias.detach().bfloat16().double()
    want = hidden[0, :-1].bfloat16().double() @ weight[0] + bias
    assert values.dtype == torch.float32
    torch.testing.assert_close(values[0, 1:].double(), want, atol=1e-5, rtol=0)


def test_in_float32_it_is_linear_to_rounding_with_linears_gradients() -> None:
    """Float32 inputs, no autocast, an output size no slice divides (7 rows a slice: backward's; forward takes a
    float32 weight whole) and a bias: the same outputs and gradients as F.linear."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(5, 16, generator=generator).to(DEVICE).requires_grad_()
    linear = nn.Linear(16, 23, device=DEVICE)
    grad_out = torch.randn(5, 23, generator=generator).to(DEVICE)
    out = float32_linear(x, linear, slice_rows=7)
    (out * grad_out).sum().backward()
    got = [x.grad.clone(), linear.weight.grad.clone(), linear.bias.grad.clone()]
    x.grad = linear.weight.grad = linear.bias.grad = None
    want_out = F.linear(x, linear.weight, linear.bias)
    (want_out * grad_out).sum().backward()
    torch.testing.assert_close(out, want_out, atol=1e-6, rtol=0)
    for g, w in zip(got, [x.grad, linear.weight.grad, linear.bias.grad], strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)


def test_a_wrapped_head_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="trainer.lora.target_modules"):
        float32_linear(torch.zeros(1, 4), nn.Sequential(nn.Linear(4, 4)))
