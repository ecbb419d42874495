"""TaskConfig validation, answer extraction and prompt rendering (plain and chat)."""

import pytest

from asyncrl.config.task import TaskConfig
from asyncrl.data import TaskSample, extract_answer, render_prompt


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"type": "sort"}, "task.type must be one of"),
        ({"num_train": 0}, "task.num_train must be >= 1"),
        ({"median_items": 0.5}, "task.median_items"),
        ({"length_sigma": -1.0}, "task.length_sigma"),
        ({"eval_fraction": 1.0}, "task.eval_fraction"),
        ({"type": "file"}, "task.train_path must be set"),
    ],
)
def test_task_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        TaskConfig(**overrides)


def test_extract_answer_uses_last_delimiter_and_normalises_space():
    sample = TaskSample(uid="u", prompt="p", answer="17", answer_delimiter="=")
    assert extract_answer(" 3 4 = 7 = 17 ", sample) == "17"
    assert extract_answer(" 3 4 17", sample) == ""
    plain = TaskSample(uid="u", prompt="p", answer="1 2")
    assert extract_answer("  1   2\n", plain) == "1 2"


class ChatTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class PlainTokenizer:
    chat_template = None


def test_render_prompt_uses_chat_template_only_when_there_is_one():
    chat = TaskSample(uid="u", prompt="2+2?", answer="4", messages=({"role": "user", "content": "2+2?"},))
    assert render_prompt(chat, ChatTokenizer()) == "<user>2+2?<assistant>"
    assert render_prompt(chat, PlainTokenizer()) == "2+2?"
    assert render_prompt(chat) == "2+2?"
    plain = TaskSample(uid="u", prompt="count 1 to 2:", answer="1 2")
    assert render_prompt(plain, ChatTokenizer()) == "count 1 to 2:"
