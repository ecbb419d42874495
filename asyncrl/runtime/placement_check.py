"""Fail fast, by name, when a cluster cannot hold the placement a run asks for.

Ray waits forever for a placement group it cannot satisfy; a run that hangs at start-up tells the user nothing.
Before any group is created, the bundles each role asks for (engines with their tensor-parallel GPUs reserved
together, trainer ranks, reward workers) are checked against the nodes that exist, and a shortfall raises
``PlacementError`` naming what was asked and what each node has. No ray import: the nodes come in as data
(``ray.nodes()``' ``Resources`` maps), so the check is unit-tested exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class PlacementError(RuntimeError):
    """The cluster cannot satisfy the requested placement; the message names the ask and what exists."""


@dataclass(frozen=True, kw_only=True)
class RoleBundles:
    """The bundles one role asks for, each of which must fit on a single node."""

    role: str
    """Role name in messages, e.g. ``engines``, ``trainer``, ``reward``."""
    bundles: tuple[Mapping[str, float], ...]
    """One resource map per bundle (an engine with tensor_parallel_size=2 on CUDA asks ``{"GPU": 2, "CPU": 1}``)."""
    shares: Mapping[str, tuple[Mapping[str, float], ...]] = field(default_factory=dict)
    """Roles whose actors share these bundles (colocated on accelerators): role → what its actor ``i`` takes
    of bundle ``i`` (a fraction of its accelerator). Empty: the role's own actors fill the bundles."""


def check_placement(roles: Sequence[RoleBundles], nodes: Sequence[Mapping[str, float]]) -> None:
    """Raise ``PlacementError`` when the placement surely cannot fit: a bundle larger than every node, or roles
    that together ask more of a resource than the whole cluster has.

    These are necessary conditions only, so a valid placement is never refused; a placement that passes them
    but still cannot be packed is left to Ray's ``placement_group(...).wait(timeout)`` as the backstop.
    """
    for role in roles:
        for bundle in role.bundles:
            if not any(all(n.get(k, 0.0) >= v for k, v in bundle.items()) for n in nodes):
                _refuse(f"no node holds a {role.role} bundle {dict(bundle)}", roles, nodes)
    asked: dict[str, float] = {}
    for role in roles:
        for bundle in role.bundles:
            for key, amount in bundle.items():
                asked[key] = asked.get(key, 0.0) + amount
    for key, amount in asked.items():
        have = sum(n.get(key, 0.0) for n in nodes)
        if amount > have:
            _refuse(f"the roles ask for {amount:g} {key} in all, the cluster has {have:g}", roles, nodes)


def _refuse(reason: str, roles: Sequence[RoleBundles], nodes: Sequence[Mapping[str, float]]) -> None:
    raise PlacementError(
        f"{reason}: asked for {_describe(roles)}; the cluster has {len(nodes)} node(s): {[dict(n) for n in nodes]}"
    )


def _describe(roles: Sequence[RoleBundles]) -> str:
    return "; ".join(f"{r.role}: {len(r.bundles)} x {[dict(b) for b in r.bundles][:1]}" for r in roles)


TRAINER_ROLE = "trainer"
ENGINE_ROLE = "engines"
SHARED_ROLE = "colocated"
"""Bundles a trainer rank and an engine share (colocated on accelerators)."""


def colocated_pairs(
    *,
    workers: int,
    engines: int,
    trainer_accelerators: float,
    engine_accelerators: float,
    accelerator: str,
    extra: Mapping[str, float] | None = None,
) -> RoleBundles:
    """Colocated on accelerators: one bundle per (trainer rank, engine) pair holding one accelerator, half to
    each actor (Ray's fractional GPUs: both see the same device); a ``PlacementError`` naming the fields for
    any colocated ask this layout cannot hold. Pure, so ``asyncrl plan`` asks the same check."""
    why = ""
    if (trainer_accelerators, engine_accelerators) != (1.0, 1.0):
        why = (
            f"one accelerator per trainer rank and per engine (got accelerators_per_trainer_worker="
            f"{trainer_accelerators:g}, accelerators_per_engine={engine_accelerators:g}; a tensor-parallel "
            "engine over several ranks' devices is not built)"
        )
    elif workers != engines:
        why = f"as many engines as trainer ranks (got rollout.num_engines={engines}, trainer.num_workers={workers})"
    if why:
        raise PlacementError(
            f"colocated rollout and training on accelerators pairs engine i with trainer rank i on one device "
            f"and needs {why}; or set runtime.colocate: never"
        )
    half = ({accelerator: 0.5},) * workers
    return RoleBundles(
        role=SHARED_ROLE,
        bundles=({accelerator: 1.0, **(extra or {})},) * workers,
        shares={TRAINER_ROLE: half, ENGINE_ROLE: half},
    )


def layout_of(roles: Sequence[RoleBundles]) -> str:
    """Which layout ``roles`` build, in words (``placement.json``, refusals, ``asyncrl plan``)."""
    if not roles:
        return "colocated on CPU: nothing reserved, every actor shares the cores behind the mode's barrier"
    shared = [role for role in roles if role.shares]
    if shared:
        return (
            f"colocated on accelerators: {len(shared[0].bundles)} shared bundle(s) {dict(shared[0].bundles[0])}, "
            f"trainer rank i and engine i each taking {dict(shared[0].shares[TRAINER_ROLE][0])} of bundle i"
        )
    return "separate: " + "; ".join(f"{r.role} {len(r.bundles)} x {dict(r.bundles[0])}" for r in roles)
