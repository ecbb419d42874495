"""The static decode plan reads close to what its rows need, in few shapes: counted over simulated rollouts
(``asyncrl.testing.decode_rollouts``), since neither KV read nor captures show in CPU wall time.

With powers of two for both ladders the simulated rollouts below read 1.84-1.98x their rows' needs (the
padded rows joined the top group at its level, and each row read up to twice its context) in 10-20 shapes;
the half-octave ladders read 1.36-1.42x in 19 (sync) to ~100 (async, 20k steps) shapes. A real step refills
its slots as rows end, and the shipped recipe's step meets 46 shapes (``RecipeRollout``, through the engine's
own scheduler), whose capture cost chose ``engine.decode_graph_min_uses``."""

from __future__ import annotations

import pytest

from asyncrl.config.engine import EngineConfig
from asyncrl.engine.decode_plan import (
    attention_positions,
    batch_buckets,
    half_octave_ceil,
    length_levels,
    static_shape,
)
from asyncrl.sim.decode_captures import uses_per_shape, wake_cost
from asyncrl.testing.decode_rollouts import RECIPES, Rollout, static_reads

MAX_READ_RATIO = 1.5
"""Static reads over needed reads a simulated rollout may reach (1.36-1.42 measured; 1.84-1.98 before)."""
MAX_GROUPS = 10
"""Attention groups in one shape, each one SDPA call per layer in its graph (8-9 measured; 4-5 before)."""


def test_the_ladders_step_by_half_octaves():
    assert [half_octave_ceil(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert batch_buckets(256) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
    assert batch_buckets(100) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 100]
    assert length_levels(20780) == [
        64,
        128,
        256,
        512,
        1024,
        2048,
        3072,
        4096,
        6144,
        8192,
        12288,
        16384,
        20780,
    ]
    with pytest.raises(ValueError, match="count 0"):
        half_octave_ceil(0)


def test_padded_rows_join_the_top_group_by_at_most_half_again():
    """The reviewer's case: 130 live rows at 16k in 256 slots read 256 x 16,384 positions with powers of two;
    now the batch pads to 192, the rest of the slots are not in the step at all."""
    batch, groups = static_shape([15999] * 130, batch_buckets(256), 20780)
    assert (batch, groups) == (192, ((0, 192, 16384),))
    assert attention_positions(groups) == 192 * 16384


def test_a_context_past_a_power_of_two_reads_a_half_octave_more():
    batch, groups = static_shape([4096] + [100] * 5, batch_buckets(8), 20780)
    assert (batch, groups) == (6, ((0, 1, 6144), (1, 6, 128)))


ROLLOUTS = {
    "sync-64": (Rollout(64, prompt=300, max_new_tokens=20480, sync=True, stride=4), 24),
    "sync-256": (Rollout(256, prompt=300, max_new_tokens=20480, sync=True, stride=4), 24),
    "async-64": (Rollout(64, prompt=300, max_new_tokens=20480, sync=False, stride=8), 128),
    "async-256": (Rollout(256, prompt=300, max_new_tokens=20480, sync=False, stride=8), 128),
}
"""Rollouts to 20k-token outputs (long-tailed lengths), each with its bound on distinct shapes: a sync
rollout's shapes are captured again at every wake, an async engine's accumulate over its 20k steps."""


@pytest.mark.parametrize("name", list(ROLLOUTS))
def test_a_rollout_reads_within_half_again_of_its_needs_in_a_bounded_number_of_shapes(name):
    rollout, max_shapes = ROLLOUTS[name]
    reads = static_reads(rollout)
    assert reads.ratio <= MAX_READ_RATIO, reads
    assert reads.shapes <= max_shapes, reads
    assert reads.max_groups <= MAX_GROUPS, reads


def test_a_recipe_step_with_refill_meets_its_shapes_and_the_default_captures_them_at_first_use():
    """gsm8k_1gpu's training step (256 requests on 44 slots, a slot refilled as its row ends): 46 shapes, where
    the sync rollout without refill meets 19 (docs/backends.md's figures); ten of them run a single step, most
    tens to hundreds. At the probe's replay ratio and three eager steps a capture, capturing at first use is the
    cheapest ``min_uses`` for it, the engine's default."""
    uses = uses_per_shape(RECIPES["gsm8k_1gpu"].shapes())
    assert (len(uses), sum(uses)) == (46, 3710)
    assert sum(1 for count in uses if count == 1) == 10 and sum(1 for count in uses if count >= 10) == 33
    best = min(range(1, 9), key=lambda min_uses: wake_cost(uses, min_uses))
    assert best == EngineConfig().decode_graph_min_uses == 1
