"""Resume in process: a run stopped and resumed trains what an uninterrupted run trains, and keeps the
finished-but-untrained groups of its buffer instead of regenerating (or losing) them."""

from __future__ import annotations

import json

import pytest
from short_runs import ledger_lines, train, trained

from asyncrl.metrics.tracker import read_metrics
from asyncrl.modes import MODES, async_ratio_for


def test_a_resumed_sync_run_trains_the_same_batches_as_an_uninterrupted_one(tmp_path):
    sync = ("controller.mode=sync", "buffer.async_ratio=0")
    train(tmp_path / "whole", 4, *sync)
    train(tmp_path / "split", 2, *sync)
    train(tmp_path / "split", 4, *sync, resume=True)
    assert trained(tmp_path / "split") == trained(tmp_path / "whole")
    assert [r["step"] for r in read_metrics(tmp_path / "split" / "metrics.jsonl")] == [1, 2, 3, 4]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_resumes_and_its_engines_serve_the_resumed_weights(tmp_path, mode):
    """A resume hands the trainer's weights to engines that start from the base model, through the update
    protocol of the mode's policy (``in_flight`` refused an update without ``suspend``: every resumed
    partial_rollout run died at once). Every group generated after the resume starts at the resumed version."""
    out = tmp_path / "run"
    overrides = (
        f"controller.mode={mode}",
        f"buffer.async_ratio={async_ratio_for(mode, 1.0)}",
        "rollout.max_new_tokens=4",
        "rollout.max_additional_running_prompts=0",
    )
    train(out, 1, *overrides)
    extra = json.loads((out / "checkpoints" / "step_00000001" / "extra.json").read_text())
    restored = {entry["group"]["prompt_uid"] for entry in extra["buffered_groups"]}
    train(out, 3, *overrides, resume=True)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    lines = ledger_lines(out)
    fresh = [x for x in lines if x["event"] == "trained" and x["step"] > 1 and x["prompt"] not in restored]
    assert fresh, "nothing generated after the resume was trained: no test"
    assert min(x["first_version"] for x in fresh) == 1, "an engine served the base model after the resume"


def test_an_async_checkpoint_keeps_its_finished_groups_and_the_resumed_run_trains_them(tmp_path):
    out = tmp_path / "run"
    overrides = ("controller.mode=async", "buffer.async_ratio=2", "rollout.max_new_tokens=4")
    train(out, 4, *overrides)
    extra = json.loads((out / "checkpoints" / "step_00000004" / "extra.json").read_text())
    saved = [entry["group"]["prompt_uid"] for entry in extra["buffered_groups"]]
    assert saved, "the final checkpoint holds no finished groups: nothing to test"
    train(out, 8, *overrides, resume=True)
    steps = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert steps[4]["resume/restored_groups"] >= 1
    assert steps[4]["resume/restored_groups"] + steps[4]["resume/stale_regenerated"] == len(saved)
    prompts = [prompt for _, prompt, sample in trained(out) if sample == 0]
    assert len(prompts) == len(set(prompts)) == 16
    restored = {prompt for step, prompt, _ in trained(out) if step > 4}
    assert set(saved) & restored, "no saved group was trained after the resume"


def fates(lines: list[dict]) -> list[str]:
    """Each ledger line's prompt, once per group: trained (sample 0), dropped or unfinished."""
    return [x["prompt"] for x in lines if x["event"] != "trained" or x["sample"] == 0]


def test_every_prompt_drawn_has_one_fate_in_the_ledger_across_a_resume(tmp_path):
    """Dynamic sampling (the default example's filter and redundant prompts) drops groups all along and ends
    with some in flight and some buffered: each prompt drawn is trained, dropped or unfinished, once; the
    unfinished ones are what the final checkpoint keeps or regenerates, and a resumed run replaces them."""
    out = tmp_path / "run"
    overrides = (
        "controller.mode=async",
        "buffer.async_ratio=2",
        "rollout.filter=zero_variance",
        "rollout.max_additional_running_prompts=4",
    )
    train(out, 4, *overrides)
    first = ledger_lines(out)
    unfinished = [x for x in first if x["event"] == "unfinished"]
    assert unfinished and any(x["event"] == "dropped" for x in first), "nothing in flight or dropped: no test"
    assert len(fates(first)) == len(set(fates(first)))
    extra = json.loads((out / "checkpoints" / "step_00000004" / "extra.json").read_text())
    assert extra["ledger_lines"] == len(first) - len(unfinished)  # the unfinished lines come after it
    restore = {x["prompt"] for x in unfinished if x["resume"] == "restore"}
    assert restore == {entry["group"]["prompt_uid"] for entry in extra["buffered_groups"]}
    assert {x["prompt"] for x in unfinished} == set(extra["prompt_source"]["redo"])

    train(out, 8, *overrides, resume=True)
    whole = ledger_lines(out)
    assert whole[: extra["ledger_lines"]] == first[: extra["ledger_lines"]]
    assert len(fates(whole)) == len(set(fates(whole))), "a prompt has two fates"
    assert {x["prompt"] for x in unfinished} <= set(fates(whole[extra["ledger_lines"] :]))
