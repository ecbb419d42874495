"""Under FSDP2 mixed precision (``trainer.mixed_precision: bf16``: bf16 unsharded parameters, tied head) the
log-probs are float32 projections of the bf16 hidden states and head: two gloo ranks' log-probs equal a float64
reference from the same bf16 model's hidden states, where bf16-rounded logits missed by up to 0.03 at this model's
logit scale; the tied head's gradient reaches the shards."""

from __future__ import annotations

import torch
from trainer_fixtures import tiny_qwen2

from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.logprobs import TokenLogProbModule, decoder_body, decoder_hidden

INPUT_IDS = torch.tensor([[5, 17, 42, 8, 250, 3, 9, 120, 77, 1], [7, 7, 100, 2, 64, 31, 0, 0, 0, 0]])
ATTENTION_MASK = (torch.arange(10) < torch.tensor([[10], [6]])).long()
LOSS_MASK = torch.tensor(
    [[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 0, 0, 0, 0]], dtype=torch.float32
)
LOGIT_SCALE = 8.0
"""The tiny model's head times this: logits with a std near 1.5, so bf16 rounding of them is visible."""


def _model():
    model = tiny_qwen2()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(LOGIT_SCALE)  # tied: the embeddings scale too
    return model


def _sharded_logprobs() -> tuple[torch.Tensor, float] | None:
    """Rank-side: the sharded bf16 forward's log-probs and the norm of the tied head's gathered gradient."""
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    parallel = FullyShardedParallel("cpu", mixed_precision=True)
    module = TokenLogProbModule(_model(), chunk_size=4, temperature=1.0, packed_row_tokens=None)
    parallel.shard(module)
    out = module(INPUT_IDS, ATTENTION_MASK, LOSS_MASK)
    out.logprobs.sum().backward()
    grad = module.model.get_output_embeddings().weight.grad.full_tensor()  # a collective: every rank
    return (out.logprobs.detach(), float(grad.norm())) if parallel.rank == 0 else None


def _reference() -> torch.Tensor:
    """Float64 log-probs from the bf16 model's hidden states and bf16 head: the parameters cast as FSDP2's
    ``param_dtype`` casts them (buffers such as the rotary frequencies stay float32)."""
    model = _model()
    for param in model.parameters():
        param.data = param.data.bfloat16()
    with torch.no_grad():
        hidden = decoder_hidden(decoder_body(model), INPUT_IDS, ATTENTION_MASK, None).double()
        log_probs = (hidden[:, :-1] @ model.get_output_embeddings().weight.double().T).log_softmax(-1)
    taken = log_probs.gather(-1, INPUT_IDS[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(2, 1, dtype=torch.float64), taken], dim=1) * LOSS_MASK


def test_fsdp2_bf16_logprobs_equal_a_float64_reference_of_the_bf16_model() -> None:
    logprobs, grad_norm = run_ranks(_sharded_logprobs, 2)[0]
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs.double(), _reference(), atol=1e-5, rtol=0)
    assert grad_norm > 0 and torch.isfinite(torch.tensor(grad_norm))
