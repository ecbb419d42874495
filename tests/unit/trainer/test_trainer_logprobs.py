"""Chunked per-token log-probs: the shift (logits at t-1 score token t) and equality with a direct log_softmax."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn
from trainer_fixtures import tiny_qwen2

from asyncrl.trainer.logprobs import compute_token_logprobs


class _Body(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, vocab)
        self.embed.weight.data = 2.0 * torch.eye(vocab)

    def forward(self, input_ids, attention_mask, use_cache):
        return SimpleNamespace(last_hidden_state=self.embed(input_ids))


class _EchoLM(nn.Module):
    """Logits at position t are 2·onehot(input_ids[t]): the model predicts that the current token repeats."""

    def __init__(self, vocab: int = 4) -> None:
        super().__init__()
        self.base_model = _Body(vocab)
        self.lm_head = nn.Linear(vocab, vocab, bias=False)
        self.lm_head.weight.data = torch.eye(vocab)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def test_logprob_of_token_t_comes_from_logits_at_t_minus_1():
    input_ids = torch.tensor([[0, 0, 1, 1, 3]])
    loss_mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])
    out = compute_token_logprobs(_EchoLM(), input_ids, torch.ones_like(input_ids), loss_mask, chunk_size=2)
    log_z = math.log(math.exp(2) + 3)
    # t=1: token 0 after 0 (repeat), t=2: token 1 after 0 (switch), t=3: token 1 after 1 (repeat), t=4 masked.
    expected = [0.0, 2 - log_z, -log_z, 2 - log_z, 0.0]
    assert torch.allclose(out.logprobs, torch.tensor([expected]), atol=1e-6)
    p_top, p_rest = math.exp(2 - log_z), math.exp(-log_z)
    entropy = -(p_top * math.log(p_top) + 3 * p_rest * math.log(p_rest))
    assert torch.allclose(out.entropy, torch.tensor([[0.0, entropy, entropy, entropy, 0.0]]), atol=1e-6)


def test_temperature_divides_the_logits():
    input_ids = torch.tensor([[0, 0]])
    out = compute_token_logprobs(
        _EchoLM(),
        input_ids,
        torch.ones_like(input_ids),
        torch.tensor([[0.0, 1.0]]),
        chunk_size=8,
        temperature=2.0,
    )
    assert torch.allclose(out.logprobs[0, 1], torch.tensor(1 - math.log(math.e + 3)), atol=1e-6)


def _batch():
    input_ids = torch.tensor([[5, 17, 42, 8, 250, 3, 9], [7, 7, 100, 2, 0, 0, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 0]], dtype=torch.float32)
    return input_ids, attention_mask, loss_mask


def _direct(model, input_ids, attention_mask, loss_mask):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    log_probs = logits[:, :-1].log_softmax(-1)
    taken = log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    pad = torch.zeros(input_ids.shape[0], 1)
    return torch.cat([pad, taken], 1) * loss_mask, torch.cat([pad, entropy], 1) * loss_mask


def test_chunked_logprobs_and_gradients_equal_a_direct_log_softmax():
    input_ids, attention_mask, loss_mask = _batch()
    model = tiny_qwen2()
    direct, direct_entropy = _direct(model, input_ids, attention_mask, loss_mask)
    direct.sum().backward()
    direct_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = compute_token_logprobs(model, input_ids, attention_mask, loss_mask, chunk_size=3)
    out.logprobs.sum().backward()
    assert torch.allclose(out.logprobs, direct, atol=1e-5)
    assert torch.allclose(out.entropy, direct_entropy.detach(), atol=1e-5)
    assert not out.entropy.requires_grad
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, direct_grads[name], atol=1e-5), name


def test_chunk_size_does_not_change_the_result():
    input_ids, attention_mask, loss_mask = _batch()
    model = tiny_qwen2()
    with torch.no_grad():
        results = [
            compute_token_logprobs(model, input_ids, attention_mask, loss_mask, chunk_size=c).logprobs
            for c in (1, 4, 1000)
        ]
    assert torch.allclose(results[0], results[1], atol=1e-6) and torch.allclose(
        results[0], results[2], atol=1e-6
    )
