"""Property-based fuzzing of the dataset loaders: rows with missing, empty or wrong-typed fields are refused
with an error naming the file, the row and the field; every accepted row is a well-formed sample."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.data.loader import FieldSpec, load_samples, row_to_sample
from asyncrl.testing.fuzz import values

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CHAT = FieldSpec(messages_field="messages")

messages = st.one_of(
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "system"]), "content": st.text(max_size=5)}
        ),
        max_size=3,
    ),
    values,
)
rows = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "prompt": st.one_of(st.text(max_size=6), values),
            "answer": st.one_of(st.text(max_size=4), values),
        },
    ),
    st.fixed_dictionaries(
        {"prompt": st.text(max_size=6), "answer": st.one_of(st.integers(), st.floats(), values)}
    ),
    values,
)
chat_rows = st.fixed_dictionaries(
    {"messages": messages, "answer": st.text(min_size=1, max_size=3)},
    optional={"prompt": st.one_of(st.text(max_size=3), values)},
)


def assert_well_formed(sample: Any) -> None:
    assert isinstance(sample.prompt, str) and sample.prompt.strip(), sample
    assert isinstance(sample.answer, str) and sample.answer.strip(), sample
    assert sample.answer.lower() not in ("nan", "inf", "-inf"), f"a non-finite answer was accepted: {sample}"
    if sample.messages is not None:
        assert all(isinstance(m["role"], str) and isinstance(m["content"], str) for m in sample.messages)


@FUZZ
@given(data=st.data(), chat=st.booleans())
def test_a_row_becomes_a_well_formed_sample_or_a_value_error_naming_the_field(data, chat):
    row = data.draw(st.one_of(chat_rows, rows) if chat else rows)
    fields = CHAT if chat else FieldSpec()
    try:
        sample = row_to_sample(row, fields, uid="u")
    except ValueError as err:
        assert any(name in str(err) for name in ("prompt", "answer", "messages", "row", "user")), str(err)
        return
    assert_well_formed(sample)


@FUZZ
@given(file_rows=st.lists(rows, min_size=1, max_size=5))
def test_a_jsonl_file_loads_or_names_its_first_bad_row(tmp_path_factory, file_rows):
    file_rows = [json.loads(json.dumps(row, default=str)) for row in file_rows]  # what JSON can hold
    path = tmp_path_factory.mktemp("data") / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in file_rows))
    try:
        samples = load_samples(path, FieldSpec(), uid_prefix="train")
    except ValueError as err:
        assert str(path) in str(err)
        bad = first_bad_row(file_rows)
        assert bad is not None and f"row {bad}:" in str(err), str(err)
        return
    assert len(samples) == len(file_rows) and first_bad_row(file_rows) is None
    for sample in samples:
        assert_well_formed(sample)


def first_bad_row(file_rows: list[Any]) -> int | None:
    for number, row in enumerate(file_rows, start=1):
        try:
            row_to_sample(row, FieldSpec(), uid="u")
        except ValueError:
            return number
    return None


@FUZZ
@given(
    prompts=st.lists(st.one_of(st.none(), st.text(max_size=4)), min_size=1, max_size=5),
    answers=st.lists(
        st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-9, 9)), min_size=5, max_size=5
    ),
)
def test_a_parquet_file_with_nulls_and_numbers_loads_or_names_its_first_bad_row(
    tmp_path_factory, prompts, answers
):
    answers = answers[: len(prompts)]
    path = tmp_path_factory.mktemp("data") / "rows.parquet"
    answer_type = pa.float64() if any(isinstance(a, float) for a in answers) else pa.int64()
    table = pa.table({"prompt": pa.array(prompts, pa.string()), "answer": pa.array(answers, answer_type)})
    pq.write_table(table, path)
    file_rows = table.to_pylist()
    try:
        samples = load_samples(path, FieldSpec(), uid_prefix="train")
    except ValueError as err:
        assert str(path) in str(err) and f"row {first_bad_row(file_rows)}:" in str(err), str(err)
        return
    assert len(samples) == len(prompts)
    for sample in samples:
        assert_well_formed(sample)
