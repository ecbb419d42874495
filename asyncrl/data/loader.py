"""User datasets: JSONL and Parquet rows into ``TaskSample``s, with strict per-row validation.

Key decision: a malformed row stops loading with a ``ValueError`` naming the file, the 1-based row number
(the line number for JSONL) and the reason, instead of being skipped: a silently shrunken dataset is a
worse surprise than an error at start-up.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from asyncrl.data.base import TaskSample
from asyncrl.data.math_formats import math_format

SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True, kw_only=True)
class FieldSpec:
    """Which columns of a row hold what, and how its answers are verified."""

    prompt_field: str = "prompt"
    """Column with the plain-text prompt; may be absent in a row that has ``messages_field``."""
    answer_field: str = "answer"
    """Column with the reference answer (a string or a number)."""
    messages_field: str = ""
    """Column with chat messages ({role, content}); empty: plain prompts only."""
    answer_delimiter: str = ""
    """The final answer follows the last occurrence of this marker in a response; empty: the whole response."""
    reward: str = "exact_match"
    """Reward that verifies the rows."""
    prompt_format: str = ""
    """A math answer convention (``data.math_formats``: ``gsm8k``, ``boxed``) applied to every row: its
    instruction appended, its reference answer cut out, verified by ``math_equiv``; empty: rows as they are."""


def read_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """(1-based row number, row) for each row of a ``.jsonl`` or ``.parquet`` file; blank JSONL lines skipped."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise ValueError(f"{path}: unsupported dataset file type {path.suffix!r}; expected one of {SUFFIXES}")
    if not path.is_file():
        raise ValueError(f"{path}: dataset file not found")
    return _read_jsonl(path) if path.suffix == ".jsonl" else _read_parquet(path)


def load_samples(path: str | os.PathLike[str], fields: FieldSpec, uid_prefix: str) -> list[TaskSample]:
    """Every row of ``path`` as a sample with uid ``{uid_prefix}-{row}``; the first malformed row raises."""
    return samples_from_rows(read_rows(path), fields, uid_prefix, where=str(path))


def samples_from_rows(
    rows: Iterable[tuple[int, Any]], fields: FieldSpec, uid_prefix: str, *, where: str
) -> list[TaskSample]:
    """``(row number, row)`` pairs as samples; the first malformed row raises naming ``where`` and its number."""
    samples = []
    for row_number, row in rows:
        try:
            samples.append(row_to_sample(row, fields, uid=f"{uid_prefix}-{row_number:06d}"))
        except ValueError as err:
            raise ValueError(f"{where}: row {row_number}: {err}") from err
    if not samples:
        raise ValueError(f"{where}: the dataset has no rows")
    return samples


def row_to_sample(row: Any, fields: FieldSpec, *, uid: str) -> TaskSample:
    """One validated row as a sample; ValueError with the reason when a field is missing or ill-typed."""
    if not isinstance(row, Mapping):
        raise ValueError(f"a row must be an object, got {type(row).__name__}")
    messages = _messages(row, fields.messages_field)
    sample = TaskSample(
        uid=uid,
        prompt=_prompt(row, fields.prompt_field, messages),
        answer=_answer(row, fields.answer_field),
        messages=messages,
        answer_delimiter=fields.answer_delimiter or None,
        reward=fields.reward,
        metadata={k: v for k, v in row.items() if k not in (fields.prompt_field, fields.messages_field)},
    )
    return with_math_format(sample, fields.prompt_format) if fields.prompt_format else sample


def with_math_format(sample: TaskSample, name: str) -> TaskSample:
    """``sample`` asked in the math convention ``name``: instruction appended to its prompt (and to the last
    user message of a chat row), reference answer cut out of the answer field, verified by ``math_equiv``."""
    convention = math_format(name)
    reference = convention.reference(sample.answer)
    if not reference:
        raise ValueError(f"the answer field holds no {name} answer: {sample.answer!r}")
    messages = sample.messages
    if messages is not None:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        messages = tuple(
            {**m, "content": f"{m['content']}\n\n{convention.instruction}"} if i == last_user else m
            for i, m in enumerate(messages)
        )
    return replace(
        sample,
        prompt=f"{sample.prompt}\n\n{convention.instruction}",
        messages=messages,
        answer=reference,
        answer_delimiter=convention.answer_delimiter,
        reward="math_equiv",
    )


def column(row: Mapping[str, Any], field: str) -> Any:
    """``row[field]``; a dotted name reaches into nested objects when no column has it whole
    (``reward_model.ground_truth``, as verl-format datasets nest their answers). None when absent."""
    if field in row:
        return row[field]
    value: Any = row
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _as_number(answer: str | int | float) -> float:
    """``answer`` as a float where it reads as one (0.0 where it does not: any text answer is finite)."""
    try:
        return float(answer)
    except (ValueError, OverflowError):  # text, or an integer beyond float range (finite all the same)
        return 0.0


def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: row {line_number}: invalid JSON ({err.msg})") from err


def _read_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq  # heavy import, only when a Parquet file is actually read

    yield from enumerate(pq.read_table(path).to_pylist(), start=1)


def _messages(row: Mapping[str, Any], field: str) -> tuple[dict[str, str], ...] | None:
    if not field or column(row, field) is None:
        return None
    messages = column(row, field)
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"field {field!r} must be a non-empty list of messages, got {messages!r}")
    for i, message in enumerate(messages):
        ok = isinstance(message, Mapping) and all(
            isinstance(message.get(k), str) for k in ("role", "content")
        )
        if not ok:
            raise ValueError(f"field {field!r}[{i}] must be an object with string 'role' and 'content'")
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)


def _prompt(row: Mapping[str, Any], field: str, messages: tuple[dict[str, str], ...] | None) -> str:
    prompt = column(row, field)
    if messages is not None:
        user_turns = [m["content"] for m in messages if m["role"] == "user"]
        if not user_turns:
            raise ValueError("chat messages must contain a 'user' message")
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError(f"field {field!r} must be a string (or absent in a chat row), got {prompt!r}")
        prompt = prompt if prompt and prompt.strip() else user_turns[-1]
        if not prompt.strip():
            raise ValueError("the last 'user' message of the chat must not be empty")
        return prompt
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"field {field!r} must be a non-empty string, got {prompt!r}")
    return prompt


def _answer(row: Mapping[str, Any], field: str) -> str:
    answer = column(row, field)
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise ValueError(f"field {field!r} must be a string or a number, got {answer!r}")
    if isinstance(answer, str) and not answer.strip():
        raise ValueError(f"field {field!r} must not be empty")
    if not math.isfinite(
        _as_number(answer)
    ):  # a NaN or inf (a number, or text such as 'NAN') verifies nothing
        raise ValueError(f"field {field!r} must be a finite number, got {answer!r}")
    return str(answer)
