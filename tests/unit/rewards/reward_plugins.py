"""User reward functions imported by dotted path in the tests (``reward_plugins:...``)."""

import time


def length_reward(response_text, sample):
    return float(len(response_text)), {"chars": len(response_text)}


def sleepy_reward(response_text, sample):
    time.sleep(float(response_text))
    return 1.0


def raising_reward(response_text, sample):
    if response_text == "boom":
        raise RuntimeError("kaboom")
    return 1.0


def bad_output_reward(response_text, sample):
    return {"nan": float("nan"), "str": "1", "info": (1.0, [1])}[response_text]


def step_reward(response_text, sample):
    """0.5 for the first line, 1.0 for the second, each on the line's newline (a per-step reward)."""
    from asyncrl.types import PlacedRewards

    ends = [i for i, c in enumerate(response_text) if c == "\n"]
    return PlacedRewards(tuple(zip(ends, (0.5, 1.0)[: len(ends)], strict=True)))


not_callable = 3
