"""Admission of the next prompt: every producer draws a prompt and a buffer ticket for it the same way.

Key decision: the prompt is drawn before the ticket and given back when no ticket comes, so the prompt
source's record of unfinished prompts stays exact: a prompt drawn but never admitted (the buffer closed
first) stays outstanding and a resumed run re-issues it; one refused by ``try_admit`` is re-issued next.
"""

from __future__ import annotations

from asyncrl.buffer.records import Admission
from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.rollout.prompt_source import Prompt, PromptSource


async def admit(source: PromptSource, buffer: SampleBuffer, producer: str) -> tuple[Admission, Prompt]:
    """The next prompt and its admission ticket, waiting for buffer capacity (``BufferClosedError`` if the
    buffer closes first)."""
    prompt = source.next()
    return await buffer.acquire_admission(producer, key=prompt.key), prompt


def try_admit(source: PromptSource, buffer: SampleBuffer, producer: str) -> tuple[Admission, Prompt] | None:
    """The next prompt and its ticket if the buffer has capacity now, else None (the prompt goes back)."""
    prompt = source.next()
    admission = buffer.try_acquire_admission(producer, key=prompt.key)
    if admission is None:
        source.give_back(prompt)
        return None
    return admission, prompt


async def admit_batch(
    source: PromptSource, buffer: SampleBuffer, producer: str, limit: int
) -> list[tuple[Admission, Prompt]]:
    """One admission (waiting for capacity), then as many more as the buffer takes now, ``limit`` in all:
    the admissions of one lockstep round or batch."""
    admitted = [await admit(source, buffer, producer)]
    while len(admitted) < limit and (more := try_admit(source, buffer, producer)) is not None:
        admitted.append(more)
    return admitted
