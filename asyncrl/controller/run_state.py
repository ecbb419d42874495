"""What a run must carry across a restart besides the trainer, and the ledger that proves nothing was lost.

Key decision: a checkpoint is taken *before* the buffer is closed (periodically in ``on_step``, and at the end
or on SIGTERM before anything is torn down), and it holds three things beside the trainer's state:

- the prompt stream's position, unfinished prompts included (``PromptSource.state_dict``): in-flight work is
  regenerated on resume, in the same order;
- the finished-but-untrained groups of the buffer (``SampleBuffer.snapshot``): restored on resume, re-checked
  against α (the stale ones are counted and regenerated, never trained);
- the set of prompts trained so far: a resumed stream that would hand one out again is an error.

``ledger.jsonl`` gets one line per trained trajectory (prompt, sample index, step, first and last policy
version of its tokens) and one per dropped group (prompt, kind, reason), flushed every step. On resume the
lines after the checkpoint's step are cut (they belong to steps that are trained again), so the ledger of an
interrupted run reads exactly like an uninterrupted one's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from asyncrl.buffer.persist import groups_from_data, groups_to_data
from asyncrl.buffer.records import DroppedGroup
from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.types import Group

LEDGER_FILE = "ledger.jsonl"


class RunState:
    """The prompt stream, the consumed prompts and the ledger of one run directory."""

    def __init__(self, source: PromptSource, out: Path, *, resumed_step: int | None = None) -> None:
        """``resumed_step``: the step of the checkpoint a resumed run starts from; later ledger and metrics
        lines are cut. None starts a fresh ledger."""
        self.source = source
        self.consumed: set[str] = set()
        self.restored: dict[str, int] = {}
        self._pending_groups: list[tuple[int, Group]] = []
        if resumed_step is not None:
            for name in (LEDGER_FILE, "metrics.jsonl"):
                truncate_after_step(out / name, resumed_step)
        self._ledger = (out / LEDGER_FILE).open("a" if resumed_step is not None else "w", encoding="utf-8")

    def checkpoint_extra(self, buffer: SampleBuffer | None) -> dict[str, Any]:
        """The JSON a checkpoint keeps beside the trainer (see the module docstring)."""
        return {
            "prompt_source": self.source.state_dict(),
            "buffered_groups": groups_to_data(buffer.snapshot()) if buffer is not None else [],
            "consumed_prompts": sorted(self.consumed),
        }

    def load(self, extra: dict[str, Any]) -> None:
        """Take the stream position and consumed prompts of a checkpoint (before any prompt is handed out)."""
        self.source.load_state_dict(extra["prompt_source"])
        self.consumed = set(extra.get("consumed_prompts", []))
        again = self.consumed.intersection(extra["prompt_source"].get("redo", []))
        if again:
            raise ValueError(
                f"checkpoint is inconsistent: prompts {sorted(again)[:5]} are trained and unfinished"
            )
        self._pending_groups = groups_from_data(extra.get("buffered_groups", []))

    def restore_buffer(self, buffer: SampleBuffer) -> dict[str, int]:
        """Put the checkpoint's finished groups back; the fresh ones are claimed from the stream so they are
        not regenerated, the stale ones stay unfinished there and are generated again."""
        groups = self._pending_groups
        stale = {id(group) for group in buffer.restore(groups)}
        for _, group in groups:
            if id(group) not in stale:
                self.source.claim(group.prompt_uid)
        self.restored = {"restored_groups": len(groups) - len(stale), "stale_regenerated": len(stale)}
        self._pending_groups = []
        return self.restored

    def record_step(self, step: int, groups: Iterable[Group], dropped: Iterable[DroppedGroup]) -> None:
        """Ledger lines for the step's trained trajectories and the groups dropped since the last step."""
        lines = []
        for group in groups:
            self.consumed.add(group.prompt_uid)
            for t in group.trajectories:
                first, last = t.version_span
                lines.append(
                    {
                        "step": step,
                        "event": "trained",
                        "prompt": group.prompt_uid,
                        "sample": t.sample_index,
                        "first_version": first,
                        "last_version": last,
                    }
                )
        for drop in dropped:
            lines.append(
                {
                    "step": step,
                    "event": "dropped",
                    "prompt": drop.admission.key,
                    "kind": drop.kind.value,
                    "reason": drop.reason,
                }
            )
        self._ledger.write("".join(json.dumps(line) + "\n" for line in lines))
        self._ledger.flush()

    def close(self) -> None:
        self._ledger.close()


def truncate_after_step(path: Path, step: int) -> int:
    """Cut the lines of a per-step JSONL file whose ``step`` is after ``step`` (and a torn last line);
    returns how many were cut. The file is rewritten atomically."""
    if not path.is_file():
        return 0
    kept, cut = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            keep = json.loads(line).get("step", 0) <= step
        except json.JSONDecodeError:  # a line torn by a crash mid-write
            keep = False
        if keep:
            kept.append(line)
        else:
            cut += 1
    if cut:
        staging = path.with_name(f".{path.name}.tmp")
        staging.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        staging.replace(path)
    return cut
