"""Checking incoming requests, so bad input is a ValueError naming the request and never reaches the model."""

from __future__ import annotations

from dataclasses import fields

from asyncrl.types import InvalidRequest, Request, SamplingParams, sampling_params_from_dict

SAMPLING_PARAM_NAMES = tuple(f.name for f in fields(SamplingParams))
__all__ = ["SAMPLING_PARAM_NAMES", "check_request", "sampling_params_from_dict"]


def check_request(request: Request, *, max_model_len: int, vocab_size: int, has_tokenizer: bool) -> None:
    """Raise ``InvalidRequest`` (a ValueError) naming the request if this engine cannot serve it as given;
    run ``types.checked_request`` first (field types)."""
    rid = request.request_id
    num_context = len(request.prompt_token_ids) + len(request.prefix_token_ids)
    if not request.prompt_token_ids:
        raise InvalidRequest(f"request {rid}: empty prompt")
    if num_context >= max_model_len:
        raise InvalidRequest(
            f"request {rid}: prompt + prefix is {num_context} tokens, the context holds {max_model_len} "
            "(room for at least one new token is needed)"
        )
    if not all(0 <= t < vocab_size for t in (*request.prompt_token_ids, *request.prefix_token_ids)):
        raise InvalidRequest(f"request {rid}: token ids must be in [0, {vocab_size})")
    if not len(request.prefix_token_ids) == len(request.prefix_logprobs) == len(request.prefix_versions):
        raise InvalidRequest(
            f"request {rid}: prefix_token_ids, prefix_logprobs and prefix_versions differ in length"
        )
    if len(request.prefix_token_ids) >= request.sampling.max_new_tokens:
        raise InvalidRequest(
            f"request {rid}: prefix already holds max_new_tokens={request.sampling.max_new_tokens}"
        )
    if request.sampling.stop_strings and not has_tokenizer:
        raise InvalidRequest(f"request {rid}: stop_strings need an engine built with a tokenizer")
