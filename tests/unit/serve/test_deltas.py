"""Streamed text pieces: only what the final answer is sure to start with, each piece once."""

from __future__ import annotations

from asyncrl.serve.deltas import TextDeltas, partial_suffix

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
