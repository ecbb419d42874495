"""Continuing a request that an engine aborted without being asked (pure functions over the records).

Contract with the engine (asyncrl/engine/sequence.py): a request carrying ``prefix_token_ids`` /
``prefix_logprobs`` / ``prefix_versions`` resumes after that prefix; ``sampling.max_new_tokens`` still counts
the prefix, and the returned ``Generation`` starts with the prefix. So the engine does the stitching and the
proxy checks it: the caller receives one ``Generation`` whose tokens, log-probs and per-token versions are
exactly those of the uninterrupted pieces, in order.
"""

from __future__ import annotations

import dataclasses

from asyncrl.rle import kept, starts_with
from asyncrl.types import FinishReason, Generation, Request


def continuation_request(request: Request, partial: Generation | None) -> Request:
    """The request to send next: the caller's own, or one that resumes after ``partial``'s output."""
    if partial is None:
        return request
    return dataclasses.replace(
        request,
        prefix_token_ids=kept(partial.token_ids),
        prefix_logprobs=kept(partial.logprobs),
        prefix_versions=kept(partial.versions),
    )


def check_continued(generation: Generation, request: Request) -> None:
    """Raise ``ValueError`` naming the request unless ``generation`` starts with the request's prefix."""
    num_prefix = len(request.prefix_token_ids)
    same = num_prefix == 0 or (
        starts_with(generation.token_ids, request.prefix_token_ids)
        and starts_with(generation.logprobs, request.prefix_logprobs)
        and starts_with(generation.versions, request.prefix_versions)
    )
    lengths_agree = len(generation.token_ids) == len(generation.logprobs) == len(generation.versions)
    if not (same and lengths_agree):
        raise ValueError(
            f"request {request.request_id}: the engine's generation does not start with the {num_prefix}-token "
            "prefix it was given, or its tokens, log-probs and versions differ in length"
        )


def needs_continuation(generation: Generation, request: Request) -> bool:
    """An abort the caller did not ask for, with room left for more tokens, is continued."""
    return (
        generation.finish_reason is FinishReason.ABORT
        and len(generation.token_ids) < request.sampling.max_new_tokens
    )


def empty_abort(request: Request) -> Generation:
    """The generation of a request aborted before any engine produced a token for it."""
    return Generation(
        request_id=request.request_id,
        prompt_token_ids=kept(request.prompt_token_ids),
        token_ids=kept(request.prefix_token_ids),
        logprobs=kept(request.prefix_logprobs),
        versions=kept(request.prefix_versions),
        finish_reason=FinishReason.ABORT,
    )
