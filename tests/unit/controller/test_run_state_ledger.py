"""On resume the ledger keeps exactly the lines its checkpoint counted (``RunState``'s ``ledger_lines``)."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.controller.run_state import LEDGER_FILE, RunState
from asyncrl.data.base import TaskSample
from asyncrl.rollout.prompt_source import PromptSource


def source() -> PromptSource:
    return PromptSource([TaskSample(uid=f"p{i}", prompt=f"q{i}", answer="0") for i in range(4)], seed=0)


def write_ledger(out: Path, lines: list[dict], torn: str = "") -> None:
    (out / LEDGER_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines) + torn)


def read_ledger(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / LEDGER_FILE).read_text().splitlines()]


LINES = [
    {"step": 1, "event": "dropped", "prompt": "a"},
    {"step": 2, "event": "dropped", "prompt": "b"},
    {"step": 2, "event": "dropped", "prompt": "c"},  # after the last step, before the final checkpoint
    {"step": 2, "event": "unfinished", "prompt": "d"},  # after the final checkpoint
]


def resume(out: Path, step: int, extra: dict) -> RunState:
    state_extra = {"prompt_source": source().state_dict(), **extra}
    return RunState(source(), out, resumed_step=step, extra=state_extra)


def test_resume_keeps_the_counted_lines_and_cuts_a_torn_one(tmp_path):
    write_ledger(tmp_path, LINES, torn='{"step": 3, "ev')
    state = resume(tmp_path, 2, {"ledger_lines": 3})
    state.record_step(3, [], [])
    state.close()
    assert read_ledger(tmp_path) == LINES[:3]
    assert state.checkpoint_extra(None)["ledger_lines"] == 3


def test_a_checkpoint_without_a_count_cuts_by_step(tmp_path):
    write_ledger(tmp_path, LINES + [{"step": 3, "event": "dropped", "prompt": "e"}])
    resume(tmp_path, 2, {}).close()
    assert read_ledger(tmp_path) == LINES


def test_a_ledger_shorter_than_the_count_is_another_directorys_and_kept_whole(tmp_path):
    write_ledger(tmp_path, LINES[:1])
    state = resume(tmp_path, 2, {"ledger_lines": 3})
    state.close()
    assert read_ledger(tmp_path) == LINES[:1]
    assert state.checkpoint_extra(None)["ledger_lines"] == 1
