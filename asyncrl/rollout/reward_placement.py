"""Where a reward falls among a response's tokens: a total on the last token, placed rewards by character offset.

Key decision: reward functions and environments see text, not token ids, so a placed reward names a character
offset of the text it scored, and this maps it to the token that produced that character: the first token
whose decoded prefix reaches past the offset, found by bisection over prefix decodes (O(log n) decodes per
point, so a long response with a few rewards costs little).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from asyncrl.types import PlacedRewards

Decode = Callable[[Sequence[int]], str]


def rewards_on_tokens(reward: float | PlacedRewards, token_ids: Sequence[int], decode: Decode) -> list[float]:
    """One value per token of ``token_ids`` (a response): a float on the last token; each placed point on the
    token holding its offset (an offset at or past the end of the text: the last token). Empty for no tokens."""
    placed = [0.0] * len(token_ids)
    if not token_ids:
        return placed
    if not isinstance(reward, PlacedRewards):
        placed[-1] = float(reward)
        return placed
    for offset, value in reward.points:
        placed[token_at(offset, token_ids, decode)] += value
    return placed


def token_at(offset: int, token_ids: Sequence[int], decode: Decode) -> int:
    """Index of the first token whose decoded prefix is longer than ``offset`` (the last if none is)."""
    low, high = 0, len(token_ids) - 1  # the answer lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if len(decode(token_ids[: middle + 1])) > offset:
            high = middle
        else:
            low = middle + 1
    return low
