"""What a run must carry across a restart besides the trainer, and the ledger that proves nothing was lost.

Key decision: a checkpoint is taken *before* the buffer is closed (periodically in ``on_step``, and at the end
or on SIGTERM before anything is torn down), and it holds three things beside the trainer's state:

- the prompt stream's position, unfinished prompts included (``PromptSource.state_dict``): in-flight work is
  regenerated on resume, in the same order;
- the finished-but-untrained groups of the buffer (``SampleBuffer.snapshot``): restored on resume, re-checked
  against α (the stale ones are counted and regenerated, never trained);
- the set of prompts trained so far: a resumed stream that would hand one out again is an error.

``ledger.jsonl`` gets one line per trained trajectory (prompt, sample index, step, first and last policy
version of its tokens) and one per dropped group (prompt, kind, reason), flushed every step. When a run ends
(finished or stopped) it also gets the drops since the last step, and after the final checkpoint one
``unfinished`` line per prompt drawn and not ended (``resume``: ``restore`` for a finished group the checkpoint
keeps, ``regenerate`` for one still generating or waiting for admission). So every prompt a run drew has
exactly one fate in its ledger: trained, dropped or unfinished.

Each checkpoint records how many ledger lines it accounts for; on resume the lines after those are cut (steps
trained again, drops the checkpoint does not know of, the unfinished lines), so the ledger of an interrupted
run reads exactly like an uninterrupted one's. Counting lines rather than steps matters at the end of a run,
where drops after the last step share its step number with the checkpoint taken in that step.
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
LEDGER_LINES = "ledger_lines"
UNFINISHED = "unfinished"
PENDING_EVALS = "pending_evals"


class RunState:
    """The prompt stream, the consumed prompts and the ledger of one run directory."""

    def __init__(
        self,
        source: PromptSource,
        out: Path,
        *,
        resumed_step: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """``resumed_step`` and ``extra``: the step and the extra state of the checkpoint a resumed run starts
        from (see ``_load``); metrics lines after the step and ledger lines after the checkpoint's are cut.
        None starts a fresh ledger."""
        self.source = source
        self.consumed: set[str] = set()
        self.restored: dict[str, int] = {}
        self._pending_groups: list[tuple[int, Group]] = []
        self._num_lines = 0
        self.pending_evals: list[int] = list((extra or {}).get(PENDING_EVALS, []))
        """Steps whose evaluation during training was still running at the checkpoint resumed from."""
        if resumed_step is not None:
            truncate_after_step(out / "metrics.jsonl", resumed_step)
            counted = (extra or {}).get(LEDGER_LINES)
            self._num_lines = _truncate_ledger(out / LEDGER_FILE, resumed_step, counted)
        if extra is not None:
            self._load(extra)
        self._ledger = (out / LEDGER_FILE).open("a" if resumed_step is not None else "w", encoding="utf-8")

    def checkpoint_extra(
        self, buffer: SampleBuffer | None, pending_evals: list[int] | None = None
    ) -> dict[str, Any]:
        """The JSON a checkpoint keeps beside the trainer (see the module docstring); ``pending_evals``: the
        steps whose evaluation during training is still running. Plain data sharing nothing with the live
        stream, buffer or ledger: the trainer's save runs off the event loop (``app.train._save``) while the
        rollout goes on changing those."""
        return {
            "prompt_source": self.source.state_dict(),
            "buffered_groups": groups_to_data(buffer.snapshot()) if buffer is not None else [],
            "consumed_prompts": sorted(self.consumed),
            LEDGER_LINES: self._num_lines,
            PENDING_EVALS: list(pending_evals or []),
        }

    def _load(self, extra: dict[str, Any]) -> None:
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
        buffer.take_dropped()  # the stale ones are regenerated, not dropped: no ledger line (counted above)
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
        self._write(lines)

    def record_unfinished(self, step: int, buffer: SampleBuffer) -> None:
        """At the end of a run, before the buffer closes: a line per prompt drawn and not ended.

        What the producers release once the buffer closes is not written: these lines account for those
        prompts, as the final checkpoint does (it keeps them as buffered groups or prompts to regenerate).
        """
        buffered = {group.prompt_uid for _, group in buffer.snapshot()}
        self._write(
            [
                {
                    "step": step,
                    "event": UNFINISHED,
                    "prompt": key,
                    "resume": "restore" if key in buffered else "regenerate",
                }
                for key in self.source.state_dict()["redo"]
            ]
        )

    def close(self) -> None:
        self._ledger.close()

    def _write(self, lines: list[dict[str, Any]]) -> None:
        self._ledger.write("".join(json.dumps(line) + "\n" for line in lines))
        self._ledger.flush()
        self._num_lines += len(lines)


def _truncate_ledger(path: Path, step: int, num_lines: int | None) -> int:
    """Keep the ledger's first ``num_lines`` lines (a checkpoint without the count: those up to ``step``);
    returns how many are kept. A ledger shorter than the count belongs to another run directory (a checkpoint
    resumed into a new ``output_dir``): it is kept whole, and counted from there on."""
    if num_lines is None:
        truncate_after_step(path, step)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.is_file() else []
    if num_lines is not None and len(lines) > num_lines:
        staging = path.with_name(f".{path.name}.tmp")
        staging.write_text("".join(lines[:num_lines]), encoding="utf-8")
        staging.replace(path)
        return num_lines
    return len(lines)


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
