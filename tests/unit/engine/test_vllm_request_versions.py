"""A request whose per-token weight versions vLLM cannot give fails by name, without vLLM: the real client and
the real ``worker_main.Worker`` over a pipe, vLLM's ``AsyncLLM`` replaced by a fake that finishes each request
with the completion a test scripts.

Why: the worker reads the versions once a request finishes; where that read failed outside the collector's
error handling, the collector task died silently and the caller waited until ``generate_timeout_s``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from vllm_pipe import PipedWorker

from asyncrl.engine.vllm.client import VLLMWorkerError
from asyncrl.types import Request, SamplingParams

TOKENS = [5, 6, 7]
DEADLINE_S = 20.0
"""How long a test waits for a generation before calling it a hang (a deadline, not a timing check)."""


def completion(weight_versions: object) -> SimpleNamespace:
    """vLLM's last ``CompletionOutput`` of a request; ``weight_versions`` ``...``: a vLLM without the field."""
    fields = {"token_ids": TOKENS, "logprobs": None, "finish_reason": "length"}
    if weight_versions is not ...:
        fields["weight_versions"] = weight_versions
    return SimpleNamespace(**fields)


def span(version: int, start: int, end: int) -> SimpleNamespace:
    return SimpleNamespace(version=version, start=start, end=end)


class Outputs:
    """vLLM's per-request output collector, holding one finished output."""

    def __init__(self, output: SimpleNamespace) -> None:
        self.output = output

    def get_nowait(self) -> SimpleNamespace:
        return self.output

    async def get(self) -> SimpleNamespace:
        return self.output

    def close(self) -> None:
        pass


class FakeVLLM:
    """``AsyncLLM`` as ``op_add`` / ``collect`` use it: each request finishes at once with the completion
    ``completions`` holds for its id."""

    errored = False

    def __init__(self, completions: dict[str, SimpleNamespace]) -> None:
        self.completions = completions

    async def add_request(self, request_id, prompt, params, lora_request=None) -> Outputs:
        return Outputs(SimpleNamespace(outputs=[self.completions[request_id]], finished=True))


def request(request_id: str) -> Request:
    return Request(request_id=request_id, prompt_token_ids=[1, 2], sampling=SamplingParams(max_new_tokens=3))


@pytest.mark.parametrize(
    ("versions", "reason"),
    [
        (..., "CompletionOutput has no weight_versions"),
        ([span(0, 0, 2)], "spans cover 2 of 3 tokens"),
        (None, "spans cover 0 of 3 tokens"),
    ],
    ids=["absent", "short", "none"],
)
def test_a_request_without_versions_for_every_token_fails_by_name_and_the_worker_serves_on(
    fake_vllm_modules, versions, reason
):
    piped = PipedWorker(
        FakeVLLM({"broken": completion(versions), "whole": completion([span(0, 0, 1), span(4, 1, 3)])})
    )
    worker, client = piped.worker, piped.client

    async def answered(request_id: str) -> asyncio.Future:
        generation = asyncio.ensure_future(client.generate(request(request_id)))
        await asyncio.wait({generation}, timeout=DEADLINE_S)
        assert generation.done(), f"request {request_id!r} got no answer within {DEADLINE_S} s: it hangs"
        return generation

    async def scenario():
        with pytest.raises(VLLMWorkerError) as failed:
            (await answered("broken")).result()
        return str(failed.value), (await answered("whole")).result()

    try:
        error, served = asyncio.run(scenario())
    finally:
        piped.close()
    assert "request broken" in error and "VersionSpanError" in error and reason in error
    assert list(served.token_ids) == TOKENS and list(served.versions) == [0, 4, 4]
    assert worker.running == {}  # the failed request left nothing behind
