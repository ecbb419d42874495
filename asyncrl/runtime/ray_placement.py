"""Ray placement groups per role: every trainer rank and every engine gets a reserved bundle before it starts.

Each role asks for one bundle per actor — CPUs (its share from ``runtime.placement``), accelerators (whole
tensor-parallel sets in one bundle, so an engine's GPUs are on one node) and any custom node resources the
config names — in one placement group with the role's strategy (PACK keeps trainer ranks together for fast
collectives; SPREAD puts engine replicas on different nodes). Before anything is created the ask is checked
against the live nodes (``placement_check``), so an impossible placement fails in seconds with a
``PlacementError`` naming what was asked and what exists; a possible-looking one that Ray still cannot grant
fails the same way after ``placement_timeout_s``, never as a hang.

Colocated placements (``sync`` on CPU) reserve nothing: their actors share every core behind the mode's
barrier. Colocated on accelerators, trainer rank ``i`` and engine ``i`` share one bundle (``SHARED_ROLE``)
holding one accelerator, each actor taking half of it (Ray's fractional GPUs: both see the same device), so
the pair takes turns on one GPU behind the barrier; any other colocated ask on accelerators is refused,
naming why. Both stay resident on the device unless ``runtime.switch`` is on (every pair: the engine actor
sleeps and the rank actor offloads, ``ray_runtime.with_switch``; rank i publishes to engine i). ``layout_of`` says which layout was built
(``placement.json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from asyncrl.config.run import RunConfig
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.models.loading import resolve_device
from asyncrl.runtime.placement import Placement
from asyncrl.runtime.placement_check import (
    ENGINE_ROLE,
    TRAINER_ROLE,
    PlacementError,
    RoleBundles,
    check_placement,
    colocated_pairs,
    layout_of,
)

REWARD_ROLE = "reward"
"""The reward pool's CPUs: it runs in the driver (``rewards.service``), so its bundle is pinned to the driver's
node and holds no actor; reserving it keeps actors off those cores."""


def accelerators_per_actor(config: RunConfig, runtime: RuntimeConfig) -> tuple[float, float]:
    """(per trainer rank, per engine): the configured counts, or the defaults a CUDA model implies."""
    on_cuda = str(resolve_device(config.model.device)).startswith("cuda")  # auto: what this driver sees
    trainer = runtime.accelerators_per_trainer_worker
    if trainer is None:
        trainer = 1.0 if on_cuda else 0.0
    engine = runtime.accelerators_per_engine
    if engine is None:
        tensor_parallel = config.engine.vllm.tensor_parallel_size if config.engine.backend == "vllm" else 1
        engine = float(tensor_parallel) if on_cuda else 0.0
    return trainer, engine


def role_bundles(config: RunConfig, runtime: RuntimeConfig, placement: Placement) -> list[RoleBundles]:
    """The bundles each role asks for (pure: no Ray). Roles whose bundles would be empty ask for nothing."""
    trainer_accelerators, engine_accelerators = accelerators_per_actor(config, runtime)
    accelerator = runtime.accelerator_resource
    if placement.colocated and (trainer_accelerators or engine_accelerators):
        return [_shared_bundles(config, runtime, trainer_accelerators, engine_accelerators)]
    trainer = _bundle(
        placement.trainer_num_cpus, accelerator, trainer_accelerators, runtime.trainer_resources
    )
    engine = _bundle(placement.engine_num_cpus, accelerator, engine_accelerators, runtime.engine_resources)
    roles = []
    if trainer:
        roles.append(RoleBundles(role=TRAINER_ROLE, bundles=(trainer,) * config.trainer.num_workers))
    if engine:
        roles.append(RoleBundles(role=ENGINE_ROLE, bundles=(engine,) * config.rollout.num_engines))
    if runtime.reward_num_cpus > 0 and not placement.colocated:
        roles.append(RoleBundles(role=REWARD_ROLE, bundles=({"CPU": runtime.reward_num_cpus},)))
    return roles


def _shared_bundles(
    config: RunConfig, runtime: RuntimeConfig, trainer_accelerators: float, engine_accelerators: float
) -> RoleBundles:
    """Colocated on accelerators: trainer rank i and engine i share bundle i (``colocated_pairs``)."""
    return colocated_pairs(
        workers=config.trainer.num_workers,
        engines=config.rollout.num_engines,
        trainer_accelerators=trainer_accelerators,
        engine_accelerators=engine_accelerators,
        accelerator=runtime.accelerator_resource,
        extra={**runtime.trainer_resources, **runtime.engine_resources},
    )


def _bundle(
    num_cpus: float, accelerator: str, accelerators: float, extra: Mapping[str, float]
) -> dict[str, float]:
    wanted = {"CPU": num_cpus, accelerator: accelerators, **extra}
    return {name: amount for name, amount in wanted.items() if amount > 0}


@dataclass
class Reservation:
    """The placement groups of a run, by role; ``options(role, index)`` places an actor in its bundle."""

    groups: dict[str, PlacementGroup] = field(default_factory=dict)
    bundles: dict[str, tuple[Mapping[str, float], ...]] = field(default_factory=dict)
    layout: str = ""
    """Which layout was built (``layout_of``)."""

    def options(self, role: str, index: int, accelerator: str) -> dict[str, Any]:
        """Ray actor options for actor ``index`` of ``role``: its bundle's resources and scheduling strategy;
        nothing reserved (colocated): no CPUs."""
        if role not in self.groups:
            return {"num_cpus": 0}
        bundle = dict(self.bundles[role][index])
        options: dict[str, Any] = {
            "num_cpus": bundle.pop("CPU", 0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.groups[role], placement_group_bundle_index=index
            ),
        }
        if accelerator == "GPU" and "GPU" in bundle:
            options["num_gpus"] = bundle.pop("GPU")
        if bundle:
            options["resources"] = bundle
        return options

    def release(self) -> None:
        for group in {id(group): group for group in self.groups.values()}.values():  # a shared one once
            remove_placement_group(group)
        self.groups.clear()


def reserve(roles: list[RoleBundles], runtime: RuntimeConfig) -> Reservation:
    """Create one placement group per role and wait until Ray grants all of them (see module docstring)."""
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    driver_node = f"node:{ray.util.get_node_ip_address()}"  # every node carries its own address as a resource
    roles = [
        RoleBundles(role=r.role, bundles=tuple({**b, driver_node: 0.001} for b in r.bundles))
        if r.role == REWARD_ROLE
        else r
        for r in roles
    ]
    try:
        check_placement(roles, nodes)
    except PlacementError as refused:  # say which layout was refused, not only what it asked
        raise PlacementError(f"{layout_of(roles)} refused: {refused}") from None
    strategies = {
        TRAINER_ROLE: runtime.trainer_strategy,
        ENGINE_ROLE: runtime.engine_strategy,
        REWARD_ROLE: "PACK",
    }
    reservation = Reservation(layout=layout_of(roles))
    pending = {}
    for role in roles:
        group = placement_group(
            [dict(bundle) for bundle in role.bundles],
            strategy=strategies.get(role.role, runtime.trainer_strategy),  # shared: the trainer's (PACK)
        )
        pending[group.ready()] = role.role
        for name, bundles in (role.shares or {role.role: role.bundles}).items():
            reservation.groups[name] = group
            reservation.bundles[name] = bundles
    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=runtime.placement_timeout_s)
    if len(ready) < len(pending):
        waiting = sorted(name for ref, name in pending.items() if ref not in ready)
        reservation.release()
        asked = "; ".join(f"{r.role}: {len(r.bundles)} x {dict(r.bundles[0])}" for r in roles)
        raise PlacementError(
            f"Ray did not grant the placement of {', '.join(waiting)} within {runtime.placement_timeout_s} s "
            f"(asked: {asked}; strategies: trainer {runtime.trainer_strategy}, engines "
            f"{runtime.engine_strategy}); the cluster has {len(nodes)} node(s): {[dict(n) for n in nodes]}"
        )
    return reservation
