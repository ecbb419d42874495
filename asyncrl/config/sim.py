"""Configuration of the simulator: a workload, cost models of engines, trainer and rewards, and the run.

The run itself (mode, batch shape, async ratio, routing) reuses the real sections (``rollout``, ``buffer``,
``controller``, ``proxy``), so a simulated run and a real one are described by the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.env import EnvManagerConfig, check_env_manager_fits
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.modes import check_mode

LENGTH_DISTRIBUTIONS = ("constant", "lognormal", "pareto", "empirical")
LATENCY_DISTRIBUTIONS = ("constant", "gaussian", "lognormal")


@dataclass(frozen=True, kw_only=True)
class LengthConfig:
    """Response lengths in tokens: a per-response draw times a per-prompt factor, clipped to
    [1, rollout.max_new_tokens] (a response reaching the limit ends as truncated)."""

    distribution: Literal["constant", "lognormal", "pareto", "empirical"] = "lognormal"
    """constant: every response is ``mean`` tokens. lognormal: mean ``mean``, log-space σ ``sigma``.
    pareto: scale ``mean·(shape-1)/shape`` and shape ``pareto_shape`` (mean ``mean``, a heavy tail).
    empirical: uniform draws from the lengths in ``path``."""
    mean: float = 1000.0
    """Mean response length in tokens, before clipping."""
    sigma: float = 1.0
    """Log-space standard deviation of the lognormal distribution (1.0: the longest of a few hundred
    responses is ~15× the median)."""
    pareto_shape: float = 2.0
    """Tail index of the Pareto distribution (> 1; smaller is heavier-tailed)."""
    prompt_sigma: float = 0.0
    """Log-space σ of a per-prompt factor (mean 1) shared by all responses of a prompt: hard prompts get
    long answers; 0 makes responses independent of their prompt."""
    path: str = ""
    """JSONL file for ``empirical``: one length per line, as a number or an object with a ``length`` key."""
    per_prompt: bool = False
    """Draw once per prompt: every response of a prompt gets the same length (before ``prompt_sigma``), for
    tasks whose prompt fixes the answer's length and sampling barely changes it. False draws per response."""
    assumption: str = ""
    """What the length model assumes and where its numbers come from, in words (e.g. which mean and maximum
    a paper reports and which distribution family and spread were chosen where it reports none). No cost
    reads it; the benchmarks that predict a paper's tables record it and require it of every workload."""

    def __post_init__(self) -> None:
        if self.distribution not in LENGTH_DISTRIBUTIONS:
            raise ValueError(
                f"lengths.distribution must be one of {', '.join(map(repr, LENGTH_DISTRIBUTIONS))}, "
                f"got {self.distribution!r}"
            )
        if not self.mean >= 1:
            raise ValueError(f"lengths.mean must be >= 1, got {self.mean}")
        if self.sigma < 0 or self.prompt_sigma < 0:
            raise ValueError(
                f"lengths.sigma and prompt_sigma must be >= 0, got {self.sigma}, {self.prompt_sigma}"
            )
        if not self.pareto_shape > 1:
            raise ValueError(f"lengths.pareto_shape must be > 1 (finite mean), got {self.pareto_shape}")
        if self.distribution == "empirical" and not self.path:
            raise ValueError(
                "lengths.path must name a JSONL file of lengths when distribution is 'empirical'"
            )


