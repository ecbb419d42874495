"""Checking incoming requests, so bad input is a ValueError naming the request and never reaches the model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from asyncrl.types import Request, SamplingParams

SAMPLING_PARAM_NAMES = tuple(f.name for f in fields(SamplingParams))


def sampling_params_from_dict(params: Mapping[str, Any], *, request_id: str) -> SamplingParams:
    """Build ``SamplingParams`` from a plain dict; an unknown key or bad value names the request."""
    unknown = sorted(set(params) - set(SAMPLING_PARAM_NAMES))
    if unknown:
        raise ValueError(
            f"request {request_id}: unknown sampling param(s) {unknown}; valid: {SAMPLING_PARAM_NAMES}"
        )
    values = dict(params)
    for name in ("stop_token_ids", "stop_strings"):
        if name in values:
            values[name] = tuple(values[name])
    try:
        return SamplingParams(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"request {request_id}: {exc}") from exc


def check_request(request: Request, *, max_model_len: int, vocab_size: int, has_tokenizer: bool) -> None:
    """Raise ``ValueError`` naming the request if the engine cannot serve it as given."""
    rid = request.request_id
    num_context = len(request.prompt_token_ids) + len(request.prefix_token_ids)
    if not request.prompt_token_ids:
        raise ValueError(f"request {rid}: empty prompt")
    if num_context >= max_model_len:
        raise ValueError(
            f"request {rid}: prompt + prefix is {num_context} tokens, the context holds {max_model_len} "
            "(room for at least one new token is needed)"
        )
    if not all(0 <= t < vocab_size for t in (*request.prompt_token_ids, *request.prefix_token_ids)):
        raise ValueError(f"request {rid}: token ids must be in [0, {vocab_size})")
    if not len(request.prefix_token_ids) == len(request.prefix_logprobs) == len(request.prefix_versions):
        raise ValueError(
            f"request {rid}: prefix_token_ids, prefix_logprobs and prefix_versions differ in length"
        )
    if len(request.prefix_token_ids) >= request.sampling.max_new_tokens:
        raise ValueError(
            f"request {rid}: prefix already holds max_new_tokens={request.sampling.max_new_tokens}"
        )
    if request.sampling.stop_strings and not has_tokenizer:
        raise ValueError(f"request {rid}: stop_strings need an engine built with a tokenizer")
