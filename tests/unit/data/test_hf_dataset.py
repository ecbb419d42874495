"""Tasks from Hugging Face ``datasets`` on disk, and prompts rendered through the tokenizer's chat template."""

from __future__ import annotations

import datasets
import pytest
from transformers import AutoTokenizer

from asyncrl.config.task import TaskConfig
from asyncrl.data import make_task
from asyncrl.data.base import prompt_token_ids
from asyncrl.models.loading import DEFAULT_MODEL_DIR

TRAIN = [{"question": f"what is {i} + 1?", "solution": str(i + 1), "level": i % 3} for i in range(6)]
TEST = [{"question": "what is 10 + 1?", "solution": "11", "level": 0}]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "arith"
    splits = {"train": datasets.Dataset.from_list(TRAIN), "test": datasets.Dataset.from_list(TEST)}
    datasets.DatasetDict(splits).save_to_disk(str(path))
    return path


def hf_task(**fields):
    mapping = {"prompt_field": "question", "answer_field": "solution"}
    return make_task(TaskConfig(type="hf_dataset", **mapping, **fields))


def test_a_saved_dataset_dict_maps_fields_and_splits(saved):
    task = hf_task(train_path=str(saved), eval_split="test")
    train, held_out = task.split("train"), task.split("eval")
    assert [(s.prompt, s.answer) for s in train] == [(r["question"], r["solution"]) for r in TRAIN]
    assert [(s.prompt, s.answer) for s in held_out] == [("what is 10 + 1?", "11")]
    assert train[0].uid == "train-000001" and train[4].metadata["level"] == 1


def test_a_local_parquet_file_is_read_with_load_dataset_and_held_out_by_hash(tmp_path):
    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list(TRAIN * 20).to_parquet(str(path))
    task = hf_task(train_path=str(path), eval_fraction=0.3)
    assert len(task.split("train")) + len(task.split("eval")) == 120
    assert {s.prompt for s in task.split("train")}.isdisjoint({s.prompt for s in task.split("eval")})


def test_a_bad_row_and_a_missing_split_are_named(saved, tmp_path):
    with pytest.raises(ValueError, match=r"has no split 'validation'; it has \['test', 'train'\]"):
        hf_task(train_path=str(saved), eval_split="validation").split("eval")
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "ok?", "solution": "1"}\n{"question": "", "solution": "2"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl\[train\]: row 2: field 'question' must be a non-empty"):
        hf_task(train_path=str(path), eval_fraction=0.5).split("train")


def test_chat_rendered_prompts_are_exactly_apply_chat_templates_tokens(saved):
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    assert tokenizer.chat_template
    chat = hf_task(train_path=str(saved), eval_split="test", chat_template="always").split("train")[0]
    messages = [{"role": "user", "content": "what is 0 + 1?"}]
    expected = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert prompt_token_ids(chat, tokenizer) == list(expected)
    plain = hf_task(train_path=str(saved), eval_split="test").split("train")[0]
    assert prompt_token_ids(plain, tokenizer) == tokenizer.encode("what is 0 + 1?")
    never = make_task(TaskConfig(type="copy", chat_template="never", num_train=5, num_eval=5)).split("train")[
        0
    ]
    assert never.messages is None


def test_an_unknown_chat_template_mode_is_a_named_error():
    with pytest.raises(ValueError, match=r"task.chat_template"):
        TaskConfig(chat_template="sometimes")
