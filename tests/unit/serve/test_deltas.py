"""Streamed text pieces: only what the final answer is sure to start with, each piece once; the close sends the
rest."""

from __future__ import annotations

import pytest

from asyncrl.serve.deltas import TextDeltas, partial_suffix
from asyncrl.serve.schemas import ServeError
from asyncrl.serve.service import CallResult, Choice
from asyncrl.serve.streaming import Chunks

PIECES = {
    1: " Hi",
    2: " there",
    3: " <tool",
    4: '_call>{"name": "f"}</tool_call>',
    5: "\ufffd",
    6: "é",
    7: "Ho",
}


class PieceTokenizer:
    """Each id decodes to a fixed piece (5 is half a character, as a byte-level token can be)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(PIECES[i] for i in token_ids)


def heard(reports: list[list[int]], *, chat: bool) -> list[str]:
    emitted: list[str] = []
    deltas = TextDeltas(PieceTokenizer(), emitted.append, chat=chat)
    for token_ids in reports:
        deltas(token_ids)
    return emitted


def test_chat_pieces_strip_like_the_answer_and_stop_at_a_tool_call() -> None:
    reports = [[1], [1, 2], [1, 2, 3], [1, 2, 3, 4]]
    assert heard(reports, chat=True) == ["Hi", " there"]  # " <tool" held, then the call is the route's


def test_completion_pieces_keep_whitespace_and_markers() -> None:
    assert heard([[1], [1, 2], [1, 2, 3]], chat=False) == [" Hi", " there", " <tool"]


def test_half_a_character_waits_for_the_rest() -> None:
    assert heard([[1, 5], [1, 6]], chat=False) == [" Hi", "é"]


def test_a_report_that_does_not_extend_what_was_sent_sends_nothing() -> None:
    assert heard([[1, 2], [7], [1, 2, 6]], chat=True) == ["Hi there", "é"]


def test_partial_suffix() -> None:
    assert partial_suffix("a <tool", "<tool_call>") == 5
    assert partial_suffix("a <", "<tool_call>") == 1
    assert partial_suffix("a b", "<tool_call>") == 0


def test_the_close_sends_what_was_held_back_and_refuses_a_diverged_answer() -> None:
    choice = Choice(
        text="Hi there", tool_calls=[], finish_reason="stop", token_ids=[1, 2], logprobs=[], versions=[]
    )
    result = CallResult(choices=[choice], num_prompt_tokens=3, trajectory_id=None, branch=None)
    chunks = Chunks("chat", "m")
    closing = chunks.closing(result, {0: "Hi"})
    assert [c["choices"][0]["delta"] for c in closing] == [{"content": " there"}, {}]
    assert closing[-1]["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(ServeError) as refused:
        chunks.closing(result, {0: "Ho"})
    assert refused.value.status == 503
