"""An aborted continuation on vLLM returns its whole generation, the prefix it was sent with included, without
vLLM: the real client and the real ``worker_main.Worker`` over a pipe, vLLM's ``AsyncLLM`` replaced by a fake
whose requests run until aborted.

Why: the worker knows only the tokens its engine generated (prompt and prefix reach it as one context). The
client's ``abort`` once returned them as they came, without the prefix and with no prompt ids, and migration
by recompute (``multi_version`` on vLLM) builds a moved request's continuation from that abort: a request
moved twice lost everything generated before its first move, silently.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from vllm_pipe import PipedWorker

from asyncrl.types import FinishReason, Request, SamplingParams

DEADLINE_S = 20.0
"""How long a test waits for an answer before calling it a hang (a deadline, not a timing check)."""
PREFIX = [3, 4]
PREFIX_LOGPROBS = [-0.3, -0.4]
PREFIX_VERSIONS = [0, 1]
NEW = [7, 8]
"""The tokens the fake engine generates: one before the abort reaches it, one as the abort ends the request."""
NEW_VERSION = 2


def output(tokens: list[int], finished: bool) -> SimpleNamespace:
    """vLLM's delta ``RequestOutput``; the last one carries the weight-version span of every token."""
    completion = SimpleNamespace(
        token_ids=tokens,
        logprobs=[{t: -t / 10} for t in tokens],
        finish_reason="abort" if finished else None,
    )
    if finished:
        completion.weight_versions = [SimpleNamespace(version=NEW_VERSION, start=0, end=len(NEW))]
    return SimpleNamespace(outputs=[completion], finished=finished)


class Outputs:
    """vLLM's per-request output collector: what the engine queued for the request, in order."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def get_nowait(self) -> SimpleNamespace | None:
        return None if self.queue.empty() else self.queue.get_nowait()

    async def get(self) -> SimpleNamespace:
        return await self.queue.get()

    def close(self) -> None:
        pass


class RunUntilAborted:
    """``AsyncLLM`` as ``op_add`` / ``collect`` / ``op_abort`` use it: a request yields its first token at once
    and its second, finished as aborted, when ``abort`` reaches it."""

    errored = False

    def __init__(self) -> None:
        self.outputs: dict[str, Outputs] = {}
        self.prompts: dict[str, list[int]] = {}

    async def add_request(self, request_id, prompt, params, lora_request=None) -> Outputs:
        self.prompts[request_id] = prompt["prompt_token_ids"]
        self.outputs[request_id] = outputs = Outputs()
        outputs.queue.put_nowait(output(NEW[:1], finished=False))
        return outputs

    async def abort(self, request_id: str) -> None:
        self.outputs[request_id].queue.put_nowait(output(NEW[1:], finished=True))


def continued(request_id: str) -> Request:
    """A request continued after a prefix another engine generated (versions 0 and 1)."""
    return Request(
        request_id=request_id,
        prompt_token_ids=[1, 2],
        sampling=SamplingParams(max_new_tokens=10),
        prefix_token_ids=PREFIX,
        prefix_logprobs=PREFIX_LOGPROBS,
        prefix_versions=PREFIX_VERSIONS,
    )


def test_an_aborted_continuation_returns_its_prefix_then_the_new_tokens(fake_vllm_modules):
    piped = PipedWorker(fake := RunUntilAborted())
    client = piped.client

    async def scenario():
        generating = asyncio.ensure_future(client.generate(continued("moved")))
        await asyncio.sleep(0)  # one turn of the loop: generate sends its add and waits
        assert "moved" in client._generations, "generate has not sent its request"
        # the worker runs commands in order: the request runs there before the abort arrives
        aborted = await asyncio.wait_for(client.abort("moved"), DEADLINE_S)
        return aborted, await asyncio.wait_for(generating, DEADLINE_S)

    try:
        aborted, finished = asyncio.run(scenario())
    finally:
        piped.close()
    assert fake.prompts["moved"] == [1, 2, *PREFIX], "the engine continues after prompt and prefix"
    assert aborted is not None and aborted.finish_reason is FinishReason.ABORT
    assert list(aborted.prompt_token_ids) == [1, 2]
    assert list(aborted.token_ids) == PREFIX + NEW
    assert list(aborted.logprobs) == pytest.approx(PREFIX_LOGPROBS + [-t / 10 for t in NEW])
    assert list(aborted.versions) == PREFIX_VERSIONS + [NEW_VERSION] * len(NEW)
    assert aborted == finished, (
        "abort returns what the aborted generate returns (the built-in engine's contract)"
    )
