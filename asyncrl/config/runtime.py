"""Configuration of the runtime: where the roles live (one process, or Ray actors) and their CPU shares.

Key decision on colocation: ``sync`` alternates rollout and training behind a barrier, so there both roles are
*colocated*: their actors reserve no Ray CPUs and each gets threads for every core (the trainer all of them,
each engine its share of all but one, which the driver needs while the engines generate: see
``driver_cpus``), relying on the barrier so that they never compute at once. Async
modes give rollout and training disjoint shares (``rollout_num_cpus`` / ``train_num_cpus``), so neither slows
the other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from asyncrl.config.deadlines import bytes_deadline_s

RUNTIME_TYPES = ("inline", "local", "cluster")
COLOCATE_CHOICES = ("auto", "always", "never")
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_POSITIVE_FIELDS = (
    "rollout_num_cpus",
    "train_num_cpus",
    "startup_timeout_s",
    "control_timeout_s",
    "generate_timeout_s",
    "train_step_timeout_s",
    "placement_timeout_s",
    "checkpoint_timeout_floor_s",
    "checkpoint_timeout_gbps",
)


@dataclass(frozen=True, kw_only=True)
class SwitchConfig:
    """Colocated sync on one device (``runtime.switch``): the engine and the trainer take turns on it, each
    giving the device back while the other works. Each phase is timed (metrics ``colocate/*``)."""

    enabled: bool = False
    """Sleep the engines while the trainer trains and offload the trainer's state while they generate.
    Needs ``controller.mode: sync`` (the only mode whose rollout never overlaps training) and the built-in
    engine; inline, or on Ray one engine per trainer rank (rank i and engine i sharing bundle i on
    accelerators, rank i publishing to engine i); weights then travel by ``weight_sync.type: colocated``
    (``auto`` picks it)."""
    engine_sleep_level: int = 1
    """1: a sleeping engine frees its KV pool. 2: it also moves its weights to host memory."""
    offload_optimizer: bool = True
    """Move the optimizer state (Adam's moments) to host memory while the engines generate."""
    offload_master_weights: bool = False
    """The same for the trainer's own weights (its master copy), after they were published to the engines."""
    offload_reference: bool = True
    """The same for the frozen reference model (the trainer's copy of the policy for ``loss.kl``, held with
    ``loss.kl.beta`` > 0 and no LoRA; with LoRA the reference is the policy's own base, and nothing more moves).
    On by default because it is safe: the reference is read at one point only, the reference log-probs at the
    start of a step, after the switch reloaded it; no publication, checkpoint or catch-up pack reads it (they
    reload the trainer's state without it), and the round trip is bit for bit, so no result changes. What it
    costs is one host round trip of its bytes per step (each rank its shard) and as much pinned host memory;
    in exchange the engine's KV pool gets them while it generates (Qwen3-8B in bf16: 16 GB on one GPU). Off
    where host memory is short."""

    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "offload_grads": (
            "the trainer frees its gradients after every optimizer step, so none are held while the engines "
            "generate and there is nothing to offload"
        ),
    }
    """Keys older configs may still carry, each with why it went (``config.base.unknown_key_error``)."""

    def __post_init__(self) -> None:
        if self.engine_sleep_level not in (1, 2):
            raise ValueError(
                f"runtime.switch.engine_sleep_level must be 1 or 2, got {self.engine_sleep_level}"
            )


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Where the trainer and the engine replicas run, with which resources and how long calls may take."""

    type: Literal["inline", "local", "cluster"] = "inline"
    """inline: every part in this process (tests, debugging). local: one Ray actor per role on this machine,
    Ray started in-process (no external service). cluster: the same actors on an existing Ray cluster at
    ``address``."""
    address: str = ""
    """Address of the existing Ray cluster (``type: cluster`` only), e.g. ``ray://head:10001`` or ``auto``."""
    rollout_num_cpus: float | None = None
    """CPUs of the rollout role, split evenly over the engine replicas: each engine reserves its share
    as a Ray resource and runs torch with that many threads (at least 1). null: what ``train_num_cpus``
    leaves of this machine's usable cores (at least 1; on a ``cluster`` runtime, 1)."""
    train_num_cpus: float | None = None
    """CPUs of the trainer: its Ray resource and its torch threads (at least 1). null: half of this
    machine's usable cores, rounded down (at least 1; on a ``cluster`` runtime, 1)."""
    colocate: Literal["auto", "always", "never"] = "auto"
    """auto: colocate rollout and training when they never overlap: ``sync``, or any mode at
    ``buffer.async_ratio`` 0 (module docstring); always / never force it."""
    driver_cpus: float = 1.0
    """Colocated (``sync``) placement only: the cores the engines leave to the driver while they generate
    (reward scoring, detokenizing, scheduling); each engine gets ``(cores - driver_cpus) / num_engines``
    threads (at least 1). 1 was measured faster on 2 cores (asyncrl/runtime/placement.py); 0 gives the engines
    every core, which a tuned sync may prefer elsewhere (bench/long_tail.py sweeps both)."""
    pin_cores: bool = False
    """When rollout and training are not colocated, pin the trainer and each engine actor to disjoint cores
    (``os.sched_setaffinity``), so a loaded machine cannot make them share a core (runtime/placement.py)."""
    accelerator_resource: str = "GPU"
    """Ray resource an accelerator is counted in. ``GPU`` on a real cluster; a custom name (``fake_gpu``) lets a
    CPU-only test cluster stand in for one and check where each role lands."""
    accelerators_per_trainer_worker: float | None = None
    """Accelerators each trainer rank reserves; null: 1 when ``model.device`` is CUDA, else 0."""
    accelerators_per_engine: float | None = None
    """Accelerators each engine reserves, all in one bundle so they sit on one node (tensor parallelism);
    null: ``engine.vllm.tensor_parallel_size`` for vLLM on CUDA, 1 for the built-in engine on CUDA, else 0."""
    trainer_resources: dict[str, float] = field(default_factory=dict)
    """Extra Ray resources each trainer rank's bundle asks for: a custom node resource (``{trainer_node: 1}``)
    pins the trainer to the nodes that carry it."""
    engine_resources: dict[str, float] = field(default_factory=dict)
    """The same for each engine's bundle (``{rollout_node: 1}``)."""
    trainer_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """Ray placement-group strategy of the trainer ranks' bundles: PACK keeps ranks together (fast
    collectives), SPREAD places them on as many nodes as it can."""
    engine_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """The same for the engines' bundles; SPREAD puts replicas on different nodes."""
    reward_num_cpus: float = 0.0
    """CPUs reserved on the driver's node for the reward pool (``reward.executor`` / ``max_workers`` run
    there, beside the controller), so no actor is placed on them; 0 reserves none."""
    placement_timeout_s: float = 60.0
    """Longest the cluster may take to grant the placement groups; past it the run fails with a named
    ``PlacementError`` (an ask larger than the cluster is refused at once, before waiting)."""
    startup_timeout_s: float = 300.0
    """Longest an actor may take to start and load its model (the model's files are in the cache by then: the
    driver resolves them before any actor starts). A vLLM engine actor gets at least
    ``engine.vllm.startup_timeout_s`` plus a minute for its own start, the engine's deadline naming the cause."""
    control_timeout_s: float = 120.0
    """Longest an actor may take to answer a short call (pause, resume, abort, stats, offload); past it the
    call fails with a timeout naming the actor. An engine's weight update and a trainer checkpoint have
    deadlines sized by their bytes instead (``proxy.update_timeout_floor_s``, ``checkpoint_timeout_floor_s``)."""
    checkpoint_timeout_floor_s: float = 120.0
    """A trainer checkpoint's save or load (Ray runtimes) may take this floor plus the checkpoint's bytes at
    ``checkpoint_timeout_gbps``; past it the call fails with ``TrainerDied`` naming it, and the run restarts
    from its last verified checkpoint (``trainer_restarts``). The bytes are an upper bound the trainer ranks
    take from the model's parameters when they start: the weights and AdamW's two moments in the master dtype,
    plus the Hugging Face export in the serving dtype (a sharded checkpoint's ``model/``), plus a critic's
    weights and moments; with LoRA the whole model is counted all the same (a longer deadline, never a
    shorter one). Checkpoints are not short calls: Qwen3-8B on 8 ranks writes about 115 GB, then fsyncs and
    hashes every file, far past ``control_timeout_s``. The trainer ranks' process group waits at least this
    long in a collective (``runtime.trainer_group.collective_timeout_s``): ranks that are done wait in one for
    the slowest (rank 0 also writes the export and the state files). Inline runs call the trainer in process:
    there only a load's hashing of the checkpoint runs under this deadline (checked between reads, failing with
    ``CheckpointTimeout``); their saves have none."""
    checkpoint_timeout_gbps: float = 0.2
    """The conservative bandwidth (GB/s) a checkpoint's deadline assumes for writing, fsyncing and hashing it:
    at 0.2, Qwen3-8B with fp32 masters on 8 ranks (about 115 GB) gets 120 + 573 s. A checkpoint slower than
    this is taken for a hung trainer: lower it for a slow filesystem rather than raising the floor."""
    generate_timeout_s: float = 3600.0
    """Longest one generate call may stay on an engine actor before it is cancelled (request aborted there)
    and fails with a timeout naming the engine: a hung but live actor never blocks the run forever."""
    train_step_timeout_s: float = 3600.0
    """Longest one train step may take on the trainer actor."""
    switch: SwitchConfig = field(default_factory=SwitchConfig)
    """Colocated sync with engines that sleep and a trainer that offloads (``SwitchConfig``)."""
    trainer_restarts: int = 2
    """Times a run whose trainer actor died (or stopped answering) starts again from its last verified
    checkpoint, every actor anew, exactly as ``resume=`` would; 0: the run fails. Needs
    ``trainer.checkpoint_every`` > 0 to have a checkpoint to go back to."""

    def __post_init__(self) -> None:
        if self.type not in RUNTIME_TYPES:
            raise ValueError(
                f"runtime.type must be one of {', '.join(map(repr, RUNTIME_TYPES))}, got {self.type!r}"
            )
        if (self.type == "cluster") != bool(self.address):
            raise ValueError(
                f"runtime.address is required for runtime.type 'cluster' and only then, got type {self.type!r} "
                f"and address {self.address!r}"
            )
        if self.colocate not in COLOCATE_CHOICES:
            raise ValueError(
                f"runtime.colocate must be one of {', '.join(map(repr, COLOCATE_CHOICES))}, got {self.colocate!r}"
            )
        if self.trainer_restarts < 0:
            raise ValueError(f"runtime.trainer_restarts must be >= 0, got {self.trainer_restarts}")
        for name in ("trainer_strategy", "engine_strategy"):
            if getattr(self, name) not in STRATEGIES:
                raise ValueError(
                    f"runtime.{name} must be one of {', '.join(map(repr, STRATEGIES))}, got {getattr(self, name)!r}"
                )
        for name in ("accelerators_per_trainer_worker", "accelerators_per_engine"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"runtime.{name} must be >= 0 or null, got {getattr(self, name)}")
        if self.driver_cpus < 0:
            raise ValueError(f"runtime.driver_cpus must be >= 0, got {self.driver_cpus}")
        if self.reward_num_cpus < 0:
            raise ValueError(f"runtime.reward_num_cpus must be >= 0, got {self.reward_num_cpus}")
        for name in ("trainer_resources", "engine_resources"):
            for key, amount in getattr(self, name).items():
                if amount <= 0:
                    raise ValueError(f"runtime.{name}.{key} must be > 0, got {amount}")
        for name in _POSITIVE_FIELDS:
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"runtime.{name} must be > 0, got {getattr(self, name)}")

    def checkpoint_timeout_s(self, nbytes: int) -> float:
        """The deadline of a trainer checkpoint's save or load of ``nbytes`` bytes (``checkpoint_timeout_floor_s``)."""
        return bytes_deadline_s(self.checkpoint_timeout_floor_s, self.checkpoint_timeout_gbps, nbytes)

    def cpu_shares(self, usable_cores: int | None = None) -> tuple[float, float]:
        """(rollout, train) CPUs with the nulls resolved: the two roles split ``usable_cores`` (default:
        this process's affinity) the way the seeds split devices, the trainer taking the smaller half; a set
        share keeps its value and the other takes what is left. A ``cluster``'s cores are not this
        machine's, so there a null is 1."""
        if self.type == "cluster":
            return (self.rollout_num_cpus or 1.0, self.train_num_cpus or 1.0)
        cores = usable_cores if usable_cores is not None else usable_core_count()
        rollout, train = self.rollout_num_cpus, self.train_num_cpus
        if train is None:
            train = float(max(1, cores - rollout if rollout is not None else cores // 2))
        if rollout is None:
            rollout = float(max(1, cores - train))
        return (rollout, train)


def usable_core_count() -> int:
    """Cores this process may run on (its affinity where the OS has one, else every core)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
