"""The broadcast group on real Ray actors: a member that never joins is left out within the deadline and the
others still get every update; delta and colocated updates reach engine actors bit for bit."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
import ray

from asyncrl.config.run import load_run_config
from asyncrl.runtime.ray_runtime import build_ray_parts, ray_session

pytestmark = pytest.mark.ray

TIMEOUT_S = 4.0


@ray.remote(num_cpus=0)
class NeverJoins:
    """An engine actor that answers its probe but never joins a weight group (wedged in the join)."""

    def ready(self) -> dict:
        return {}

    def join_weight_group(self, *args: object) -> None:
        time.sleep(3600)


class NeverJoinsClient:
    def __init__(self) -> None:
        self.handle = NeverJoins.remote()
        self.name = "never-joins"


def config(tiny_path, tmp_path, transport: str):
    overrides = [
        f"model.path={tiny_path}",
        "model.device=cpu",
        f"output_dir={tmp_path}",
        "runtime.type=local",
        "runtime.rollout_num_cpus=1",
        "runtime.train_num_cpus=1",
        f"weight_sync.type={transport}",
        f"weight_sync.timeout_s={TIMEOUT_S}",
    ]
    return load_run_config(None, overrides)


@pytest.fixture(scope="module")
def session():
    run = load_run_config(
        None, ["runtime.type=local", "runtime.rollout_num_cpus=1", "runtime.train_num_cpus=1"]
    )
    with ray_session(run.runtime) as live:
        yield live


@pytest.mark.slow  # waits out the join deadline on purpose (14 s); the unit deadline tests stay
def test_a_member_that_never_joins_is_left_out_within_the_deadline(session, tiny_path, tmp_path):
    run = config(tiny_path, tmp_path, "broadcast")
    parts = build_ray_parts(run, run.runtime)
    try:
        group = parts.engine_factory.weight_group
        real = parts.engines[0]
        group.engines.append(NeverJoinsClient())
        started = time.monotonic()
        group.form()
        took = time.monotonic() - started
        assert [member.name for member in group.members] == [real.name]
        assert took < 2 * (TIMEOUT_S + 5) + 10, f"forming took {took:.0f} s"
        group.engines.pop()  # the next publish forms once more, with the engine that answers
        update = parts.trainer.state_for_sync()
        asyncio.run(real.update_weights(update, update.version))
    finally:
        parts.close()


@pytest.mark.parametrize("transport", ["delta", "colocated", "broadcast"])
def test_delta_colocated_and_streamed_updates_reach_an_engine_actor_exactly(
    session, tiny_path, tmp_path, transport
):
    """Rollout, a train step, then the sync through ``transport``: the engine actor generates with exactly the
    trained weights (its log-probs are the trainer's, computed from what the transport carried). The broadcast
    runs streamed (sync mode, built-in engine: each bucket applied as it arrives), and what it carried is read
    back from trainer rank 0's packed copy of it."""
    from test_ray_runtime import greedy, groups_from, sampled, trainer_logprobs

    from asyncrl.config.proxy import ProxyConfig
    from asyncrl.proxy.llm_proxy import LLMProxy
    from asyncrl.weight_sync.transports import FlatBufferSync, make_weight_sync

    parts = build_ray_parts(
        config(tiny_path, tmp_path, transport), config(tiny_path, tmp_path, transport).runtime
    )

    async def rollout_train_sync():
        proxy = LLMProxy(parts.engines, ProxyConfig(), initial_version=0)
        generations = await asyncio.gather(*(proxy.generate(r) for r in sampled(4)))
        groups = groups_from(generations, [1.0, 0.0, 0.0, 1.0], 0)
        await asyncio.to_thread(parts.trainer.train_step, groups, 0)
        update = await asyncio.to_thread(parts.trainer.state_for_sync)
        await proxy.model_update(update, 1)
        await proxy.update_applied(1, timeout_s=60)
        generation = await proxy.generate(greedy(1))
        proxy.close()
        return update, generation

    try:
        update, generation = asyncio.run(rollout_train_sync())
        assert update.transport == transport and update.nbytes > 0
        if transport == "broadcast":
            assert parts.config.broadcast_apply() == "streamed"
            carried = parts.engine_factory.weight_group.catch_up(update)  # rank 0's copy, in the object store
            sync = FlatBufferSync(get=ray.get)
        else:
            carried, sync = update, make_weight_sync(transport)
        trained = {name: t.clone() for name, t in sync.receive(carried)}
    finally:
        parts.close()
    assert generation.versions == [1] * len(generation.token_ids)
    model = replace(parts.config.model)
    assert generation.logprobs == pytest.approx(trainer_logprobs(trained, model, generation), abs=1e-4)
