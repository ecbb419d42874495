"""Per-token log-probs of the taken tokens (and the policy's entropy) without the full [B, T, V] log-softmax.

Key decision: the decoder body runs once; the vocabulary projection and log-softmax run on chunks of
``chunk_size`` token positions, and only at positions that are trained (loss mask 1). With gradients on, each
chunk is activation-checkpointed, so backward recomputes one chunk's logits at a time instead of keeping all
of them: peak memory holds one [chunk, V] block, whatever the vocabulary or sequence length.

The projections (the vocabulary's, and a value head's) return float32 from inputs in the compute dtype
(``models/float32_projection.py``): under autocast or FSDP2's bf16 parameters the logits are never rounded to bf16.

Alignment (see batching.py): ``logprobs[b, t]`` is log p(input_ids[b, t] | input_ids[b, :t]), from the logits at
position t - 1; column 0 is always 0.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from asyncrl.models.float32_projection import float32_linear
from asyncrl.trainer.packing import pack, rows_for

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TokenLogProbs:
    """Log-probs and entropies aligned with ``input_ids``, and the values of a value head on the same trunk if
    there is one; 0 wherever the loss mask is 0."""

    logprobs: torch.Tensor  # [B, T] float32; carries gradients when computed with grad enabled
    entropy: torch.Tensor  # [B, T] float32, detached: a metric, never a loss term here
    values: torch.Tensor | None = None  # [B, T] float32: V of the state before token t (critic shared_trunk)


def compute_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    packed_row_tokens: int | None = None,
    value_head: nn.Module | None = None,
) -> TokenLogProbs:
    """Run ``model`` on a right-padded batch and return log-probs of its own tokens where ``loss_mask`` is 1
    (and ``value_head``'s values there, from the same hidden states).

    With ``packed_row_tokens`` the decoder runs on the batch's real tokens packed into rows of at most that
    many tokens (see packing.py); the result is the same as the padded run's, without computing padding."""
    hidden = decoder_hidden(decoder_body(model), input_ids, attention_mask, packed_row_tokens)
    out = logprobs_from_hidden(
        hidden,
        model.get_output_embeddings(),
        input_ids,
        loss_mask,
        chunk_size=chunk_size,
        temperature=temperature,
    )
    if value_head is None:
        return out
    return TokenLogProbs(out.logprobs, out.entropy, values_from_hidden(hidden, value_head, loss_mask))


def values_from_hidden(hidden: torch.Tensor, value_head: nn.Module, loss_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] values aligned like log-probs: position t holds the head's value of the hidden state at t − 1 (the
    state before token t), computed only where the loss mask is 1."""
    batch_size, seq_len = loss_mask.shape
    trained = loss_mask[:, 1:] > 0
    values_n = float32_linear(hidden[:, :-1][trained], value_head).squeeze(-1)  # [N]
    return _scatter_aligned(values_n, trained, batch_size, seq_len)


class TokenLogProbModule(nn.Module):
    """``compute_token_logprobs`` of ``model`` as one module call, with the trainer's options fixed.

    Why a module: FSDP2 unshards a module's parameters around its ``forward``. The decoder body and the
    vocabulary projection are reached separately here (``base_model``, then ``get_output_embeddings`` in
    chunks), so wrapping both in one forward is what lets the root's parameters (embeddings, final norm, a
    tied head) be gathered once for the whole computation. In one process it is a plain call.

    With gradients on, the result is always a graph through every parameter, even for rows with no trained
    token: then row 0's last token is projected as a probe and the result multiplied by zero. Under FSDP2 every
    rank must run backward through the same modules, or the gradient reduce-scatters of the ranks would not
    line up; in one process the extra backward adds exact zeros.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        chunk_size: int,
        temperature: float,
        packed_row_tokens: int | None,
        value_head: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.value_head = value_head  # a submodule: FSDP2 shards it with the root's parameters
        self.chunk_size = chunk_size
        self.temperature = temperature
        self.packed_row_tokens = packed_row_tokens

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
    ) -> TokenLogProbs:
        last = int(attention_mask[0].sum()) - 1  # row 0's last real token
        probe = torch.is_grad_enabled() and last > 0 and not bool((loss_mask[:, 1:] > 0).any())
        if probe:
            loss_mask = torch.zeros_like(loss_mask)
            loss_mask[0, last] = 1
        out = compute_token_logprobs(
            self.model,
            input_ids,
            attention_mask,
            loss_mask,
            chunk_size=self.chunk_size,
            temperature=self.temperature,
            packed_row_tokens=self.packed_row_tokens,
            value_head=self.value_head,
        )
        if not probe:
            return out
        return TokenLogProbs(
            out.logprobs * 0.0, out.entropy * 0.0, None if out.values is None else out.values * 0.0
        )


