"""``asyncrl plan``'s memory filter: each candidate layout planned by ``app.memory_plan`` (the plan ``asyncrl
doctor --hardware`` prints), and dropped when a GPU it occupies, or a node's host RAM, does not hold it.

Key decisions:
- A candidate stands for a ``RunConfig``: the training config ``memory.train_config`` names (its model dtype,
  trainer, loss, critic, LoRA, engine and switch; the simulation runs its engine too, ``sim.run_engine``), else
  ``memory``'s documented defaults with the engine the simulation runs (``kv: paged``: vLLM at
  ``memory_utilization`` with ``max_num_seqs``; ``reserved``: the built-in engine with the simulated engine's
  slots, min(``max_num_seqs``, the KV that fits // one longest context): ``sim.derive.reserved_slots``, so the
  pool planned is the one that engine would preallocate, and every slot of it is one admission can fill). The
  candidate sets the layout: trainer ranks (FSDP2 shards), engines and their tensor parallelism. The longest
  context is the workload's, ``prompt_tokens + rollout.max_new_tokens``. ``engine_keys`` says that engine as
  ``asyncrl train`` keys (``asyncrl plan`` prints them).
- A separate critic is planned at the shape the simulator costs its time at (``sim.trained.trained_parts``:
  the training config's ``critic.model_path``, else ``memory.critic_model``, else the policy's), resolved once.
- A split candidate's GPUs are the doctor's: each trainer GPU, each engine GPU. A colocated one shares each GPU
  between a trainer rank and an engine taking turns (``memory_plan.switch_devices``: one device per phase, the
  candidate dropped if any phase overflows), with the switch the
  simulator costs: the training config's ``runtime.switch``, else ``cost.switch_offload_bytes_per_param`` (8:
  AdamW's moments leave the GPU while the engine generates; 12: the master weights too; gradients never stay
  between steps, so nothing more; a separate critic's with the policy's) and ``cost.switch_sleep_level`` (1: a sleeping engine keeps its weights;
  2: nothing).
- A node's host RAM is planned as doctor's host line plans it (``memory_plan.host_plan``, with the same switch
  for a colocated candidate): offloaded trainer state, weights asleep, staged updates, vLLM's bucket files and
  Ray's object store, against the profile's ``host_memory_bytes`` (2 TB for the named ones) or ``--host-gb``.
- A candidate is dropped on the doctor's FAIL (a GPU's plan over what ``DEVICE_RESERVE`` leaves, vLLM's share
  short of its weights and one longest request's KV, a built-in engine's pool above what the engine itself
  allocates, ``app.kv_slots``, or a node's host plan over its RAM), never on a WARN: the
  plan leaves out fragmentation, so a plan within 10 % of full is kept and the margin is the user's to judge
  with ``asyncrl doctor``.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.app import kv_slots, memory_plan
from asyncrl.app.memory_plan import GB, Device, Hardware
from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.config.runtime import SwitchConfig
from asyncrl.config.sim import SimConfig, SimCostConfig
from asyncrl.sim.critic_shape import CriticShape
from asyncrl.sim.hardware import resolve_profile
from asyncrl.sim.model_shape import ModelShape, resolve_shape
from asyncrl.sim.trained import trained_parts

SWITCH_OFFLOAD_BYTES = {"offload_optimizer": 8, "offload_master_weights": 12}
"""``cost.switch_offload_bytes_per_param`` from which each ``runtime.switch`` offload is on (the key's
docstring: 8 is AdamW's two fp32 moments, 12 adds the master weights; the 16 of a system that offloads
gradients too has no switch key here: asyncrl's trainer frees them after every step). Memory really freed: each
rank's offload frees its own shards of them in place, FSDP2's all-gather buffers included (``trainer.offload``;
checked over gloo ranks, not on a GPU). ``offload_reference`` keeps its default (on): a candidate planned from
``memory``'s keys has no KL loss, so no reference copy; a training config's own switch is planned as written."""


@dataclass(frozen=True)
class Drop:
    """Why a candidate does not fit: the GPU (or node's host RAM) that overflows, what it needs and holds, and
    its largest term."""

    device: str
    need: int
    usable: int
    role: str
    term: str
    term_bytes: int

    def text(self, hardware: str) -> str:
        return (
            f"{self.device} needs {self.need / GB:.1f} GB, {self.usable / GB:.1f} GB usable on {hardware}; "
            f"largest term: {self.role}'s {self.term} {self.term_bytes / GB:.1f} GB"
        )


@dataclass(frozen=True)
class Layout:
    """What memory depends on in a candidate: trainer ranks, engines, and whether they share GPUs."""

    trainer_ranks: int
    engines: int
    colocated: bool


class MemoryCheck:
    """Plans the memory of one workload's layouts on its hardware profile (``SimConfig.memory`` says how)."""

    def __init__(self, sim: SimConfig, gpus: int | None = None, host_gb: float | None = None) -> None:
        """``gpus``: the cluster's (default one node's); ``host_gb``: one node's host RAM in GB (``--host-gb``;
        default the profile's ``host_memory_bytes``)."""
        self.sim = sim
        self.shape: ModelShape = resolve_shape(sim.model)
        profile = resolve_profile(sim.hardware)  # as the simulation reads it: a name, a profile or probe file
        self.hardware: Hardware = memory_plan.profile_hardware(profile, sim.hardware, gpus, host_gb)
        self.longest = sim.prompt_tokens + sim.rollout.max_new_tokens
        self.train_config = load_run_config(sim.memory.train_config) if sim.memory.train_config else None
        """The training config planned, as written (its layout replaced per candidate by ``run_config``)."""
        self.critic: CriticShape | None = trained_parts(sim).critic_shape
        """A separate critic's body (None: a copy of the policy), as the simulated trainer costs it."""
        self.switch: SwitchConfig = (
            self.train_config.runtime.switch if self.train_config is not None else simulated_switch(sim.cost)
        )
        """How a colocated layout's trainer rank and engine share their GPU: the training config's
        ``runtime.switch`` (which ``run_config`` turns off for the runtime's checks), else the simulated one."""
        self._cache: dict[Layout, Drop | None] = {}

    def run_config(self, layout: Layout) -> RunConfig:
        """The run ``layout`` stands for (module docstring)."""
        gpe = self.sim.engine.gpus_per_engine
        keys = [
            f"trainer.num_workers={layout.trainer_ranks}",
            f"rollout.num_engines={layout.engines}",
            f"engine.vllm.tensor_parallel_size={gpe}",
        ]
        if not layout.colocated:  # a split layout: its own GPUs per role, whatever the mode would colocate
            keys.append("runtime.colocate=never")
        base = self.train_config
        if base is None:
            return load_run_config(None, [*self.defaults(layout.trainer_ranks), *keys, "runtime.type=local"])
        if base.runtime.type == "inline" and (layout.trainer_ranks > 1 or not layout.colocated):
            keys.append("runtime.type=local")  # several processes; memory is the same on a cluster
        if base.runtime.switch.enabled:  # inline only: ``_drop`` plans ``self.switch``, read from ``base``
            keys.append("runtime.switch.enabled=false")
        keys += _carried_precision(base, layout.trainer_ranks)
        return load_run_config(self.sim.memory.train_config, keys)

    def defaults(self, ranks: int) -> list[str]:
        """``memory``'s keys and the simulation's engine as ``asyncrl train`` keys."""
        memory, sim = self.sim.memory, self.sim
        served = {2: "bfloat16", 4: "float32"}.get(sim.cost.bytes_per_param, "bfloat16")
        tokens = memory.max_tokens_per_microbatch or self.longest
        keys = [
            f"model.dtype={memory.master_dtype}",
            f"trainer.activation_checkpointing={str(memory.activation_checkpointing).lower()}",
            f"trainer.max_tokens_per_microbatch={tokens}",
            f"engine.backend={'vllm' if sim.cost.kv == 'paged' else 'builtin'}",
            f"engine.dtype={served}",
            f"engine.vllm.gpu_memory_utilization={sim.cost.memory_utilization}",
            f"engine.vllm.max_num_seqs={sim.cost.max_num_seqs}",
            f"engine.max_running_requests={sim.engine.max_running_requests}",
            f"engine.max_model_len={sim.engine.max_model_len or self.longest}",
            f"engine.max_kv_tokens={max(sim.engine.max_kv_tokens, self.longest)}",
        ]
        if memory.mixed_precision:
            keys.append("trainer.mixed_precision=bf16" if ranks > 1 else "trainer.compute_dtype=bfloat16")
        if memory.lora_rank:
            keys.append(f"trainer.lora.rank={memory.lora_rank}")
        if memory.critic != "none":
            keys += [f"critic.type={memory.critic}", "advantage.name=gae"]
        return keys

    def engine_slot_limit(self) -> int | None:
        """The most slots the built-in engine planned from the simulation's keys (no training config) allocates
        at all: its pool within the engine's own limit (``app.kv_slots``: 90 % of its GPU free beside its
        weights, which the simulated budget, ``cost.memory_utilization`` of the GPU less the weights, exceeds
        for small models). None for vLLM, or a training config's engine (planned as written)."""
        if self.train_config is not None or self.sim.cost.kv != "reserved":
            return None
        config = self.run_config(Layout(1, 1, colocated=False))
        engine = memory_plan.engine_role(config, self.shape, self.longest, self.hardware)
        use = kv_slots.slot_use(config, engine, self.hardware, self.longest)
        return use.allowed // use.slot_bytes

    def drop(self, layout: Layout) -> Drop | None:
        """Why ``layout`` does not fit (the GPU, or the node's host RAM, that overflows most), or None when
        every GPU and node holds it."""
        if layout not in self._cache:
            self._cache[layout] = self._drop(layout)
        return self._cache[layout]

    def _drop(self, layout: Layout) -> Drop | None:
        config = self.run_config(layout)
        shape, hardware = self.shape, self.hardware
        plan = memory_plan.plan(config, shape, self.longest, hardware, critic=self.critic)
        trainer, engine = plan.roles
        switch = self.switch if layout.colocated else None  # None: the run's own (off on a split)
        if layout.colocated:
            devices = memory_plan.shared_gpu_devices(config, shape, trainer, engine, switch)
        else:
            devices = plan.devices
        drops = [_overflow(device, hardware.usable_bytes) for device in devices]
        node = memory_plan.host_plan(config, plan, shape, hardware, switch)
        drops.append(_overflow(node, hardware.host_bytes))
        if config.engine.backend == "builtin":  # the pool the engine itself refuses (doctor's FAIL)
            use = kv_slots.slot_use(config, engine, hardware, self.longest)
            if use.pool > use.allowed:
                where = "the built-in engine's KV pool (90 % of its GPU free beside its weights)"
                drops.append(Drop(where, use.pool, max(use.allowed, 1), engine.name, "KV pool", use.pool))
        else:
            share = int(config.engine.vllm.gpu_memory_utilization * hardware.device_bytes)
            need = memory_plan.vllm_needs(config, shape, self.longest)
            if need > share:
                how = f"weights and one {self.longest}-token request's KV"
                drops.append(Drop("vLLM's share of each engine GPU", need, share, "vLLM engine", how, need))
        failed = [d for d in drops if d is not None]
        return max(failed, key=lambda d: d.need / d.usable) if failed else None


def engine_keys(config: RunConfig) -> list[str]:
    """``config``'s engine as the ``asyncrl train`` keys that size it: backend, slots, KV budget and context cap
    (the built-in engine), or the memory share, sequences and tensor parallelism (vLLM)."""
    engine = config.engine
    keys = [f"engine.backend={engine.backend}"]
    if engine.backend == "builtin":
        keys += [
            f"engine.max_running_requests={engine.max_running_requests}",
            f"engine.max_kv_tokens={engine.max_kv_tokens}",
        ]
    else:
        vllm = engine.vllm
        keys += [
            f"engine.vllm.gpu_memory_utilization={vllm.gpu_memory_utilization}",
            f"engine.vllm.max_num_seqs={vllm.max_num_seqs}",
            f"engine.vllm.tensor_parallel_size={vllm.tensor_parallel_size}",
        ]
    if engine.max_model_len is not None:
        keys.append(f"engine.max_model_len={engine.max_model_len}")
    return keys


def simulated_switch(cost: SimCostConfig) -> SwitchConfig:
    """The ``runtime.switch`` the simulator costs a colocated layout by: ``cost.switch_offload_bytes_per_param``
    (``SWITCH_OFFLOAD_BYTES``) and ``cost.switch_sleep_level``."""
    per_param = cost.switch_offload_bytes_per_param
    offloads = {key: per_param >= least for key, least in SWITCH_OFFLOAD_BYTES.items()}
    return SwitchConfig(enabled=True, engine_sleep_level=cost.switch_sleep_level, **offloads)


def _overflow(device: Device, usable: int) -> Drop | None:
    if device.total <= usable:
        return None
    role, term = device.largest()
    return Drop(device.name, device.total, usable, role.name, term.name, term.bytes)


def _carried_precision(config: RunConfig, ranks: int) -> list[str]:
    """The training config's bf16 compute on ``ranks`` trainer ranks: FSDP2's ``mixed_precision`` on several,
    autocast's ``compute_dtype`` on one (the config refuses the other key there)."""
    trainer = config.trainer
    bf16 = trainer.mixed_precision == "bf16" or trainer.compute_dtype == "bfloat16"
    if not bf16:
        return []
    if ranks == 1:
        return ["trainer.mixed_precision=none", "trainer.compute_dtype=bfloat16"]
    return ["trainer.mixed_precision=bf16"]
