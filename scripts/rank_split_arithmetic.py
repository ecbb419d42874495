"""How much the token-balanced row split evens out the ranks, in planned tokens: arithmetic on CPU, no timing.

For long-tailed lengths (an assumed distribution, not a measured DAPO one: prompts of 100-400 tokens, responses
log-normal with median ~1,500 and sigma 1, capped), each mini-batch is dealt over the ranks strided and balanced
(``asyncrl.trainer.distributed.row_split``) and judged three ways: the largest rank's planned tokens over the
mean (``rank_token_imbalance``); the lock-step tokens, the sum over passes of the largest rank's pass (FSDP2's
all-gathers make ranks wait for each other at every pass, not only at the mini-batch's end; an empty pass
counts 0); and the agreed pass count. The padded rows also compare balancing plain lengths with balancing
planned tokens. What this does to a GPU's step time is not measured.

    python scripts/rank_split_arithmetic.py
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python scripts/rank_split_arithmetic.py` puts scripts/ first on sys.path: make the checkout the import root
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402

from asyncrl.trainer.batching import plan_micro_batches  # noqa: E402
from asyncrl.trainer.distributed.row_split import (  # noqa: E402
    RowSplit,
    balanced_split,
    planned_tokens,
    strided_split,
)

SCENARIOS = [
    # (name, rows per mini-batch, ranks, token budget, response cap)
    ("dapo_math_8gpu shape: 4 ranks, 256 rows, 8k cap", 256, 4, 32_768, 8_192),
    ("8 ranks, 128 rows, 20k cap", 128, 8, 32_768, 20_000),
    ("8 ranks, 32 rows, 20k cap", 32, 8, 32_768, 20_000),
]
TRIALS = 100


def long_tailed(num_rows: int, cap: int, rng: random.Random) -> list[int]:
    return [rng.randint(100, 400) + min(cap, int(rng.lognormvariate(7.3, 1.0))) for _ in range(num_rows)]


def lock_step(split: RowSplit, lengths: dict[int, int], budget: int, packed: bool) -> tuple[int, int]:
    """(sum over passes of the largest rank's pass tokens, agreed passes)."""
    passes = []
    for rank in split.ranks:
        rank_lengths = [lengths[row] for row in rank]
        plan = plan_micro_batches(rank_lengths, budget, packed=packed)
        passes.append(
            [planned_tokens([rank_lengths[i] for i in micro], budget, packed=packed) for micro in plan]
        )
    agreed = max(len(p) for p in passes)
    return sum(max(p[i] if i < len(p) else 0 for p in passes) for i in range(agreed)), agreed


def by_length(rows: list[int], lengths: list[int], ranks: int) -> list[list[int]]:
    """Longest-first greedy on plain lengths (what balancing ignoring padding would deal)."""
    loads, dealt = [0] * ranks, [[] for _ in range(ranks)]
    for i in sorted(range(len(rows)), key=lambda i: (-lengths[i], i)):
        rank = min(range(ranks), key=lambda r: (loads[r], r))
        loads[rank] += lengths[i]
        dealt[rank].append(rows[i])
    return dealt


def scenario(name: str, num_rows: int, ranks: int, budget: int, cap: int, packed: bool) -> None:
    rng = random.Random(0)
    imbalance = {"strided": [], "balanced": [], "lengths": []}
    lock_ratio, passes, more_passes = [], {"strided": [], "balanced": []}, 0
    for _ in range(TRIALS):
        lengths = long_tailed(num_rows, cap, rng)
        rows = list(range(num_rows))
        by_row = dict(zip(rows, lengths, strict=True))
        strided = strided_split(rows, lengths, ranks, budget, packed=packed)
        balanced = balanced_split(rows, lengths, ranks, budget, packed=packed)
        costs = [
            planned_tokens([by_row[r] for r in rank], budget, packed=packed)
            for rank in by_length(rows, lengths, ranks)
        ]
        imbalance["strided"].append(strided.imbalance)
        imbalance["balanced"].append(balanced.imbalance)
        imbalance["lengths"].append(max(costs) / statistics.mean(costs))
        (s_lock, s_passes), (b_lock, b_passes) = (
            lock_step(x, by_row, budget, packed) for x in (strided, balanced)
        )
        lock_ratio.append(b_lock / s_lock)
        passes["strided"].append(s_passes)
        passes["balanced"].append(b_passes)
        more_passes += b_passes > s_passes
    mode = "packed" if packed else "padded"
    print(f"{name}, {mode}, budget {budget}:")
    for how in ("strided", "balanced") + (() if packed else ("lengths",)):
        values = imbalance[how]
        print(f"  imbalance {how:9s} mean {statistics.mean(values):.3f}  worst {max(values):.3f}")
    print(
        f"  lock-step tokens balanced / strided: mean {statistics.mean(lock_ratio):.3f}; agreed passes "
        f"strided {statistics.mean(passes['strided']):.2f}, balanced {statistics.mean(passes['balanced']):.2f} "
        f"(more than strided in {more_passes} of {TRIALS})"
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print(f"{TRIALS} mini-batches per line, seeded")
    for name, num_rows, ranks, budget, cap in SCENARIOS:
        for packed in (True, False):
            scenario(name, num_rows, ranks, budget, cap, packed)


if __name__ == "__main__":
    main()
