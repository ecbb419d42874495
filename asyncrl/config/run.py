"""The root run configuration: one section per part, composed here and loaded from YAML plus overrides.

Adding a part's section is one field below (with its docstring); loading, overrides, ``config show`` and
``config docs`` pick it up from the type hints.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.critic import CriticConfig, check_critic
from asyncrl.config.engine import EngineConfig
from asyncrl.config.env import EnvConfig, EnvManagerConfig, check_env_manager_fits
from asyncrl.config.loader import load_config
from asyncrl.config.metrics import MetricsConfig
from asyncrl.config.model import FLASH_ATTENTION, ModelConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.reward import RewardConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.runtime import RuntimeConfig
from asyncrl.config.serve import ServeConfig
from asyncrl.config.task import TaskConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.config.weight_sync import WeightSyncConfig
from asyncrl.modes import check_mode, mode_spec


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything one asyncrl run needs; ``asyncrl config show`` prints it resolved."""

    seed: int = 0
    """Seed of the run: data order, sampling seeds and model initialisation derive from it."""
    output_dir: str = "runs/default"
    """Directory for checkpoints, metrics and the resolved config of this run."""
    resume: str = ""
    """A checkpoint directory to continue from (model, optimizer, step, data position); empty starts fresh."""
    deterministic: bool = False
    """Make a run's training a function of its seed alone: the behaviour log-probs the loss uses for tokens the
    current weights generated are the trainer's own step-start recompute, not the engine's (whose values
    depend on which requests shared its batches, i.e. on timing). A sync run and its kill/resume twin then end
    bit-equal, and so do sync and async at α = 0 (docs/modes.md). Costs one no-grad forward per step when the
    loss does not run one anyway (measured on a train step: docs/benchmarks.md, Determinism); off by
    default for that.
    Needs rollouts that sample the model's own distribution (rollout.top_p 1, top_k 0, temperature =
    trainer.temperature)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The built-in rollout engine (each replica)."""
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    """Routing, timeouts and health of the LLM proxy over the engines."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The prompts trained and evaluated on."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """How responses are verified."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Batch shape, sampling, queue scheduling, replication and filtering."""
    buffer: BufferConfig = field(default_factory=BufferConfig)
    """The async ratio and the buffer's timeouts."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """The paradigm (mode), number of steps and evaluation."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Optimisation: learning rate, epochs, micro-batching, checkpoints."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The policy loss, KL penalty and train-inference mismatch correction."""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """The advantage estimator."""
    critic: CriticConfig | None = None
    """PPO's value model, read by ``advantage.name: gae`` (required there, an error elsewhere)."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Where the parts run: one process (inline), Ray actors on this machine (local) or a Ray cluster."""
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    """How policy weights travel from the trainer to the engines (the transport and its bucket size)."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Trackers (console, JSONL, TensorBoard, W&B), the run timeline and the progress display."""
    producer: Literal["rlvr", "agentic", "external"] = "rlvr"
    """rlvr: one request per response to a ``task`` prompt, scored by ``reward`` (``RLVRProducer``).
    agentic: multi-turn episodes against the ``env`` environment run by ``env_manager``
    (``AgenticProducer``); evaluation then plays held-out env seeds.
    external: the run serves the OpenAI-compatible endpoint (``serve``) and trains on the trajectories that
    external harnesses finish there (``ExternalProducer``); the run does no evaluation of its own."""
    env: EnvConfig | None = None
    """The environment of producer 'agentic' (filled with its defaults there; an error to set otherwise)."""
    env_manager: EnvManagerConfig | None = None
    """Env groups, redundancy, async vs batch env stepping and timeouts of producer 'agentic' (filled with
    its defaults there; an error to set otherwise)."""
    serve: ServeConfig | None = None
    """The endpoint of producer 'external' (filled with its defaults there; an error to set otherwise)."""

    def __post_init__(self) -> None:
        if not self.output_dir:
            raise ValueError("output_dir must not be empty")
        check_mode(
            self.controller.mode, async_ratio=self.buffer.async_ratio, update_policy=self.proxy.update_policy
        )
        check_critic(self.advantage.name, self.critic)
        # a ValueError when the runtime cannot carry it
        self.weight_sync.transport_for(self.runtime.type, switch=self.runtime.switch.enabled)
        self._check_broadcast_into_vllm()
        self._check_delta_dtype()
        self._check_flash_precision()
        self.broadcast_apply()  # a ValueError when 'streamed' is asked where it is not correct
        self._check_switch()
        self._fill_vllm_lora()
        self._fill_vllm_request_seeds()
        self._fill_eval_chat_template_kwargs()
        if self.deterministic:
            self._check_deterministic()
        if self.producer not in PRODUCERS:
            raise ValueError(
                f"producer must be one of {', '.join(map(repr, PRODUCERS))}, got {self.producer!r}"
            )
        if self.producer == "agentic":
            self._fill_agentic()
        elif self.producer == "external":
            object.__setattr__(self, "serve", self.serve or ServeConfig())
            self._check_unset(("env", "env_manager"), "agentic")
        else:
            self._check_unset(("env", "env_manager"), "agentic")
        if self.producer != "external":
            self._check_unset(("serve",), "external")
        self._check_eval_sets()

    def _check_eval_sets(self) -> None:
        """Evaluation during training plays what the producer can evaluate: task prompts, or env episodes."""
        if self.controller.eval_every == 0:
            return
        if self.producer == "external":
            raise ValueError(
                "controller.eval_every does not apply to producer 'external' (harnesses evaluate)"
            )
        if self.producer == "agentic":
            for eval_set in self.controller.periodic_eval_sets():
                if eval_set.task is not None or eval_set.samples_per_prompt != 1:
                    raise ValueError(
                        f"controller.eval_sets[{eval_set.name}]: agentic runs evaluate held-out env episodes, "
                        "one each: leave task unset and samples_per_prompt at 1"
                    )

    def _check_deterministic(self) -> None:
        """The trainer's recompute stands in for the engine's log-probs only if both describe one distribution."""
        rollout = self.rollout
        if rollout.top_p != 1 or rollout.top_k != 0 or rollout.temperature != self.trainer.temperature:
            raise ValueError(
                "deterministic: true replaces the engine's behaviour log-probs with the trainer's own, which "
                "describe the model at trainer.temperature: it needs rollout.top_p 1, rollout.top_k 0 and "
                f"rollout.temperature = trainer.temperature (got top_p {rollout.top_p}, top_k {rollout.top_k}, "
                f"temperature {rollout.temperature} vs {self.trainer.temperature})"
            )

    def broadcast_apply(self) -> str:
        """``staged`` or ``streamed``: how a broadcast update reaches this run's engines
        (``weight_sync.broadcast_apply``, resolved for the mode and LoRA, the same for either backend)."""
        return self.weight_sync.broadcast_apply_for(self.controller.mode, lora=self.trainer.lora is not None)

    def _check_broadcast_into_vllm(self) -> None:
        """Refuse the broadcast into a vLLM engine sharded over several GPUs, before anything starts."""
        tensor_parallel = self.engine.vllm.tensor_parallel_size
        if self.engine.backend != "vllm" or tensor_parallel == 1:
            return
        if self.weight_sync.transport_for(self.runtime.type) == "broadcast":
            raise ValueError(
                f"weight_sync.type=broadcast cannot feed engine.vllm.tensor_parallel_size={tensor_parallel}: "
                "the group gives each engine one rank, but every tensor-parallel worker of vLLM would join as "
                "it (and each needs only its shard); use weight_sync.type: object_store (or auto), which "
                "streams buckets through shared memory to every worker of the engine"
            )

    def _check_delta_dtype(self) -> None:
        """Refuse a delta run whose trainer and built-in engines would resolve ``engine.dtype: auto`` apart.

        The trainer casts each version to the serving dtype once, at publish, and diffs it against the previous
        cast version, so the deltas are in the serving dtype and the engine patches its weights byte for byte
        (a float32 trainer feeding a bfloat16 engine works). ``auto`` resolves on each side's own device
        (bfloat16 on CUDA, ``model.dtype`` elsewhere): a trainer rank on a GPU and engines without one would
        publish bfloat16 into float32 weights, which a byte patch cannot do (other transports cast while
        copying). vLLM receives a delta as whole tensors and casts them, so only the built-in engine is
        concerned."""
        runtime = self.runtime
        trainer, engine = runtime.accelerators_per_trainer_worker, runtime.accelerators_per_engine
        if (
            self.weight_sync.transport_for(runtime.type, switch=runtime.switch.enabled) != "delta"
            or self.engine.backend != "builtin"
            or self.engine.dtype != "auto"
            or self.model.dtype == "bfloat16"  # what auto resolves to on either side
            or runtime.accelerator_resource != "GPU"
            or trainer is None
            or engine is None
            or (trainer > 0) == (engine > 0)
        ):
            return
        raise ValueError(
            f"weight_sync.type=delta with engine.dtype=auto, runtime.accelerators_per_trainer_worker={trainer} "
            f"and runtime.accelerators_per_engine={engine}: auto resolves to bfloat16 on a GPU and to "
            f"model.dtype={self.model.dtype!r} without one, so the trainer would publish deltas in another "
            "dtype than the engines serve, and a delta is patched in byte for byte; set engine.dtype "
            "(e.g. bfloat16), or use weight_sync.type: object_store"
        )

    def _check_flash_precision(self) -> None:
        """Refuse flash-attn kernels on a float32 forward: they take only bfloat16/float16 inputs, and transformers
        would only warn at load and fail inside the first forward. A forward is in half precision when the
        weights are (``model.dtype``), under autocast (``trainer.compute_dtype``, one process) or under FSDP2's
        mixed precision (``trainer.mixed_precision: bf16``, several ranks)."""
        model, trainer = self.model, self.trainer
        if model.attn_implementation not in FLASH_ATTENTION or model.dtype != "float32":
            return
        if trainer.num_workers > 1:
            if trainer.mixed_precision == "bf16":
                return
            instead = "trainer.mixed_precision: bf16"
        else:
            if trainer.compute_dtype != "float32":
                return
            instead = "trainer.compute_dtype: bfloat16"
        raise ValueError(
            f"model.attn_implementation={model.attn_implementation!r} runs only in bfloat16/float16, but "
            f"model.dtype is 'float32' with no half-precision compute: set model.dtype: bfloat16, or {instead} "
            "(float32 weights, bfloat16 forward), or use model.attn_implementation: sdpa"
        )

    def _check_switch(self) -> None:
        """``runtime.switch`` (colocated sync, engines sleeping while the trainer trains) only where it is
        correct and built: refused by name elsewhere."""
        if not self.runtime.switch.enabled:
            return
        refusals = {
            "controller.mode": (
                self.controller.mode == "sync",
                f"{self.controller.mode!r}: only sync never generates while the trainer trains",
            ),
            "runtime.colocate": (self.runtime.colocate != "never", "'never' contradicts it"),
            "rollout.num_engines": (
                self.runtime.type == "inline" or self.rollout.num_engines == self.trainer.num_workers,
                f"{self.rollout.num_engines} with trainer.num_workers={self.trainer.num_workers} on Ray: "
                "trainer rank i publishes colocated blocks to engine i, the one in its bundle (blocks only "
                "that bundle's machine and device can open), so one engine per rank",
            ),
            "engine.backend": (
                self.engine.backend == "builtin",
                f"{self.engine.backend!r}: the vLLM worker sleeps and wakes (engine.vllm sleep mode) but "
                "colocated weights into vLLM are not built; the built-in engine runs the switch",
            ),
            "weight_sync.type": (
                self.weight_sync.type in ("auto", "colocated"),
                f"{self.weight_sync.type!r}: colocated engines take weights by 'colocated' (or auto)",
            ),
        }
        for name, (ok, why) in refusals.items():
            if not ok:
                raise ValueError(f"runtime.switch.enabled cannot run with {name}={why}")

    def _fill_vllm_lora(self) -> None:
        """With ``trainer.lora`` on vLLM, let its worker serve adapters of that rank, and refuse what its LoRA
        path cannot do."""
        lora, engine = self.trainer.lora, self.engine
        if lora is None or engine.backend != "vllm":
            return
        if mode_spec(self.controller.mode).partial_rollouts:
            raise ValueError(
                "trainer.lora with engine.backend=vllm cannot run controller.mode='partial_rollout': a vLLM "
                "request keeps the adapter it started with, so an update could not reach it mid-generation"
            )
        if self.weight_sync.transport_for(self.runtime.type) == "broadcast":
            raise ValueError(
                "trainer.lora with engine.backend=vllm needs weight_sync.type object_store (or auto): "
                "adapters reach vLLM's LoRA support as files, not through the broadcast group"
            )
        if engine.vllm.max_lora_rank == 0:
            vllm = replace(engine.vllm, max_lora_rank=lora.rank)
            object.__setattr__(self, "engine", replace(engine, vllm=vllm))
        elif engine.vllm.max_lora_rank < lora.rank:
            raise ValueError(
                f"engine.vllm.max_lora_rank={engine.vllm.max_lora_rank} is below trainer.lora.rank={lora.rank}"
            )

    def _fill_vllm_request_seeds(self) -> None:
        """vLLM samples with per-request seeds only where the run asks for determinism (they cost speed)."""
        vllm = self.engine.vllm
        if vllm.request_seeds is None:
            vllm = replace(vllm, request_seeds=self.deterministic)
            object.__setattr__(self, "engine", replace(self.engine, vllm=vllm))

    def _fill_eval_chat_template_kwargs(self) -> None:
        """An eval set with a task of its own prompts the same model: it renders with the run's
        ``task.chat_template_kwargs`` unless it sets its own."""
        kwargs = self.task.chat_template_kwargs
        sets = self.controller.eval_sets
        if not kwargs or all(s.task is None or s.task.chat_template_kwargs for s in sets):
            return
        filled = [
            s
            if s.task is None or s.task.chat_template_kwargs
            else replace(s, task=replace(s.task, chat_template_kwargs=kwargs))
            for s in sets
        ]
        object.__setattr__(self, "controller", replace(self.controller, eval_sets=filled))

    def _check_unset(self, sections: tuple[str, ...], owner: str) -> None:
        for section in sections:
            if getattr(self, section) is not None:
                raise ValueError(
                    f"{section} is set but producer is {self.producer!r}; it applies only to producer {owner!r}"
                )

    def _fill_agentic(self) -> None:
        """Fill ``env`` and ``env_manager`` with their defaults, then refuse what an agentic run would ignore."""
        object.__setattr__(self, "env", self.env or EnvConfig())
        object.__setattr__(self, "env_manager", self.env_manager or EnvManagerConfig())
        assert self.env_manager is not None
        for key, value, default, instead in self._rlvr_only_settings():
            if value != default:
                raise ValueError(f"{key} is set but producer is 'agentic', which does not read it: {instead}")
        check_env_manager_fits(
            self.env_manager, self.rollout.num_return_sequences, self.rollout.rollout_batch_size
        )
        self._check_context_fits(self.env_manager.max_context_tokens)

    def _check_context_fits(self, context_tokens: int) -> None:
        """An episode's whole context must fit one engine request, or its late turns would fail."""
        for key in ("max_model_len", "max_kv_tokens"):
            limit = getattr(self.engine, key)
            if limit is not None and context_tokens > limit:
                raise ValueError(
                    f"env_manager.max_context_tokens={context_tokens} must be <= engine.{key}={limit}: "
                    "a whole episode context must fit one engine request"
                )

    def _rlvr_only_settings(self) -> list[tuple[str, object, object, str]]:
        """(key, value, default, what replaces it) of every setting the agentic producer does not read."""
        rollout, defaults = self.rollout, RolloutConfig()
        return [
            ("task", self.task, TaskConfig(), "episodes come from the env section"),
            ("reward", self.reward, RewardConfig(), "the env's steps give the rewards"),
            (
                "rollout.max_additional_running_prompts",
                rollout.max_additional_running_prompts,
                defaults.max_additional_running_prompts,
                "redundant env groups are env_manager.num_env_groups beyond rollout.rollout_batch_size",
            ),
            (
                "rollout.generation",
                rollout.generation,
                defaults.generation,
                "env_manager.stepping chooses async or batch",
            ),
            (
                "rollout.prompt_replication",
                rollout.prompt_replication,
                defaults.prompt_replication,
                "every episode's turns are requests of their own",
            ),
        ]


PRODUCERS = ("rlvr", "agentic", "external")


def load_run_config(path: str | os.PathLike[str] | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a run config from a YAML file (None: defaults only) with dotted overrides such as ``engine.seed=3``."""
    return load_config(RunConfig, path, overrides)
