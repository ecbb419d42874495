"""Migration by recompute exports a request only as the whole output it has so far.

Why: an export builds the moved request's continuation from the engine's abort. An engine whose abort returned
only the tokens generated on it (the vLLM client once did) made a request moved a second time lose everything
generated before its first move, and train on the truncated trajectory, silently.
"""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.proxy.recompute_migration import PrefixState, RecomputeMigration
from asyncrl.types import FinishReason, Generation, Request

NEW = [7, 8]
"""What the stub engine generates for a request before the abort."""


class AbortOnly:
    """An engine whose requests run until aborted; ``keeps_prefix`` False: its abort drops the prefix."""

    def __init__(self, keeps_prefix: bool) -> None:
        self.keeps_prefix = keeps_prefix
        self.running: dict[str, tuple[Request, asyncio.Future]] = {}

    async def generate(self, request: Request) -> Generation:
        future = asyncio.get_running_loop().create_future()
        self.running[request.request_id] = (request, future)
        return await future

    async def abort(self, request_id: str) -> Generation | None:
        request, future = self.running.pop(request_id)
        prefix = self.keeps_prefix
        generation = Generation(
            request_id=request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            token_ids=(list(request.prefix_token_ids) if prefix else []) + NEW,
            logprobs=(list(request.prefix_logprobs) if prefix else []) + [-1.0] * len(NEW),
            versions=(list(request.prefix_versions) if prefix else []) + [3] * len(NEW),
            finish_reason=FinishReason.ABORT,
        )
        future.set_result(generation)
        return generation


def moved_once() -> Request:
    """A request already moved once: the tokens generated before the move are its prefix."""
    return Request(
        request_id="moved",
        prompt_token_ids=[1, 2],
        prefix_token_ids=[4, 5],
        prefix_logprobs=[-0.4, -0.5],
        prefix_versions=[2, 2],
    )


async def export_second_time(engine: AbortOnly) -> PrefixState | None:
    migration = RecomputeMigration(engine)
    generating = asyncio.ensure_future(migration.generate(moved_once()))
    await asyncio.sleep(0)  # one turn of the loop: the request runs on the engine
    try:
        return await migration.export_request("moved")
    finally:
        await generating


def test_a_request_moved_a_second_time_carries_everything_generated_before():
    state = asyncio.run(export_second_time(AbortOnly(keeps_prefix=True)))
    assert state.request.prompt_token_ids == [1, 2]
    assert state.request.prefix_token_ids == [4, 5, *NEW]
    assert state.request.prefix_logprobs == [-0.4, -0.5, -1.0, -1.0]
    assert state.request.prefix_versions == [2, 2, 3, 3]


def test_an_abort_that_drops_the_prefix_fails_the_export_by_name():
    with pytest.raises(ValueError, match="request moved: .* 2-token prefix"):
        asyncio.run(export_second_time(AbortOnly(keeps_prefix=False)))
