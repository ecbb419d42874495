"""Simulated decode rollouts for the static decode plan: what its shapes read, and how many there are (no torch).

Why: a static step reads ``attention_positions`` of its shape's groups per layer, while its rows need only
their own positions; and every distinct shape is a CUDA graph to capture (time and memory, again at every
wake). Neither shows on CPU in wall time, so the plan's ladders are chosen and guarded on these counts.

Two simulations:

- ``Rollout``, for the ladders' reads: batches shaped like RL rollouts, a **sync** one (every row starts
  together and the batch shrinks as rows finish, no refill) and an **async** one (a finished row's slot takes a
  new request at once, so the rows' contexts spread over the whole range). Output lengths are long-tailed:
  exponential with a mean of ``MEAN_FRACTION`` of the cap, cut at the cap. Rows are ordered longest first, as
  the scheduler orders them by bucket (the plan depends on the order of the rows' levels only).
- ``RecipeRollout``, for the shapes a real step meets and what capturing them costs: a recipe-sized step's
  requests (more than the slots, so finished rows are refilled continuously) through the engine's own
  scheduler (``asyncrl.sim.decode_captures``), lengths from the simulator's lognormal length model. The sync
  ``Rollout`` above undercounts shapes several-fold: with refill the batch and its levels keep drifting.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

from asyncrl.config.sim import LengthConfig
from asyncrl.engine.decode_plan import attention_positions, batch_buckets, static_shape
from asyncrl.sim import decode_captures
from asyncrl.sim.workload import LengthModel

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


@dataclass(frozen=True)
class RecipeRollout:
    """One step's requests on one built-in engine, as a recipe sizes them: ``num_requests`` queued at once
    (a sync step's), prompts of ``prompt`` tokens, lognormal output lengths (mean ``mean_output``, log-space
    σ 1, the recipe plans' assumption: ``scripts/recipe_plans.py``) cut at ``max_new_tokens``."""

    num_requests: int
    num_slots: int
    prompt: int
    mean_output: float
    max_new_tokens: int
    max_model_len: int
    max_kv_tokens: int = 65536
    group: int = 1
    """Responses per prompt (request ids ``q{prompt}@{seed}#{index}``, as the simulator's)."""
    prompt_spread: float = 0.0
    """Each prompt's length drawn uniformly within ± this fraction of ``prompt`` (0: all ``prompt``, as the
    simulator's ``prompt_tokens``); a prompt's responses share it."""
    seed: int = 0

    def outputs(self) -> list[int]:
        lengths = LengthModel(LengthConfig(mean=self.mean_output), self.max_new_tokens, 0)
        return [lengths(f"q{i // self.group}@{self.seed}#{i % self.group}") for i in range(self.num_requests)]

    def prompts(self) -> list[int]:
        rng = random.Random(self.seed)
        own = [
            round(self.prompt * (1 + self.prompt_spread * rng.uniform(-1, 1)))
            for _ in range(-(-self.num_requests // self.group))
        ]
        return [own[i // self.group] for i in range(self.num_requests)]

    def shapes(self) -> list[decode_captures.Shape]:
        """Every decode step's static shape, in order."""
        return decode_captures.decode_shapes(
            self.prompts(),
            self.outputs(),
            num_slots=self.num_slots,
            max_model_len=self.max_model_len,
            max_kv_tokens=self.max_kv_tokens,
        )


RECIPES = {
    "gsm8k_1gpu": RecipeRollout(256, 44, 200, 600, 1280, 1536, group=8),
    "gsm8k_1gpu, prompts ±50 %": RecipeRollout(256, 44, 200, 600, 1280, 1536, group=8, prompt_spread=0.5),
    "gsm8k_1gpu eval": RecipeRollout(500, 44, 200, 600, 1280, 1536),
    "dapo-size built-in": RecipeRollout(1024, 64, 256, 2000, 8192, 9216, max_kv_tokens=64 * 9216, group=16),
}
"""The shipped built-in recipe's training step and evaluation (``asyncrl/examples/recipes/gsm8k_1gpu.yaml``:
32 prompts × 8, 44 slots, 1,536 context; eval 500 prompts; the recipe plan's 200-token prompts, and spread),
and the DAPO recipes' step (64 prompts × 16, 8,192 new tokens) on a built-in engine of 64 slots (they ship with
vLLM)."""

MIN_USES = (1, 2, 3, 4, 6)
"""``engine.decode_graph_min_uses`` values the policy table compares."""

SENSITIVITY = ((0.15, 3), (0.3, 3), (0.15, 5), (0.15, 8))
"""(replay ratio, capture cost in eager steps) pairs the policy table is modelled at: the probe's ratio,
the engine's eager decode alone, and captures dearer than the three eager runs they are made of."""

STEPS_WITHOUT_SWITCH = 30
"""gsm8k_1gpu training steps one engine serves, never sleeping, in the table without the switch."""


def policy_line(uses: list[int], replay_ratio: float, capture_steps: float) -> str:
    """Each of ``MIN_USES``' decode time over one wake, relative to capturing at first use."""
    first = decode_captures.wake_cost(uses, 1, replay_ratio, capture_steps)
    return "  ".join(
        f"{k}: {decode_captures.wake_cost(uses, k, replay_ratio, capture_steps) / first:.3f}"
        for k in MIN_USES
    )


def main() -> None:
    """Print the figures docs/backends.md records: the ladders' reads over sync and async rollouts at 64 and
    256 slots; then the shapes of recipe-sized steps with refill, and the capture policy's modelled cost."""
    print("rollout     slots  static/needed  shapes  max groups")
    for sync in (True, False):
        for slots in (64, 256):
            reads = static_reads(Rollout(slots, prompt=300, max_new_tokens=20480, sync=sync))
            kind = "sync" if sync else "async"
            print(f"{kind:10s} {slots:6d} {reads.ratio:14.2f} {reads.shapes:7d} {reads.max_groups:11d}")
    print("\nrecipe step with refill: decode steps, shapes, shapes run < 4 steps; per wake, decode time by")
    print(
        "engine.decode_graph_min_uses over capturing at first use (replay ratio r, capture cost C eager steps)"
    )
    for name, rollout in RECIPES.items():
        shapes = rollout.shapes()
        uses = decode_captures.uses_per_shape(shapes)
        rare = sum(1 for count in uses if count < 4)
        print(f"{name}: {len(shapes)} steps, {len(uses)} shapes, {rare} run < 4 steps")
        for ratio, capture in SENSITIVITY:
            print(f"  r {ratio}, C {capture}:  {policy_line(uses, ratio, capture)}")
    rollout = RECIPES["gsm8k_1gpu"]
    shapes = [s for seed in range(STEPS_WITHOUT_SWITCH) for s in replace(rollout, seed=seed).shapes()]
    uses = decode_captures.uses_per_shape(shapes)
    print(f"gsm8k_1gpu, {STEPS_WITHOUT_SWITCH} steps in one wake (no switch): {len(uses)} shapes")
    for ratio, capture in SENSITIVITY:
        print(f"  r {ratio}, C {capture}:  {policy_line(uses, ratio, capture)}")


if __name__ == "__main__":
    main()
