"""Ray placement groups per role: every trainer rank and every engine gets a reserved bundle before it starts.

Each role asks for one bundle per actor — CPUs (its share from ``runtime.placement``), accelerators (whole
tensor-parallel sets in one bundle, so an engine's GPUs are on one node) and any custom node resources the
config names — in one placement group with the role's strategy (PACK keeps trainer ranks together for fast
collectives; SPREAD puts engine replicas on different nodes). Before anything is created the ask is checked
against the live nodes (``placement_check``), so an impossible placement fails in seconds with a
``PlacementError`` naming what was asked and what exists; a possible-looking one that Ray still cannot grant
fails the same way after ``placement_timeout_s``, never as a hang.

Colocated placements (``sync`` on CPU) reserve nothing: their actors share every core behind the mode's
barrier. Colocating on accelerators would need the engines to release device memory while the trainer runs;
that is not built, and asking for it is an error that says so.
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
from asyncrl.runtime.placement_check import PlacementError, RoleBundles, check_placement

TRAINER_ROLE = "trainer"
ENGINE_ROLE = "engines"
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
    if placement.colocated and (trainer_accelerators or engine_accelerators):
        raise PlacementError(
            "colocated rollout and training on accelerators is not supported (engines would have to free "
            "device memory while the trainer runs); set runtime.colocate: never"
        )
    accelerator = runtime.accelerator_resource
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
        for group in self.groups.values():
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
    check_placement(roles, nodes)
    strategies = {
        TRAINER_ROLE: runtime.trainer_strategy,
        ENGINE_ROLE: runtime.engine_strategy,
        REWARD_ROLE: "PACK",
    }
    reservation = Reservation()
    for role in roles:
        reservation.groups[role.role] = placement_group(
            [dict(bundle) for bundle in role.bundles], strategy=strategies[role.role]
        )
        reservation.bundles[role.role] = role.bundles
    pending = {group.ready(): name for name, group in reservation.groups.items()}
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
