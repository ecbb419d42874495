"""Datasets by hub name (``task.dataset``) read offline from a hub-layout cache the test writes, with their config,
splits and revision; the GSM8K and MATH prompt formats feed the ``math_equiv`` reward."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
from huggingface_hub import constants

from asyncrl.config.task import TaskConfig
from asyncrl.data import make_task
from asyncrl.data.math_formats import MATH_FORMATS, boxed_reference, gsm8k_reference, last_boxed
from asyncrl.hub import HubNotCachedError
from asyncrl.rewards.builtin import math_equiv
from asyncrl.testing.hub_cache import use_offline_cache, write_hub_dataset

GSM8K_TRAIN = [
    {"question": f"Tom has {i} apples and buys 3. How many?", "answer": f"{i} + 3 = {i + 3}\n#### {i + 3}"}
    for i in range(5)
]
GSM8K_TEST = [
    {"question": "A shop sells 1000 pens a day. How many in 2 days?", "answer": "2 * 1000\n#### 2,000"}
]
MATH_TEST = [
    {
        "problem": "Simplify $\\sqrt{18}$.",
        "solution": "$\\sqrt{18} = \\boxed{3\\sqrt{2}}$.",
        "level": "Level 2",
    },
    {"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1"},
]


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache (and datasets cache) this process uses, offline as ``HF_HUB_OFFLINE=1`` makes it."""
    return use_offline_cache(monkeypatch, tmp_path)


def gsm8k(**fields) -> TaskConfig:
    mapping = {
        "dataset": "openai/gsm8k",
        "dataset_config": "main",
        "prompt_field": "question",
        "answer_field": "answer",
        "prompt_format": "gsm8k",
    }
    return TaskConfig(type="hf_dataset", **(mapping | fields))


def test_gsm8k_by_name_with_config_splits_and_its_prompt_format(hub_cache: Path) -> None:
    write_hub_dataset(
        hub_cache,
        "openai/gsm8k",
        {"main": {"train": GSM8K_TRAIN, "test": GSM8K_TEST}, "socratic": {"train": GSM8K_TRAIN[:1]}},
    )
    task = make_task(gsm8k(eval_split="test"))
    train, held_out = task.split("train"), task.split("eval")
    assert len(train) == 5 and len(held_out) == 1
    first = train[0]
    assert first.prompt == GSM8K_TRAIN[0]["question"] + "\n\n" + MATH_FORMATS["gsm8k"].instruction
    assert (first.answer, first.answer_delimiter, first.reward) == ("3", "####", "math_equiv")
    assert held_out[0].answer == "2000"
    assert math_equiv("2 days of 1000 is 2000.\n#### 2,000", held_out[0])[0] == 1.0
    assert math_equiv("#### 1999", held_out[0])[0] == 0.0
    sliced = make_task(gsm8k(train_split="train[:2]", eval_split="test")).split("train")
    assert [s.answer for s in sliced] == ["3", "4"]
    socratic = make_task(gsm8k(dataset_config="socratic", eval_split="train")).split("train")
    assert [s.answer for s in socratic] == ["3"]  # the other config: one row


def test_math_with_boxed_references_chat_rows_and_a_pinned_revision(hub_cache: Path) -> None:
    old = write_hub_dataset(hub_cache, "math-org/math", {"default": {"test": MATH_TEST[:1]}})
    write_hub_dataset(hub_cache, "math-org/math", {"default": {"test": MATH_TEST}})
    fields = {"prompt_field": "problem", "answer_field": "solution", "prompt_format": "boxed"}
    config = TaskConfig(
        type="hf_dataset", dataset="math-org/math", train_split="test", eval_fraction=0.5, **fields
    )
    task = make_task(config)
    samples = [*task.split("train"), *task.split("eval")]
    assert sorted(s.answer for s in samples) == ["3\\sqrt{2}", "\\frac{1}{2}"]
    root = next(s for s in samples if s.answer == "3\\sqrt{2}")
    assert root.prompt.endswith("put your final answer within \\boxed{}.") and root.answer_delimiter is None
    assert math_equiv("so it is \\boxed{3\\sqrt 2}", root)[0] == 1.0
    assert math_equiv("so it is \\boxed{3}", root)[0] == 0.0
    pinned = make_task(
        TaskConfig(
            type="hf_dataset", dataset="math-org/math", dataset_revision=old, train_split="test", **fields
        )
    )
    with pytest.raises(ValueError, match="left an empty split"):  # the old commit held one row only
        pinned.split("train")


def test_a_chat_row_gets_the_instruction_on_its_last_user_message(hub_cache: Path) -> None:
    rows = [
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}],
            "ans": "2",
        }
    ]
    write_hub_dataset(hub_cache, "chat/math", {"default": {"train": rows * 2, "test": rows}})
    config = TaskConfig(
        type="hf_dataset",
        dataset="chat/math",
        eval_split="test",
        messages_field="messages",
        answer_field="ans",
        prompt_format="boxed",
    )
    [sample, _] = make_task(config).split("train")
    assert sample.messages[0]["content"] == "Be brief."
    assert sample.messages[1]["content"] == "1+1?\n\n" + MATH_FORMATS["boxed"].instruction


def test_missing_datasets_configs_and_splits_are_named_errors(hub_cache: Path, monkeypatch) -> None:
    with pytest.raises(HubNotCachedError, match=r"task.dataset: dataset 'openai/gsm8k' .* not in") as error:
        make_task(gsm8k()).split("train")
    assert str(hub_cache) in str(error.value)
    write_hub_dataset(hub_cache, "openai/gsm8k", {"main": {"train": GSM8K_TRAIN, "test": GSM8K_TEST}})
    with pytest.raises(ValueError, match=r"task.dataset 'openai/gsm8k' \(config 'nope'.*'nope' not found"):
        make_task(gsm8k(dataset_config="nope")).split("train")
    with pytest.raises(ValueError, match=r"split 'validation'.*Unknown split"):
        make_task(gsm8k(eval_split="validation")).split("train")
    bad = [{"question": "q", "answer": "no marker and #### "}]
    write_hub_dataset(hub_cache, "bad/gsm8k", {"main": {"train": bad, "test": bad}})
    with pytest.raises(ValueError, match=r"bad/gsm8k\[main:train\]: row 1: the answer field holds no gsm8k"):
        make_task(gsm8k(dataset="bad/gsm8k", eval_split="test")).split("train")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with pytest.raises(HubNotCachedError, match="downloads are off"):  # local_files_only: never online
        make_task(gsm8k(dataset="nobody/absent", local_files_only=True)).split("train")


def test_references_are_cut_out_of_worked_solutions() -> None:
    assert gsm8k_reference("3 + 4 = 7\n#### 7") == "7" and gsm8k_reference("1,234") == "1234"
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{a}{b}} end") == "\\frac{a}{b}"
    assert (
        last_boxed("\\fbox{x}") == "x" and last_boxed("\\boxed{open") is None and last_boxed("none") is None
    )
    assert boxed_reference("7") == "7"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"type": "hf_dataset"}, "exactly one of task.dataset"),
        ({"type": "hf_dataset", "dataset": "a/b", "train_path": "x"}, "exactly one of task.dataset"),
        ({"type": "copy", "dataset": "a/b"}, "task.dataset applies"),
        ({"type": "copy", "prompt_format": "gsm8k"}, "task.prompt_format applies"),
        (
            {"type": "file", "train_path": "x.jsonl", "prompt_format": "latex"},
            "task.prompt_format must be one of",
        ),
    ],
)
def test_bad_dataset_settings_are_named(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TaskConfig(**fields)
