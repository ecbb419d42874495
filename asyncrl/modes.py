"""The one table of training paradigms: every part that depends on ``controller.mode`` reads ``MODE_SPECS``.

Config validation (``RunConfig`` and ``SimConfig``), the proxy factory, the controller, ``asyncrl simulate``,
``asyncrl plan`` and the table in docs/modes.md (checked by a test) all read it, so a mode is described once and
an illegal combination is the same ``ModeError`` everywhere.

Key decision: a mode that fixes the async ratio α (``sync`` at 0, ``one_step_off`` at 1) *rejects* any other
``buffer.async_ratio``; the simulator used to replace it silently. The error won because a silently ignored
setting is the failure users of RL frameworks complain about most (a sweep over α under ``sync`` measured
nothing and said nothing). Code that varies the mode on purpose (a ``--sweep controller.mode=...``, ``plan``)
asks ``async_ratio_for(mode, alpha)`` for the α the mode runs at, so the config it builds is legal.

Pure data importing only the standard library, on the ground floor beside ``types`` and ``config``: config
validation reads it without importing anything above itself (the layering test fails on any package cycle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class ModeError(ValueError):
    """A setting contradicts what ``controller.mode`` fixes (async ratio, update policy). Config loading
    re-raises it as a ``ConfigError`` with the same message (``from_dict`` wraps every ``ValueError``)."""


@dataclass(frozen=True, kw_only=True)
class ModeSpec:
    """What one paradigm fixes; the rest of the run follows from it."""

    name: str
    """The value of ``controller.mode``."""
    min_async_ratio: float
    """Smallest ``buffer.async_ratio`` the mode accepts."""
    max_async_ratio: float
    """Largest ``buffer.async_ratio`` the mode accepts (``math.inf``: any)."""
    barrier: str
    """What waits for what (the docs table's column)."""
    partial_rollouts: bool
    """Weights change mid-generation; a trajectory may span several versions, recorded per token."""
    multi_version: bool
    """Engines serve several versions at once (the orchestrator replaces the LLMProxy), and a batch waits for
    older admitted groups still generating (no admitted group is trained stale)."""
    update_policy: str
    """How engines take new weights: ``drain``, ``in_flight`` or ``multi_version`` (see ``config/proxy.py``)."""
    sample_age: str
    """Bound on a trained sample's policy age (the docs table's column)."""
    versions_per_trajectory: str
    """How many weight versions one trajectory may see (the docs table's column)."""

    @property
    def rollout_overlaps_training(self) -> bool:
        """Whether rollout may run while the trainer trains (any α > 0): if not, the two can share devices
        behind the mode's barrier (``runtime.colocate: auto`` colocates them)."""
        return self.max_async_ratio > 0

    @property
    def fixed_async_ratio(self) -> float | None:
        """The α the mode fixes, or None when it takes ``buffer.async_ratio`` as given."""
        return self.min_async_ratio if self.min_async_ratio == self.max_async_ratio else None

    def check_async_ratio(self, async_ratio: float) -> None:
        """Raise ``ModeError`` naming both fields when ``async_ratio`` is outside the mode's range."""
        if self.min_async_ratio <= async_ratio <= self.max_async_ratio:
            return
        raise ModeError(
            f"controller.mode={self.name!r} needs buffer.async_ratio={self.min_async_ratio:g}, got "
            f"{async_ratio:g} (use mode 'async' for other ratios)"
        )

    def check_update_policy(self, update_policy: str | None) -> None:
        """Raise ``ModeError`` when an explicit ``proxy.update_policy`` contradicts the mode (None follows it)."""
        if update_policy is not None and update_policy != self.update_policy:
            raise ModeError(
                f"controller.mode={self.name!r} needs proxy.update_policy={self.update_policy!r} (or null), "
                f"got {update_policy!r}"
            )


_ANY = math.inf
MODE_SPECS: dict[str, ModeSpec] = {
    spec.name: spec
    for spec in (
        ModeSpec(
            name="sync",
            min_async_ratio=0.0,
            max_async_ratio=0.0,
            barrier="rollout and training alternate; admission of batch k+1 opens only when the trainer "
            "reaches version k+1",
            partial_rollouts=False,
            multi_version=False,
            update_policy="drain",
            sample_age="0",
            versions_per_trajectory="1",
        ),
        ModeSpec(
            name="one_step_off",
            min_async_ratio=1.0,
            max_async_ratio=1.0,
            barrier="batch k+1 generates while batch k trains; the trainer waits for batch k+1 only if "
            "rollout is slower",
            partial_rollouts=False,
            multi_version=False,
            update_policy="drain",
            sample_age="≤ 1",
            versions_per_trajectory="1",
        ),
        ModeSpec(
            name="async",
            min_async_ratio=0.0,
            max_async_ratio=_ANY,
            barrier="rollout never waits except on the freshness bound (admission control); training waits "
            "only for a full batch",
            partial_rollouts=False,
            multi_version=False,
            update_policy="drain",
            sample_age="≤ ⌊α⌋",
            versions_per_trajectory="1",
        ),
        ModeSpec(
            name="partial_rollout",
            min_async_ratio=0.0,
            max_async_ratio=_ANY,
            barrier="as `async`, but a weight update lands mid-generation: engines pause, load the weights, "
            "resume the same requests",
            partial_rollouts=True,
            multi_version=False,
            update_policy="in_flight",
            sample_age="≤ ⌊α⌋, by start version",
            versions_per_trajectory="several, recorded per token (non-decreasing)",
        ),
        ModeSpec(
            name="multi_version",
            min_async_ratio=0.0,
            max_async_ratio=_ANY,
            barrier="engines serve up to ⌊α⌋ + 1 versions at once; a new version starts serving only when no "
            "request older than v − ⌊α⌋ is running; new prompts go to the newest version",
            partial_rollouts=False,
            multi_version=True,
            update_policy="multi_version",
            sample_age="≤ ⌊α⌋",
            versions_per_trajectory="1",
        ),
    )
}
MODES = tuple(MODE_SPECS)
"""The values ``controller.mode`` accepts, in the order the docs list them."""


def mode_spec(mode: str) -> ModeSpec:
    """The spec of ``mode``; ``ModeError`` naming the allowed values for an unknown one."""
    spec = MODE_SPECS.get(mode)
    if spec is None:
        raise ModeError(f"controller.mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return spec


def check_mode(mode: str, *, async_ratio: float, update_policy: str | None) -> None:
    """Every rule the mode imposes on the rest of a config; ``ModeError`` on the first broken one."""
    spec = mode_spec(mode)
    spec.check_async_ratio(async_ratio)
    spec.check_update_policy(update_policy)


def async_ratio_for(mode: str, async_ratio: float) -> float:
    """The α ``mode`` runs at when ``async_ratio`` is asked for: the mode's fixed α, else ``async_ratio``.

    For callers that vary the mode on purpose and must build a legal config (sweeps, ``plan``, tests)."""
    fixed = mode_spec(mode).fixed_async_ratio
    return async_ratio if fixed is None else fixed


def modes_table_markdown() -> str:
    """The table of docs/modes.md ("What each mode guarantees"), rendered from ``MODE_SPECS``."""
    rows = [
        "| mode | α | what waits for what | age of a trained sample | versions in one trajectory | engine update |",
        "|---|---|---|---|---|---|",
    ]
    for spec in MODE_SPECS.values():
        fixed = spec.fixed_async_ratio
        alpha = "any α ≥ 0" if fixed is None else f"{fixed:g} (fixed)"
        update = (
            "orchestrator (`asyncrl/proxy/multi_version.py`)"
            if spec.multi_version
            else f"`{spec.update_policy}`"
        )
        rows.append(
            f"| `{spec.name}` | {alpha} | {spec.barrier} | {spec.sample_age} | {spec.versions_per_trajectory} "
            f"| {update} |"
        )
    return "\n".join(rows)
