"""The built-in engine's KV pool against what its admission can ever use and what the engine lets itself
allocate (``asyncrl doctor``'s ``engine kv pool`` line).

Key decisions:
- The engine preallocates ``engine.max_running_requests`` slots of min(``max_model_len``, ``max_kv_tokens``) + 1
  positions (``engine.kv_cache``), while admission runs a request only when its reservation, min(prompt +
  max_new_tokens, ``max_model_len``), fits what is left of ``engine.max_kv_tokens`` (``engine.admission``). So
  at most ``max_kv_tokens // reservation`` slots ever hold a request; the rest are memory spent for nothing.
- "Ever" is taken strictly: the least any request reserves is a one-token prompt plus the shortest
  ``max_new_tokens`` it may ask for (the rollout's, and each evaluation set's), capped at the slot's positions.
  Real prompts are longer, so fewer run at once than this count: a slot past it is idle for certain, one
  below it may be idle too. An external producer's requests set their own lengths: no count then.
- The engine refuses, before allocating, a pool above ``KV_POOL_SHARE`` (90 %) of what its device has free
  once its weights are loaded (``llm_engine.check_kv_pool_fits``); on a GPU of its own that is the GPU's
  usable bytes less what the engine role holds beside its pool (weights, adapters). A GPU shared with a
  trainer has less free: its device lines count both.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.app.memory_plan import HELD, KV_POOL_SHARE, Hardware, Role, max_kv_positions
from asyncrl.config.run import RunConfig


@dataclass(frozen=True)
class SlotUse:
    """One built-in engine's slots, what they take, and how many of them admission can ever fill."""

    slots: int
    positions: int
    """Positions a slot holds (the scratch position included)."""
    slot_bytes: int
    reservation: int
    """The least KV a request reserves (module docstring)."""
    admitted: int | None
    """The most requests ``max_kv_tokens`` admits at once; None where request lengths are not known ahead
    (external producers) or the plan has no context length."""
    allowed: int
    """The largest pool the engine allocates on a GPU of its own (module docstring)."""

    @property
    def pool(self) -> int:
        return self.slots * self.slot_bytes

    @property
    def idle(self) -> int:
        """Slots no request can ever fill."""
        return 0 if self.admitted is None else max(0, self.slots - self.admitted)

    @property
    def idle_bytes(self) -> int:
        return self.idle * self.slot_bytes


def slot_use(config: RunConfig, engine: Role, hardware: Hardware, max_len: int) -> SlotUse:
    """``engine`` (``memory_plan.engine_role`` of a built-in engine) on ``hardware``, ``max_len`` the run's
    longest context, as ``memory_plan.plan`` was given it."""
    slots = config.engine.max_running_requests
    positions = max_kv_positions(config, max_len)
    pool = next(t.bytes for t in engine.terms if t.name == "KV pool")
    beside = engine.phase_bytes(HELD) - pool
    reservation = min(1 + shortest_new_tokens(config), positions)
    # no positions (a plan without the run's context length): nothing to count admissions against
    unknown = config.producer == "external" or reservation < 1
    admitted = None if unknown else config.engine.max_kv_tokens // reservation
    allowed = max(0, int(KV_POOL_SHARE * (hardware.usable_bytes - beside)))
    return SlotUse(slots, positions + 1, pool // slots, reservation, admitted, allowed)


def shortest_new_tokens(config: RunConfig) -> int:
    """The fewest new tokens any request of the run asks for: the rollout's, or an evaluation set's."""
    sets = [s.max_new_tokens for s in config.controller.eval_sets if s.max_new_tokens is not None]
    return min([config.rollout.max_new_tokens, *sets])
