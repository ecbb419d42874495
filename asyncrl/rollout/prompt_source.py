"""A resumable, seeded stream of training prompts.

Key decision: the order is a pure function of (seed, epoch), so the stream's whole state is a cursor plus
the prompts that were handed out but never finished; a resumed run re-issues those first and then continues
at the cursor, so no consumed prompt is trained twice and none is skipped (DESIGN.md §5, invariant 5).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.data.base import TaskSample


@dataclass(frozen=True)
class Prompt:
    """One admission of a task sample; ``key`` is unique across epochs (the same sample recurs per epoch)."""

    key: str
    sample: TaskSample


class PromptSource:
    """Hands out prompts in a per-epoch shuffled order and remembers which ones are still unfinished."""

    def __init__(self, samples: Sequence[TaskSample], seed: int) -> None:
        if not samples:
            raise ValueError("the prompt source needs at least one training sample")
        self._samples = list(samples)
        self._by_uid = {s.uid: s for s in self._samples}
        self._seed = seed
        self._order_epoch = -1
        self._order_cache: list[TaskSample] = []
        self._cursor = 0
        self._redo: list[str] = []
        self._outstanding: dict[str, Prompt] = {}

    def next(self) -> Prompt:
        """The next prompt: an unfinished one from before a resume if any, else the next in order."""
        prompt = self._prompt_for(self._redo.pop(0)) if self._redo else self._advance()
        self._outstanding[prompt.key] = prompt
        return prompt

    def give_back(self, prompt: Prompt) -> None:
        """Return a prompt that was drawn but never admitted: it is the next one handed out."""
        del self._outstanding[prompt.key]
        self._redo.insert(0, prompt.key)

    def finish(self, key: str) -> None:
        """Mark a prompt as ended (trained or dropped with a reason): it is never handed out again."""
        del self._outstanding[key]

    def interrupt(self, key: str) -> None:
        """A prompt whose work was cut off by shutdown, not ended: it stays unfinished, so the state saved
        from now on (and a run resumed from it) hands it out again."""
        prompt = self._outstanding.pop(key)
        self._redo.append(prompt.key)

    def claim(self, key: str) -> None:
        """Mark an unfinished prompt of a resumed run as out again without handing it out: its finished group
        was restored from the checkpoint, so it must not be regenerated, and ``finish`` will end it."""
        if key not in self._redo:
            raise ValueError(f"cannot restore the group of prompt {key!r}: the checkpoint has it as finished")
        self._redo.remove(key)
        self._outstanding[key] = self._prompt_for(key)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self._seed, "cursor": self._cursor, "redo": self._redo + list(self._outstanding)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["seed"] != self._seed:
            raise ValueError(
                f"resuming with seed {self._seed}, but the checkpoint's data order used {state['seed']}"
            )
        self._cursor = int(state["cursor"])
        self._redo = list(state["redo"])
        self._outstanding = {}

    def _advance(self) -> Prompt:
        epoch, index = divmod(self._cursor, len(self._samples))
        self._cursor += 1
        sample = self._order(epoch)[index]
        return Prompt(key=f"{sample.uid}@{epoch}", sample=sample)

    def _order(self, epoch: int) -> list[TaskSample]:
        if self._order_epoch != epoch:
            self._order_cache = random.Random(f"{self._seed}:{epoch}").sample(
                self._samples, len(self._samples)
            )
            self._order_epoch = epoch
        return self._order_cache

    def _prompt_for(self, key: str) -> Prompt:
        uid = key.rpartition("@")[0]
        if uid not in self._by_uid:
            raise ValueError(f"cannot resume prompt {key!r}: no training sample has uid {uid!r}")
        return Prompt(key=key, sample=self._by_uid[uid])
