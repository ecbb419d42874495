"""Stop strings checked over the tail of a sequence's output instead of its whole text at every step.

Why: the engine checks a request's stop strings after each token it appends. Decoding the whole output each
time costs O(n) per step and O(n²) per request: about 3 s of host time per step at 256 rows of 10 k tokens,
by the review's estimate, with the GPU idle meanwhile. A new occurrence can only involve the last few tokens,
so decoding a bounded tail finds it at the same step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

STOP_WINDOW_MARGIN = 8
"""Tokens decoded beyond the longest stop string's UTF-8 length; see ``stop_string_hit`` for the count."""


def stop_window(stop_strings: Sequence[str]) -> int:
    """How many trailing tokens ``stop_string_hit`` decodes for these stop strings."""
    return max(len(s.encode("utf-8")) for s in stop_strings) + STOP_WINDOW_MARGIN


def stop_string_hit(
    decode: Callable[[list[int]], str],
    token_ids: list[int],
    start: int,
    stop_strings: Sequence[str],
    *,
    whole: bool = False,
) -> bool:
    """Whether ``decode(token_ids[start:])`` (the output) contains one of ``stop_strings``, decoding only its
    tail; the caller checks after every appended token, so the output before the last token held none. Where
    that is not known (``whole``: the first token after a caller-given prefix, never checked), the whole
    output is decoded, as it always was.

    Same answer as decoding the whole output, by this count. The text of ``decode`` is stable as tokens are
    appended except for a trailing incomplete UTF-8 character (byte-level and byte-fallback tokenizers decode
    one as U+FFFD until a later token completes it): so a new occurrence ends in the last token's text or in
    a character it completed, whose bytes began at most 3 tokens earlier. An occurrence of a stop string of
    ``b`` UTF-8 bytes spans at most ``b`` bytes of token text (a U+FFFD in it, 3 bytes, stands for 1 to 3
    bytes), hence at most ``b`` tokens, each of which decodes to at least one byte. The window decodes
    ``b + STOP_WINDOW_MARGIN`` tokens (8): the occurrence's ``b`` and up to 3 after it, and up to 4 before
    it whose text may decode differently from the whole output's at the window's start (continuation bytes
    of a character begun before the window, at most 3; a SentencePiece tokenizer dropping its first token's
    leading space, 1). A tokenizer with tokens that decode to nothing would need a longer window.

    A hit in the window is confirmed on the whole output, so such window-start artefacts (a U+FFFD, a dropped
    space) never stop a request early: that decode runs about once per request, when it stops."""
    first = start if whole else max(start, len(token_ids) - stop_window(stop_strings))
    if not any(s in decode(token_ids[first:]) for s in stop_strings):
        return False
    return first == start or any(s in decode(token_ids[start:]) for s in stop_strings)
