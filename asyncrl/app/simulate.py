"""``simulate(config)``: asyncrl's own producer, buffer, proxy and controller against cost-model workers.

Key decision: nothing is re-implemented. The run is wired by the same functions as a real one
(``app.wiring``), with ``SimEngine``s behind the proxy (``MultiVersionProxy`` in ``multi_version`` mode, else ``LLMProxy``),
a ``SimTrainer`` behind the controller and simulated rewards,
tokenizer and (agentic producer) environments behind the producer, on an event loop whose clock jumps to
the next timer whenever every task waits (``asyncrl.sim.clock``, FIFO order, virtual time). No real
sleeping happens anywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

from asyncrl.app.wiring import Producer, Proxy, make_buffer, make_controller, make_producer
from asyncrl.buffer.sample_buffer import SampleBuffer
from asyncrl.config.sim import SimConfig
from asyncrl.controller.controller import StepRecord
from asyncrl.data.base import TaskSample
from asyncrl.metrics.timeline import Timeline
from asyncrl.proxy.factory import proxy_for_mode
from asyncrl.rollout.agentic_producer import AgenticProducer, make_env_seed_source
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.rollout.rlvr_producer import RLVRProducer
from asyncrl.sim.clock import run_shuffled
from asyncrl.sim.engine import SimEngine
from asyncrl.sim.env_cost import SimEnvTokenizer, make_sim_env_factory
from asyncrl.sim.gc_pause import gc_paused
from asyncrl.sim.result import SimResult, SimRun, build_result, is_steady
from asyncrl.sim.workers import SimRewards, SimTokenizer, SimTrainer
from asyncrl.sim.workload import LengthModel, PassRates

NO_TIMEOUT_S = 1e9
"""Virtual seconds used for every timeout of the real parts: a simulated wait never times out."""


def simulate(config: SimConfig, *, pause_gc: bool = True) -> SimResult:
    """Run ``config.controller.num_steps`` simulated training steps and measure them.

    The cyclic garbage collector is paused during the run (``pause_gc=False`` keeps it), see ``gc_pause``.
    """
    wall_start = time.perf_counter()
    with gc_paused(pause_gc):
        run = run_shuffled(lambda: _run(config), seed=None, virtual_time=True)
    return build_result(config, run, wall_s=time.perf_counter() - wall_start)


async def _run(config: SimConfig) -> SimRun:
    loop = asyncio.get_running_loop()
    timeline = Timeline(enabled=config.timeline == "full")
    engines = make_engines(config, timeline)
    proxy = make_proxy(config, engines, loop.time)
    buffer = make_buffer(
        replace(config.buffer, get_batch_timeout_s=NO_TIMEOUT_S, admission_timeout_s=NO_TIMEOUT_S),
        config.rollout,
        producer=config.producer,
        env_manager=config.env_manager,
    )
    producer = make_sim_producer(config, proxy, buffer, timeline)
    trainer = SimTrainer(
        config.trainer,
        config.num_train_gpus,
        timeline,
        engines_busy=lambda: any(engine.generating for engine in engines),
    )
    step_ends: list[float] = []
    settled = asyncio.Event()
    steady = config.steady_state

    def on_step(record: StepRecord) -> None:
        step_ends.append(loop.time())
        buffer.take_dropped()  # counts stay in the accounting; the records would only hold memory
        if steady.enabled and is_steady(
            step_ends, steady.warmup_steps, steady.window_steps, steady.tolerance
        ):
            settled.set()

    controller = make_controller(
        config.controller, buffer=buffer, producer=producer, trainer=trainer, proxy=proxy, on_step=on_step
    )
    await controller.run(config.controller.num_steps, stop=settled)
    stats = proxy.stats()
    proxy.close()
    dropped = buffer.accounting().num_dropped
    return SimRun(trainer, engines, step_ends, timeline, stats, *producer_counts(producer, engines, dropped))


def make_proxy(config: SimConfig, engines: list[SimEngine], clock: Callable[[], float]) -> Proxy:
    """The proxy a real run of the mode gets (``asyncrl.proxy.factory``), on the loop's clock; control calls
    never time out."""
    return proxy_for_mode(
        engines,
        replace(config.proxy, control_timeout_s=NO_TIMEOUT_S),
        config.controller.mode,
        async_ratio=config.buffer.async_ratio,
        slots_per_engine=config.engine.max_running_requests,
        clock=clock,
    )


def make_engines(config: SimConfig, timeline: Timeline) -> list[SimEngine]:
    lengths = LengthModel(config.lengths, config.rollout.max_new_tokens, config.seed)
    return [
        SimEngine(config.engine, lengths, name=f"engine{i}", timeline=timeline)
        for i in range(config.rollout.num_engines)
    ]


def make_sim_producer(config: SimConfig, proxy: Proxy, buffer: SampleBuffer, timeline: Timeline) -> Producer:
    """The real producer ``config.producer`` names (``app.wiring``), over simulated rewards, tokenizer and
    environments (which record their spans on ``timeline``)."""
    pass_rates = PassRates(config.reward, config.seed)
    if config.producer == "agentic":
        return make_producer(
            "agentic",
            source=make_env_seed_source(config.num_prompts, config.seed),
            proxy=proxy,
            buffer=buffer,
            tokenizer=SimEnvTokenizer(),
            rollout=config.rollout,
            seed=config.seed,
            env_manager=config.env_manager,
            make_env=make_sim_env_factory(
                config.env, config.prompt_tokens, pass_rates, config.seed, timeline
            ),
        )
    return make_producer(
        "rlvr",
        source=PromptSource(make_samples(config.num_prompts), seed=config.seed),
        proxy=proxy,
        buffer=buffer,
        tokenizer=SimTokenizer(config.prompt_tokens),
        rollout=config.rollout,
        seed=config.seed,
        rewards=SimRewards(pass_rates, config.reward.latency_s),
    )


def producer_counts(
    producer: RLVRProducer | AgenticProducer, engines: list[SimEngine], dropped: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """(producer counts, drop counts); an agentic run adds its episode ends and env replacements to the
    drop counts (reported as ``dropped_episodes_*`` and ``dropped_env_replaced``)."""
    if isinstance(producer, RLVRProducer):
        return dict(producer.counts), dropped
    counts = dict(producer.counts) | {"requests": sum(e.counts["requests"] for e in engines)}
    episode_drops = {f"episodes_{k}": producer.counts[k] for k in ("aborted", "failed", "filtered")}
    return counts, dropped | episode_drops | {"env_replaced": producer.num_env_replacements}


def make_samples(num_prompts: int) -> list[TaskSample]:
    return [TaskSample(uid=f"q{i}", prompt="", answer="") for i in range(num_prompts)]