@dataclass(frozen=True, kw_only=True)
class SimEngineConfig:
    """Cost model of one engine replica: a tensor-parallel group of ``gpus_per_engine`` accelerators.

    The compute of a decode step *on one accelerator* is ``decode_step_s · max(1, running / knee_batch) +
    decode_s_per_request · running + kv_s_per_token · KV tokens``: memory-bound decoding costs about the same
    for any batch up to the knee, then grows linearly; a per-request term covers work that grows with every
    batch row (sampling, the output layer on a CPU); attention over the cached context adds a term per KV
    token. Newly admitted prompts are prefilled in the first step they join, at ``prefill_s_per_token`` per
    prompt token. With ``g = gpus_per_engine`` (tensor parallelism: every layer's weights and heads split g
    ways) that compute and the prefill are divided by g, and each step adds the all-reduces that join the
    shards: ``num_layers · 2 · 2(g − 1) · allreduce_hop_s`` (see ``allreduce_hop_s``; ``asyncrl.sim.cost``).
    The knee does not move with g: each accelerator still runs the whole batch over its share of the weights.
    """

    gpus_per_engine: int = 1
    """Accelerators behind one engine, as one tensor-parallel group: they divide a step's compute and add its
    all-reduces (class docstring), and all of them count toward the cluster size (``SimConfig.num_gpus``)."""
    decode_step_s: float = 0.02
    """Time of one decode step *on a single accelerator* with at most ``knee_batch`` running requests and an
    empty KV cache (an engine of ``gpus_per_engine`` accelerators takes 1/g of it plus its all-reduces)."""
    decode_overhead_s: float = 0.0
    """Fixed time of every decode step, whatever the batch and the tensor-parallel degree: the small kernels
    (norms, rotary, residuals) and launches around the matrix products. ``model`` + ``hardware`` derive it
    from the probe's per-layer figure (about 0.15 ms per layer on an H200, unfused kernels, CUDA-graphed)."""
    decode_s_per_request: float = 0.0
    """Extra single-accelerator decode-step time per running request, at any batch size (0: the knee model
    alone). ``bench/sim_vs_real.py`` fits it on a CPU, where a step grows with the batch from the first row."""
    num_layers: int = 28
    """Transformer layers of the served model: the all-reduces of a tensor-parallel step are per layer. The
    default matches ``kv_bytes_per_token``'s Qwen2.5-7B-like model."""
    allreduce_hop_s: float = 5e-6
    """Latency of one hop of a ring all-reduce inside a tensor-parallel engine. A decode step all-reduces
    twice per layer (after attention and after the MLP, Megatron-style), and a ring over g accelerators takes
    2(g − 1) hops, so a step pays ``num_layers · 4(g − 1) · allreduce_hop_s`` (0 when g = 1). Latency only:
    a decode step's messages (batch × hidden activations) are small enough that hops, not bandwidth, dominate.
    The default is an order-of-magnitude figure for an intra-node GPU link, not a measurement."""
    knee_batch: int = 64
    """Running requests up to which a decode step costs the same (memory-bound regime)."""
    kv_s_per_token: float = 0.0
    """Extra decode-step time per cached KV token of the running batch (attention reads)."""
    prefill_s_per_token: float = 0.0
    """Prefill time per prompt token, paid in the step a request joins."""
    max_running_requests: int = 256
    """Most requests decoding at once; the rest wait in the engine's FIFO queue."""
    max_kv_tokens: int = 10_000_000
    """KV budget in tokens. ``kv_allocation: reserved``: a request is admitted only when its reservation,
    min(prompt + max_new_tokens, max_model_len), fits in what is left (``asyncrl.engine.admission``, as the
    real engine). ``paged``: the running requests' contexts as they grow (see ``kv_allocation``)."""
    kv_allocation: Literal["reserved", "paged"] = "reserved"
    """How the KV budget binds. reserved (the built-in engine): each request reserves its longest context at
    admission and is never preempted. paged (vLLM, SGLang): a request is admitted when a slot is free and its
    context so far plus one token per running request fits what the running batch leaves of
    ``max_kv_tokens``; every step adds one KV token per running request, and when the next step would not fit,
    the most recently admitted running request is preempted: its KV is freed and it goes back to the head of
    the waiting queue, to be prefilled again (prompt and output so far: recompute preemption). So many long
    responses on one engine (a grouped prompt's) run fewer at a time, or are preempted and recomputed."""
    prefix_caching: bool = True
    """paged only: a preempted request's freed KV stays cached until allocations reuse it (vLLM's prefix
    cache, on by default since its V1 engine and in ROLL's config; SGLang's radix tree), so on readmission
    only the part reused meanwhile is prefilled again. The free blocks are handed out least recently freed
    first and a request's last blocks first, so what a preempted request keeps is its prefix, and it is lost
    only once the space that was already free is spent. False: every readmission recomputes the whole
    context."""
    max_model_len: int | None = None
    """Longest context (prompt + output) a request may reach; it ends there with ``length``, as on the real
    engine. None: unbounded (the reservation is prompt + max_new_tokens)."""
    weight_update_s: float = 1.0
    """Time to receive and load new weights (the engine is paused meanwhile)."""
    recompute_kv_on_update: bool = False
    """After an in-flight update, re-prefill every running request's context (prompt + output so far)."""
    kv_bytes_per_token: int = 57_344
    """KV cache bytes per context token, what a migration moves (``controller.mode: multi_version``); the
    default is a Qwen2.5-7B-like model in bf16: 28 layers x 4 KV heads x 128 dims x 2 (keys, values) x 2 B."""
    kv_transfer_s_per_token: float = 0.0
    """Time to move one context token's KV to another engine in a migration; the request joins its receiver
    after ``kv_transfer_s_per_token`` x its context tokens. 0 (free, like the default prefill) keeps the
    cost model's context handling free; ~5.7e-6 is the default ``kv_bytes_per_token`` over 10 GB/s."""

    def __post_init__(self) -> None:
        for name in ("gpus_per_engine", "knee_batch", "max_running_requests", "max_kv_tokens", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_allocation not in ("reserved", "paged"):
            raise ValueError(
                f"engine.kv_allocation must be 'reserved' or 'paged', got {self.kv_allocation!r}"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"engine.max_model_len must be >= 2 or null, got {self.max_model_len}")
        if not self.decode_step_s > 0:
            raise ValueError(f"engine.decode_step_s must be > 0, got {self.decode_step_s}")
        for name in (
            "decode_overhead_s",
            "decode_s_per_request",
            "allreduce_hop_s",
            "kv_s_per_token",
            "prefill_s_per_token",
            "weight_update_s",
            "kv_bytes_per_token",
            "kv_transfer_s_per_token",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"engine.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class SimTrainerConfig:
    """Cost model of the trainer: ``step_overhead_s + epochs · tokens · gpu_s_per_token / num_gpus``, times
    ``concurrent_slowdown`` when an engine is generating as the step starts."""

    num_gpus: int = 8
    """Accelerators training (ignored when ``colocated``: training then uses every rollout accelerator)."""
    colocated: bool = False
    """Training runs on the rollout accelerators (the classic synchronous placement)."""
    gpu_s_per_token: float = 1e-4
    """Accelerator-seconds to train on one token (forward, backward and the log-prob passes)."""
    epochs: int = 1
    """E: how many times each sample is trained on (PPO epochs)."""
    step_overhead_s: float = 5.0
    """Fixed time per step: optimizer step, model load/offload, bookkeeping."""
    concurrent_slowdown: float = 1.0
    """Factor on a training step's time when an engine is generating as it starts: contention for what the
    two pools share (host CPUs, memory bandwidth, network). 1 for dedicated hardware; on a CPU test bed
    where rollout and training share the cores it is above 1 (``bench/sim_vs_real.py`` measures it: a bare
    train step timed alone and while a second process decodes).
    Applied to the whole step, so overlap that ends mid-step is charged in full."""

    def __post_init__(self) -> None:
        if not self.concurrent_slowdown >= 1:
            raise ValueError(f"trainer.concurrent_slowdown must be >= 1, got {self.concurrent_slowdown}")
        if self.num_gpus < 1 or self.epochs < 1:
            raise ValueError(
                f"trainer.num_gpus and trainer.epochs must be >= 1, got {self.num_gpus}, {self.epochs}"
            )
        if self.gpu_s_per_token < 0 or self.step_overhead_s < 0:
            raise ValueError(
                f"trainer.gpu_s_per_token and step_overhead_s must be >= 0, got "
                f"{self.gpu_s_per_token}, {self.step_overhead_s}"
            )


@dataclass(frozen=True, kw_only=True)
class SimRewardConfig:
    """Rewards: a Bernoulli outcome per response with a per-prompt pass rate, after a latency."""

    latency_s: float = 0.0
    """Time to score one response (run concurrently with generation)."""
    pass_rate_alpha: float = 1.0
    """Per-prompt pass rate ~ Beta(alpha, beta); small values make many prompts all-correct or all-wrong,
    which dynamic filtering (``rollout.filter: zero_variance``) then drops."""
    pass_rate_beta: float = 1.0
    """See ``pass_rate_alpha``."""

    def __post_init__(self) -> None:
        if self.latency_s < 0:
            raise ValueError(f"reward.latency_s must be >= 0, got {self.latency_s}")
        if not (self.pass_rate_alpha > 0 and self.pass_rate_beta > 0):
            raise ValueError(
                f"reward.pass_rate_alpha and pass_rate_beta must be > 0, got "
                f"{self.pass_rate_alpha}, {self.pass_rate_beta}"
            )


@dataclass(frozen=True, kw_only=True)
class SimEnvConfig:
    """Cost model of the simulated environments (``producer: agentic``), see ``asyncrl.sim.env_cost``.

    Every step takes a latency drawn from ``latency``; with probability ``fail_slow_p`` (per step) or
    ``slow_seed_p`` (per seed, so for a whole group) it takes ``fail_slow_factor`` times longer, and with
    probability ``fail_stop_p`` it raises after its latency (the EnvManager replaces the env). The
    episode's last step also waits ``reward_latency_s``.
    """

    latency: Literal["constant", "gaussian", "lognormal"] = "constant"
    """constant: every step takes ``mean_s``. gaussian: Normal(mean_s, sigma_s) truncated at 0 (as the
    ROLL Flash simulations). lognormal: mean ``mean_s`` and standard deviation ``sigma_s``."""
    mean_s: float = 1.0
    """μ: mean step latency in seconds."""
    sigma_s: float = 0.0
    """σ: standard deviation of the step latency in seconds (unused by ``constant``)."""
    reset_s: float = 0.0
    """Latency of ``reset`` (starting the episode's environment)."""
    fail_slow_p: float = 0.0
    """Probability that a step is a straggler taking ``fail_slow_factor`` times its latency."""
    fail_slow_factor: float = 10.0
    """How much longer a fail-slow step takes."""
    slow_seed_p: float = 0.0
    """Probability that a seed is slow (a heavy task): every step of every episode reset with it takes
    ``fail_slow_factor`` times longer. Unlike ``fail_slow_p`` the slowness is shared by the whole group."""
    fail_stop_p: float = 0.0
    """Probability that a step fails (raises) after its latency."""
    reward_latency_s: float = 0.0
    """Time to score the trajectory, paid at the end of the episode's last step."""
    num_turns: int = 5
    """Model turns per episode: the env terminates after this many steps."""
    observation_tokens: int = 64
    """Tokens of each observation after the first (the first is ``prompt_tokens``)."""

    def __post_init__(self) -> None:
        if self.latency not in LATENCY_DISTRIBUTIONS:
            raise ValueError(
                f"env.latency must be one of {', '.join(map(repr, LATENCY_DISTRIBUTIONS))}, got {self.latency!r}"
            )
        for name in ("mean_s", "sigma_s", "reset_s", "reward_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"env.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("fail_slow_p", "slow_seed_p", "fail_stop_p"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"env.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.fail_slow_factor < 1:
            raise ValueError(f"env.fail_slow_factor must be >= 1, got {self.fail_slow_factor}")
        if self.num_turns < 1 or self.observation_tokens < 0:
            raise ValueError(
                f"env.num_turns must be >= 1 and env.observation_tokens >= 0, got {self.num_turns}, "
                f"{self.observation_tokens}"
            )
        if self.latency == "lognormal" and self.sigma_s > 0 and self.mean_s == 0:
            raise ValueError("env.mean_s must be > 0 for a lognormal latency with sigma_s > 0")


@dataclass(frozen=True, kw_only=True)
class SimCostConfig:
    """How ``model`` + ``hardware`` turn into engine and trainer costs (``asyncrl.sim.derive``): the software
    around the accelerators, which no spec sheet or probe says."""

    kv: Literal["paged", "reserved"] = "paged"
    """paged: engines allocate KV as requests grow (vLLM, SGLang): ``engine.kv_allocation: paged`` with
    ``engine.max_kv_tokens`` the KV that fits and ``cost.max_num_seqs`` slots, so an engine runs as many
    requests as their contexts leave room for and preempts when they outgrow it. reserved: each request
    reserves its longest context up front (the built-in engine), so ``engine.max_kv_tokens`` is the KV that
    fits and ``engine.max_running_requests`` is ``max_num_seqs`` capped at the reservations that KV holds at
    once (the built-in engine preallocates every slot at the longest context: a slot no reservation can fill
    would be memory spent for nothing, so ``asyncrl plan`` plans, and would run, that many slots)."""
    max_num_seqs: int = 256
    """Most requests an engine runs at once whatever the KV (vLLM's ``max_num_seqs``; with ``kv: reserved`` the
    built-in engine's ``max_running_requests`` when the KV holds that many longest contexts)."""
    memory_utilization: float = 0.9
    """Share of device memory an engine takes for weights and KV (vLLM's ``gpu_memory_utilization``)."""
    bytes_per_param: int = 2
    """Bytes of a weight as served and synced (2: bfloat16)."""
    logprob_passes: int = 1
    """No-grad forward passes the trainer runs per trained token besides training: 1 recomputes the old
    log-probs (decoupled PPO's proximal policy), 2 adds a reference model, 0 trusts the engine's."""
    weight_reload_s: float = 1.0
    """An engine's fixed time to pause, load new weights and resume, beyond moving their bytes (an assumption:
    no probe measures the serving stack's reload path)."""
    switch_offload_bytes_per_param: float = 8.0
    """Colocated (``trainer.colocated``): trainer state per parameter that leaves the devices while the engines
    generate and comes back before training, over the host link (8: Adam's two float32 moments, what
    ``runtime.switch`` offloads by default; 12 with its master weights; 16 with gradients too, for a system
    that keeps them between steps: asyncrl's trainer frees them after every step). A frozen reference model
    (a KL loss, ``logprob_passes`` 2), which ``runtime.switch.offload_reference`` also moves by default, is
    not in these figures: the simulator does not cost its round trip (its master bytes per parameter)."""
    switch_sleep_level: int = 1
    """Colocated: what a sleeping engine gives up (``runtime.switch.engine_sleep_level``): 1 its KV pool
    (re-zeroed on wake), 2 also its weights (out to host memory and back over the host link)."""
    switch_fixed_s: float = 0.5
    """Colocated: the switch's fixed time per step beyond moving bytes (allocator calls, CUDA IPC handles, the
    hand-offs between five phases). An assumption, not measured and not fitted to any figure:
    ``scripts/gpu_checks/colocate.py`` measures the phases on a lent GPU."""

    def __post_init__(self) -> None:
        if self.kv not in ("paged", "reserved"):
            raise ValueError(f"cost.kv must be one of 'paged', 'reserved', got {self.kv!r}")
        if self.max_num_seqs < 1 or self.bytes_per_param < 1 or self.logprob_passes < 0:
            raise ValueError(
                f"cost.max_num_seqs and cost.bytes_per_param must be >= 1 and cost.logprob_passes >= 0, got "
                f"{self.max_num_seqs}, {self.bytes_per_param}, {self.logprob_passes}"
            )
        if not 0 < self.memory_utilization <= 1:
            raise ValueError(f"cost.memory_utilization must be in (0, 1], got {self.memory_utilization}")
        if self.weight_reload_s < 0:
            raise ValueError(f"cost.weight_reload_s must be >= 0, got {self.weight_reload_s}")
        if self.switch_offload_bytes_per_param < 0 or self.switch_fixed_s < 0:
            raise ValueError(
                "cost.switch_offload_bytes_per_param and cost.switch_fixed_s must be >= 0, got "
                f"{self.switch_offload_bytes_per_param}, {self.switch_fixed_s}"
            )
        if self.switch_sleep_level not in (1, 2):
            raise ValueError(f"cost.switch_sleep_level must be 1 or 2, got {self.switch_sleep_level}")


CRITIC_CHOICES = ("none", "separate", "shared_trunk")


@dataclass(frozen=True, kw_only=True)
class SimMemoryConfig:
    """What ``asyncrl plan`` checks each candidate layout's memory with (``asyncrl.app.plan_memory``: the plan
    ``asyncrl doctor --hardware`` prints, per role and per shared device). The layout (trainer ranks, engines,
    tensor parallelism) is the candidate's; the engine's slots and longest context are the workload's. The
    trainer's settings are ``train_config``'s when it names a training config, else the keys below. Their critic
    and LoRA also set the simulated trainer's and weight update's time (``asyncrl.sim.trained``), with memory
    checked or not."""

    check: bool = True
    """Drop the candidates whose plan does not fit ``hardware`` (never simulated; the colocated baseline is
    still simulated as the yardstick but never recommended). False plans throughput alone."""
    train_config: str = ""
    """A training config (``asyncrl train``'s YAML): its model dtype, trainer (micro-batch, checkpointing,
    mixed precision, gradient accumulation, LoRA), loss (a KL reference), critic, engine (backend, dtype,
    ``max_model_len``, vLLM's share) and ``runtime.switch`` are planned, and the keys below are ignored
    (``critic_model``, which would be, is refused). Its engine is also the one simulated (``sim.run_engine``:
    the built-in engine's slots, ``max_kv_tokens`` and ``max_model_len`` with ``cost.kv: reserved``; vLLM's
    ``max_num_seqs`` and share with ``paged``), and a ``cost`` or ``engine`` key set otherwise is refused.
    Empty: the keys below, with the engine read from ``cost``
    (``kv: paged`` is vLLM at ``memory_utilization``, ``reserved`` the built-in engine; ``bytes_per_param`` its
    dtype)."""
    master_dtype: Literal["float32", "bfloat16"] = "float32"
    """The trainer's weights, gradients and AdamW moments (``model.dtype``)."""
    mixed_precision: bool = True
    """The forward and backward compute in bfloat16 (FSDP2's ``mixed_precision: bf16``; one rank: autocast's
    ``compute_dtype: bfloat16``); False computes in ``master_dtype``."""
    activation_checkpointing: bool = True
    """Keep only each layer's input for backward and recompute the rest (``trainer.activation_checkpointing``)."""
    max_tokens_per_microbatch: int | None = None
    """Tokens of one micro-batch (``trainer.max_tokens_per_microbatch``); null: one longest sample,
    ``prompt_tokens + rollout.max_new_tokens``, the least a micro-batch holds."""
    lora_rank: int = 0
    """LoRA adapters of this rank on every linear layer (``trainer.lora``): the base frozen, only the adapters
    hold gradients and moments; 0 trains every weight. Also costed in time: no weight gradients for the base,
    AdamW and the weight update over the adapters only."""
    critic: Literal["none", "separate", "shared_trunk"] = "none"
    """The value model PPO's GAE reads (``critic.type``): a separate decoder body with its own optimizer, or a
    value head on the policy's trunk. Also costed in time: a separate body's own passes and optimizer step."""
    critic_model: str | None = None
    """The body a separate critic is costed at, in memory and time (``critic.model_path`` plays this part in a
    training config): a named shape (``qwen3-1.7b``), a ``config.json`` or its folder, as ``model`` is named, or
    a hub id in the offline cache; one that reads as none of these is an error. Null: a copy of the policy's
    shape. Only with ``critic: separate``, and refused beside ``train_config``, whose ``critic.model_path``
    names the body instead (``asyncrl plan`` prints which shape the critic is costed at)."""

    def __post_init__(self) -> None:
        if self.master_dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"memory.master_dtype must be 'float32' or 'bfloat16', got {self.master_dtype!r}"
            )
        if self.max_tokens_per_microbatch is not None and self.max_tokens_per_microbatch < 1:
            raise ValueError(
                f"memory.max_tokens_per_microbatch must be >= 1 or null, got {self.max_tokens_per_microbatch}"
            )
        if self.lora_rank < 0:
            raise ValueError(f"memory.lora_rank must be >= 0, got {self.lora_rank}")
        if self.critic not in CRITIC_CHOICES:
            raise ValueError(
                f"memory.critic must be one of {', '.join(map(repr, CRITIC_CHOICES))}, got {self.critic!r}"
            )
        if self.critic_model is not None:
            self._check_critic_model()

    def _check_critic_model(self) -> None:
        """``critic_model`` names a separate critic's body for ``memory``'s own trainer settings: refused where
        it would be ignored. Whether it names a shape is checked where it is read (``sim.critic_shape``: the
        config imports nothing that reads models)."""
        if not self.critic_model.strip():
            raise ValueError("memory.critic_model must name a shape, a config.json or a hub id, or be null")
        if self.train_config:
            raise ValueError(
                f"memory.critic_model ({self.critic_model!r}) is set beside memory.train_config "
                f"({self.train_config!r}), whose critic.model_path names the critic's body: drop one"
            )
        if self.critic != "separate":
            raise ValueError(
                f"memory.critic_model ({self.critic_model!r}) names a separate critic's body, but memory.critic "
                f"is {self.critic!r}: set memory.critic=separate, or leave memory.critic_model null"
            )


@dataclass(frozen=True, kw_only=True)
class SteadyStateConfig:
    """Run until the step time settles instead of a fixed count: start-up transients (an empty pipeline, the
    first weight updates) otherwise inflate or hide a mode's gain. ``controller.num_steps`` is then the cap."""

    enabled: bool = False
    warmup_steps: int = 5
    """Steps left out of every steady-state metric."""
    window_steps: int = 10
    """The run stops once the mean step time of the last ``window_steps`` steps is within ``tolerance`` of the
    ``window_steps`` before them (so at least ``warmup_steps + 2 · window_steps`` steps run)."""
    tolerance: float = 0.03

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.window_steps < 1 or not 0 < self.tolerance < 1:
            raise ValueError(
                f"steady_state needs warmup_steps >= 0, window_steps >= 1 and 0 < tolerance < 1, got "
                f"{self.warmup_steps}, {self.window_steps}, {self.tolerance}"
            )


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """One simulated run: the real producer, buffer, proxy and controller on a virtual clock."""

    seed: int = 0
    """Seed of the workload (lengths, pass rates) and the data order."""
    model: str = ""
    """The served and trained model's shape: a name (``qwen3-8b``, see ``asyncrl.sim.model_shape``) or a HF
    ``config.json`` (or its folder). With ``hardware``, every engine and trainer cost not set explicitly in
    the config is derived from the two (``asyncrl.sim.derive``); empty: the costs are the hand-set keys."""
    hardware: str = ""
    """The accelerator: a named profile (``h100``, ``h200``, ``h800``, ``h20``, ``a100``: spec sheets with
    efficiencies measured by ``asyncrl calibrate``), ``h200-measured``, or a profile or probe JSON file."""
    cost: SimCostConfig = field(default_factory=SimCostConfig)
    """Software assumptions of the derivation from ``model`` and ``hardware``."""
    num_prompts: int = 10_000
    """Distinct prompts in the simulated dataset (it cycles through epochs)."""
    prompt_tokens: int = 256
    """Tokens of every prompt."""
    lengths: LengthConfig = field(default_factory=LengthConfig)
    """Response-length distribution."""
    engine: SimEngineConfig = field(default_factory=SimEngineConfig)
    """Cost model of each engine replica; ``rollout.num_engines`` sets how many."""
    trainer: SimTrainerConfig = field(default_factory=SimTrainerConfig)
    """Cost model of the trainer."""
    reward: SimRewardConfig = field(default_factory=SimRewardConfig)
    """Reward latency and outcomes."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Batch shape, replication, queue/batch generation, filtering and redundancy (as in a real run)."""
    buffer: BufferConfig = field(default_factory=BufferConfig)
    """Async ratio α, checked against the mode as in a real run (``sync`` needs 0, ``one_step_off`` 1: see
    ``asyncrl.modes``; a ``--sweep controller.mode=...`` sets it for them). Its timeouts are ignored: the simulator waits without limit (deadlocks are detected)."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """Mode and number of steps (evaluation keys are ignored)."""
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    """Routing and update policy (None follows the mode); ``control_timeout_s`` is ignored."""
    steady_state: SteadyStateConfig = field(default_factory=SteadyStateConfig)
    """Stop once the step time is stable and report the measured window (``steady_*`` totals)."""
    output_dir: str = "runs/sim"
    """Where ``asyncrl simulate`` writes result.json, steps.jsonl, the timeline and any sweep's results."""
    timeline: Literal["full", "none"] = "full"
    """Record every worker's busy spans (for the Gantt chart); 'none' saves memory at scale."""
    producer: Literal["rlvr", "agentic"] = "rlvr"
    """rlvr: one request per response (``RLVRProducer``). agentic: multi-turn episodes against simulated
    environments (``AgenticProducer``; ``env`` and ``env_manager`` apply, ``num_prompts`` env seeds)."""
    env: SimEnvConfig = field(default_factory=SimEnvConfig)
    """Environment latency and failure model (agentic producer)."""
    env_manager: EnvManagerConfig = field(default_factory=EnvManagerConfig)
    """Env groups, redundancy, async vs batch env stepping and timeouts (agentic producer)."""
    memory: SimMemoryConfig = field(default_factory=SimMemoryConfig)
    """The trainer settings ``asyncrl plan`` plans each candidate's memory with; their critic and LoRA also set
    the derived trainer and weight-update costs (``asyncrl.sim.trained``)."""

    def __post_init__(self) -> None:
        if self.num_prompts < 1 or self.prompt_tokens < 1:
            raise ValueError(
                f"num_prompts and prompt_tokens must be >= 1, got {self.num_prompts}, {self.prompt_tokens}"
            )
        steady = self.steady_state
        if steady.enabled and self.controller.num_steps < steady.warmup_steps + 2 * steady.window_steps:
            raise ValueError(
                f"controller.num_steps={self.controller.num_steps} caps a steady-state run below "
                f"steady_state.warmup_steps + 2 x window_steps = {steady.warmup_steps + 2 * steady.window_steps}"
            )
        if bool(self.model) != bool(self.hardware):
            raise ValueError(
                f"model and hardware go together (costs are derived from both), got model={self.model!r}, "
                f"hardware={self.hardware!r}"
            )
        if self.timeline not in ("full", "none"):
            raise ValueError(f"timeline must be one of 'full', 'none', got {self.timeline!r}")
        check_mode(
            self.controller.mode, async_ratio=self.buffer.async_ratio, update_policy=self.proxy.update_policy
        )
        if self.producer not in ("rlvr", "agentic"):
            raise ValueError(f"producer must be one of 'rlvr', 'agentic', got {self.producer!r}")
        if self.producer == "agentic":
            self._check_agentic()
        worst = self.prompt_tokens + self.rollout.max_new_tokens
        if worst > self.engine.max_kv_tokens:
            raise ValueError(
                f"engine.max_kv_tokens={self.engine.max_kv_tokens} cannot hold one request of prompt_tokens + "
                f"rollout.max_new_tokens = {worst} tokens"
            )

    def _check_agentic(self) -> None:
        check_env_manager_fits(
            self.env_manager, self.rollout.num_return_sequences, self.rollout.rollout_batch_size
        )
        if self.env_manager.max_context_tokens > self.engine.max_kv_tokens:
            raise ValueError(
                f"env_manager.max_context_tokens={self.env_manager.max_context_tokens} must be <= "
                f"engine.max_kv_tokens={self.engine.max_kv_tokens}: a whole episode context must fit an engine"
            )

    @property
    def num_rollout_gpus(self) -> int:
        return self.rollout.num_engines * self.engine.gpus_per_engine

    @property
    def num_train_gpus(self) -> int:
        return self.num_rollout_gpus if self.trainer.colocated else self.trainer.num_gpus

    @property
    def num_gpus(self) -> int:
        """Accelerators the run occupies: rollout plus training (once when colocated)."""
        return self.num_rollout_gpus + (0 if self.trainer.colocated else self.trainer.num_gpus)
