"""Batched sampling with per-request parameters, and the log-prob of each sampled token.

Which distribution the log-prob describes (the SamplingParams contract):
- temperature > 0: the distribution actually sampled from — logits / temperature, restricted to the top-k
  tokens (k = 0: all), then to the smallest set of most likely tokens whose mass reaches top_p (the token
  that crosses top_p is kept), renormalised. With temperature 1, top_p 1, top_k 0 it is the model's own.
- temperature = 0 (greedy): the argmax token, with its log-prob under the temperature-1 model distribution.

Randomness is one uniform per token (inverse-CDF sampling), counter-based: the uniform of a request's n-th
output token is a hash of (request seed, n) computed on the logits' device (``uniforms.py``), so a request's
draws do not depend on which other requests share its batch, nor on the device, nor on an interruption.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.engine.uniforms import as_int64, counter_uniforms
from asyncrl.types import SamplingParams


@dataclass(frozen=True)
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float]


def sample(
    logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], positions: list[int]
) -> SampleOutput:
    """Sample one token per row of ``logits [rows, vocab]`` with that row's params, its uniform being the
    counter-based draw of (its request's seed, the index of the output token being sampled).

    One host-to-device copy (every row's parameters, seed and position in one int64 tensor), the uniforms
    hashed on the device, and one device-to-host copy (token ids and log-probs together) per call, with no
    other synchronisation: on a GPU each round trip costs more than the sampling arithmetic.
    """
    keys = torch.tensor([[as_int64(s) for s in seeds], list(positions)], dtype=torch.int64)
    rows = _param_rows(params, logits.shape[-1], keys).to(logits.device)
    return _sample(logits, params, rows[:4].view(torch.float64).float(), counter_uniforms(rows[4], rows[5]))


def sample_quantiles(
    logits: torch.Tensor, params: list[SamplingParams], uniforms: list[float]
) -> SampleOutput:
    """``sample`` with each row's uniform in [0, 1) given instead of drawn: the quantile of the row's
    distribution it takes. The distribution tests drive this with a fixed grid of quantiles."""
    given = torch.tensor([list(uniforms)], dtype=torch.float64).view(torch.int64)
    rows = _param_rows(params, logits.shape[-1], given).to(logits.device).view(torch.float64).float()
    return _sample(logits, params, rows[:4], rows[4])


def _param_rows(params: list[SamplingParams], vocab: int, keys: torch.Tensor) -> torch.Tensor:
    """Host int64 ``[4 + len(keys), rows]``: temperature, top-k, top-p and whether the row truncates (as
    float64 bit patterns) above ``keys``, so one copy moves them all."""
    floats = [
        [p.temperature for p in params],
        [p.top_k if p.top_k > 0 else vocab for p in params],
        [p.top_p for p in params],
        [float(p.top_k > 0 or p.top_p < 1) for p in params],
    ]
    return torch.cat([torch.tensor(floats, dtype=torch.float64).view(torch.int64), keys])


def _sample(
    logits: torch.Tensor, params: list[SamplingParams], rows: torch.Tensor, u: torch.Tensor
) -> SampleOutput:
    """A row's result depends only on its own logits, params and uniform: rows that truncate are sampled in
    sorted order, the others in vocabulary order, whatever the rest of the batch needs."""
    logits = logits.float()
    vocab = logits.shape[-1]
    truncates = [p.top_k > 0 or p.top_p < 1 for p in params]
    temperature, top_k, top_p, truncating = rows
    greedy = temperature == 0
    logprobs = torch.log_softmax(logits / torch.where(greedy, 1.0, temperature)[:, None], dim=-1)
    chosen, chosen_logprob = _draw(logprobs, u)
    if any(truncates):
        sorted_logprobs, order = _truncate(logprobs, top_k, top_p, _sort_width(params, truncates, vocab))
        rank, rank_logprob = _draw(sorted_logprobs, u)
        mask = truncating.bool()
        chosen = torch.where(mask, order.gather(1, rank[:, None])[:, 0], chosen)
        chosen_logprob = torch.where(mask, rank_logprob, chosen_logprob)
    if any(p.temperature == 0 for p in params):
        full = torch.log_softmax(logits, dim=-1)
        argmax = full.argmax(dim=-1)
        chosen = torch.where(greedy, argmax, chosen)
        chosen_logprob = torch.where(greedy, full.gather(1, argmax[:, None])[:, 0], chosen_logprob)
    token_ids, token_logprobs = torch.stack([chosen.double(), chosen_logprob.double()]).tolist()
    return SampleOutput([int(t) for t in token_ids], token_logprobs)


def _sort_width(params: list[SamplingParams], truncates: list[bool], vocab: int) -> int:
    """How many of each row's most likely tokens truncation must see: the largest top-k of the truncating
    rows when each of them has one (a partial ``topk`` instead of a full sort of the vocabulary), else all."""
    ks = [p.top_k for p, t in zip(params, truncates, strict=True) if t]
    return vocab if min(ks) <= 0 else min(max(ks), vocab)


def _draw(logprobs: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF draw per row: the chosen column and its log-prob."""
    chosen = _inverse_cdf(logprobs.exp(), u)
    return chosen, logprobs.gather(1, chosen[:, None])[:, 0]


def _truncate(
    logprobs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``width`` most likely tokens of each row in descending order with those outside the row's top-k /
    top-p dropped, renormalised; returns (sorted log-probs, their vocabulary indices). Tokens past ``width``
    are dropped by every truncating row anyway, so leaving them out changes nothing."""
    if width < logprobs.shape[-1]:
        sorted_logprobs, order = logprobs.topk(width, dim=-1)
    else:
        sorted_logprobs, order = logprobs.sort(dim=-1, descending=True)
    ranks = torch.arange(width, device=logprobs.device)[None, :]
    mass_before = sorted_logprobs.exp().cumsum(dim=-1) - sorted_logprobs.exp()
    drop = (ranks >= top_k[:, None]) | ((mass_before >= top_p[:, None]) & (ranks > 0))
    kept = sorted_logprobs.masked_fill(drop, float("-inf"))
    return torch.log_softmax(kept, dim=-1), order


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index of the first token whose cumulative mass exceeds ``u`` (scaled by the row's total mass)."""
    cdf = probs.cumsum(dim=-1)
    chosen = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return torch.where(chosen >= probs.shape[-1], probs.argmax(dim=-1), chosen)
