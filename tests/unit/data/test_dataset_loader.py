"""User dataset loading: JSONL and Parquet, configurable fields, chat rows, and exact malformed-row errors."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.config.task import TaskConfig
from asyncrl.data import make_task
from asyncrl.data.loader import FieldSpec, load_samples


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_rows_with_custom_fields(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "1+1?", "a": 2, "level": 1}, "", {"q": "2+3?", "a": "5"}])
    samples = load_samples(path, FieldSpec(prompt_field="q", answer_field="a"), uid_prefix="train")
    assert [(s.uid, s.prompt, s.answer) for s in samples] == [
        ("train-000001", "1+1?", "2"),
        ("train-000003", "2+3?", "5"),
    ]
    assert samples[0].metadata == {"a": 2, "level": 1}
    assert samples[0].messages is None


def test_chat_rows_take_the_last_user_message_as_prompt(tmp_path):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "2+2?"},
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages, "answer": "4"}])
    (sample,) = load_samples(path, FieldSpec(messages_field="messages"), uid_prefix="x")
    assert sample.prompt == "2+2?"
    assert sample.messages == tuple(messages)


def test_parquet_rows(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a?", "b?"], "answer": ["1", "2"]}), path)
    samples = load_samples(path, FieldSpec(), uid_prefix="p")
    assert [(s.uid, s.prompt, s.answer) for s in samples] == [
        ("p-000001", "a?", "1"),
        ("p-000002", "b?", "2"),
    ]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"prompt": "p"}', "row 2: field 'answer' must be a string or a number, got None"),
        ('{"prompt": "", "answer": "1"}', "row 2: field 'prompt' must be a non-empty string, got ''"),
        ('{"prompt": "p", "answer": true}', "row 2: field 'answer' must be a string or a number, got True"),
        ('{"prompt": "p", "answer": " "}', "row 2: field 'answer' must not be empty"),
        ("[1, 2]", "row 2: a row must be an object, got list"),
        ('{"prompt": "p", "answer": ', "row 2: invalid JSON"),
        ('{"messages": [], "answer": "1"}', "row 2: field 'messages' must be a non-empty list of messages"),
        (
            '{"messages": [{"role": "user"}], "answer": "1"}',
            "row 2: field 'messages'\\[0\\] must be an object",
        ),
        (
            '{"messages": [{"role": "system", "content": "s"}], "answer": "1"}',
            "row 2: chat messages must contain a 'user' message",
        ),
    ],
)
def test_malformed_rows_name_file_row_and_reason(tmp_path, line, reason):
    path = write_jsonl(tmp_path / "bad.jsonl", ['{"prompt": "ok", "answer": "1"}', line])
    with pytest.raises(ValueError, match=f"bad.jsonl: {reason}"):
        load_samples(path, FieldSpec(messages_field="messages"), uid_prefix="t")


def test_parquet_malformed_row_is_reported_by_row_number(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["a?", "b?", None], "answer": ["1", "2", "3"]}), path)
    with pytest.raises(ValueError, match="bad.parquet: row 3: field 'prompt' must be a non-empty string"):
        load_samples(path, FieldSpec(), uid_prefix="p")


def test_unsupported_missing_and_empty_files(tmp_path):
    with pytest.raises(ValueError, match="unsupported dataset file type '.csv'"):
        load_samples(tmp_path / "d.csv", FieldSpec(), uid_prefix="t")
    with pytest.raises(ValueError, match="dataset file not found"):
        load_samples(tmp_path / "missing.jsonl", FieldSpec(), uid_prefix="t")
    with pytest.raises(ValueError, match="the dataset has no rows"):
        load_samples(write_jsonl(tmp_path / "empty.jsonl", []), FieldSpec(), uid_prefix="t")


def test_file_task_holds_out_rows_by_prompt_hash(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(200)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    task = make_task(TaskConfig(type="file", train_path=str(path), eval_fraction=0.25, seed=1))
    train, held_out = task.split("train"), task.split("eval")
    assert len(train) + len(held_out) == 200
    assert 30 <= len(held_out) <= 70
    assert not {s.prompt for s in train} & {s.prompt for s in held_out}


def test_file_task_with_separate_eval_file(tmp_path):
    train_path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "a", "answer": "1"}])
    eval_path = write_jsonl(tmp_path / "eval.jsonl", [{"prompt": "b", "answer": "2"}])
    task = make_task(TaskConfig(type="file", train_path=str(train_path), eval_path=str(eval_path)))
    assert [s.prompt for s in task.split("train")] == ["a"]
    assert [(s.uid, s.prompt) for s in task.split("eval")] == [("eval-000001", "b")]
