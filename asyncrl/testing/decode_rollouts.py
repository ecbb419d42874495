"""Simulated decode rollouts for the static decode plan: what its shapes read, and how many there are (no torch).

Why: a static step reads ``attention_positions`` of its shape's groups per layer, while its rows need only
their own positions; and every distinct shape is a CUDA graph to capture (time and memory, again at every
wake). Neither shows on CPU in wall time, so the plan's ladders are chosen and guarded on these counts, over
batches shaped like RL rollouts: a **sync** rollout (every row starts together and the batch shrinks as rows
finish) and an **async** one (continuous batching: a finished row's slot takes a new request at once, so the
rows' contexts spread over the whole range). Output lengths are long-tailed: exponential with a mean of
``MEAN_FRACTION`` of the cap, cut at the cap. Rows are ordered longest first, as the scheduler orders them by
bucket (the plan depends on the order of the rows' levels only).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from asyncrl.engine.decode_plan import attention_positions, batch_buckets, static_shape

MEAN_FRACTION = 0.3
"""Mean output length as a fraction of ``max_new_tokens``: a long tail where a few rows reach the cap."""


@dataclass(frozen=True)
class Rollout:
    """One simulated rollout's decode steps (only every ``stride``-th step is planned and counted)."""

    num_slots: int
    prompt: int
    max_new_tokens: int
    sync: bool
    seed: int = 0
    steps: int | None = None
    """Steps to simulate; None: ``max_new_tokens`` (a sync rollout ends earlier when its last row does)."""
    stride: int = 1

    @property
    def max_len(self) -> int:
        return self.prompt + self.max_new_tokens

    def positions(self) -> Iterator[list[int]]:
        """Each counted step's decode positions, longest first."""
        rng = random.Random(self.seed)

        def output_length() -> int:
            mean = MEAN_FRACTION * self.max_new_tokens
            return min(self.max_new_tokens, int(rng.expovariate(1 / mean)) + 1)

        rows = [[0, output_length()] for _ in range(self.num_slots)]  # [tokens decoded, output length]
        if not self.sync:  # a steady state: each row somewhere in its output
            for row in rows:
                row[0] = rng.randrange(row[1])
        for _ in range(0, self.steps or self.max_new_tokens, self.stride):
            live = [self.prompt + done for done, length in rows if done < length]
            if not live:
                return
            yield sorted(live, reverse=True)
            for row in rows:
                row[0] += self.stride
                if not self.sync and row[0] >= row[1]:
                    row[0], row[1] = 0, output_length()


@dataclass(frozen=True)
class Reads:
    """What a rollout's static steps cost, summed over its counted steps."""

    static_positions: int
    """KV positions the static shapes read, per layer (``attention_positions``)."""
    needed_positions: int
    """KV positions the rows need: each row its own position + 1."""
    shapes: int
    """Distinct (batch, groups) shapes: graphs a CUDA run captures (once per wake)."""
    max_groups: int
    """Most attention groups in one shape: SDPA calls per layer in its graph."""

    @property
    def ratio(self) -> float:
        return self.static_positions / self.needed_positions


def static_reads(rollout: Rollout) -> Reads:
    """The static plan's reads and shapes over ``rollout``."""
    buckets = batch_buckets(rollout.num_slots)
    shapes, static, needed, max_groups = set(), 0, 0, 0
    for positions in rollout.positions():
        shape = static_shape(positions, buckets, rollout.max_len)
        shapes.add(shape)
        static += attention_positions(shape[1])
        needed += sum(positions) + len(positions)
        max_groups = max(max_groups, len(shape[1]))
    return Reads(static, needed, len(shapes), max_groups)


def main() -> None:
    """Print the figures docs/backends.md records: sync and async rollouts at 64 and 256 slots."""
    print("rollout     slots  static/needed  shapes  max groups")
    for sync in (True, False):
        for slots in (64, 256):
            reads = static_reads(Rollout(slots, prompt=300, max_new_tokens=20480, sync=sync))
            kind = "sync" if sync else "async"
            print(f"{kind:10s} {slots:6d} {reads.ratio:14.2f} {reads.shapes:7d} {reads.max_groups:11d}")


if __name__ == "__main__":
    main()