def decoder_body(model: nn.Module) -> nn.Module:
    """The decoder body (no vocabulary projection) of a Hugging Face causal LM."""
    body = model.base_model
    if body is model:
        raise TypeError(
            f"{type(model).__name__} exposes no decoder body (base_model) separate from its LM head"
        )
    return body


def decoder_hidden(
    body: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, packed_row_tokens: int | None
) -> torch.Tensor:
    """Final hidden states [B, T, H] of decoder ``body`` on a right-padded batch, computed on packed rows of at
    most ``packed_row_tokens`` real tokens when given (the same states, no compute on padding), or in one row
    under flash-attn (``packing.rows_for``: what its kernels need to keep the samples apart)."""
    if packed_row_tokens is None:
        return body_hidden_states(body, input_ids, attention_mask)
    attention = getattr(getattr(body, "config", None), "_attn_implementation", "sdpa")
    row_tokens = rows_for(attention, packed_row_tokens, int(attention_mask.sum()))
    packing = pack(input_ids, attention_mask, row_tokens)
    return packing.unpack(body_hidden_states(body, packing.input_ids, None, packing.position_ids))


def body_hidden_states(
    body: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Final hidden states [B, T, H] of a Hugging Face decoder body.

    Packed rows pass ``attention_mask=None`` and restarting ``position_ids``: transformers masks attention
    at every restart (block-diagonal; see packing.py per implementation), so packed samples never see each
    other."""
    packed = {} if position_ids is None else {"position_ids": position_ids}  # padded: the model's own
    return body(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **packed
    ).last_hidden_state


def logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head: nn.Module,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    chunk_size: int,
    temperature: float = 1.0,
) -> TokenLogProbs:
    """Project ``hidden`` [B, T, H] to the vocabulary chunk by chunk and take the log-prob of each next token."""
    batch_size, seq_len = input_ids.shape
    trained = loss_mask[:, 1:] > 0  # [B, T-1]: positions t >= 1 whose token is trained
    hidden_n = hidden[:, :-1][trained]  # [N, H]: the logits at t - 1 predict token t
    targets_n = input_ids[:, 1:][trained]  # [N]
    pieces = [
        _chunk(lm_head, hidden_n[s : s + chunk_size], targets_n[s : s + chunk_size], temperature)
        for s in range(0, hidden_n.shape[0], chunk_size)
    ]
    logprobs_n = torch.cat([p[0] for p in pieces]) if pieces else hidden_n.new_zeros(0, dtype=torch.float32)
    entropy_n = torch.cat([p[1] for p in pieces]) if pieces else logprobs_n.detach()
    return TokenLogProbs(
        logprobs=_scatter_aligned(logprobs_n, trained, batch_size, seq_len),
        entropy=_scatter_aligned(entropy_n, trained, batch_size, seq_len),
    )


def _chunk(
    lm_head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [n], entropies [n]) of one chunk; checkpointed when gradients flow."""
    if torch.is_grad_enabled() and hidden.requires_grad:
        return checkpoint(_chunk_forward, lm_head, hidden, targets, temperature, use_reentrant=False)
    return _chunk_forward(lm_head, hidden, targets, temperature)


def _chunk_forward(
    lm_head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = float32_linear(hidden, lm_head) / temperature  # [n, V], never rounded to the compute dtype
    log_norm = logits.logsumexp(dim=-1)  # [n]
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - log_norm
    with torch.no_grad():
        entropy = log_norm - (logits.softmax(dim=-1) * logits).sum(dim=-1)
    return logprobs, entropy


def _scatter_aligned(
    values_n: torch.Tensor, trained: torch.Tensor, batch_size: int, seq_len: int
) -> torch.Tensor:
    """Place per-position values [N] back into [B, T] (column 0 and untrained positions stay 0)."""
    shifted = values_n.new_zeros(batch_size, seq_len - 1).masked_scatter(trained, values_n)
    return torch.cat([values_n.new_zeros(batch_size, 1), shifted], dim=1)


def autocast(device: torch.device, compute_dtype: str) -> contextlib.AbstractContextManager:
    """torch.autocast in ``compute_dtype`` on ``device``; a no-op for float32."""
    if compute_dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[compute_dtype])
