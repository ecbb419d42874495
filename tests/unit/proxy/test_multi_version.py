"""The multi-version orchestrator: partition arithmetic (exact) and migration over scripted engines."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from asyncrl.proxy.errors import EngineFailure
from asyncrl.proxy.multi_version import EngineView, MultiVersionProxy, Switch, plan_switches, target_partition
from asyncrl.proxy.recompute_migration import RecomputeMigration, migratable
from asyncrl.sim.clock import run_seeds, run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, expected_tokens, make_request
from asyncrl.types import FinishReason


@pytest.mark.parametrize(
    ("loads", "num_engines", "newest", "expected"),
    [
        ({0: 1, 1: 3}, 4, 1, {0: 1, 1: 3}),
        ({0: 1, 1: 8, 2: 6}, 8, 2, {0: 1, 1: 4, 2: 3}),  # floors 1,1,1; 5 by 1:8:6 → 0,2,2 + remainder to v1
        ({0: 4}, 2, 1, {0: 1, 1: 1}),  # the newest always gets an engine when there is one to give
        ({0: 2, 1: 0}, 4, 2, {0: 3, 2: 1}),  # v1 has no work: no engine; the newest has none yet either
        ({}, 3, 5, {5: 3}),
        ({0: 5, 1: 5, 2: 1}, 2, 2, {0: 1, 1: 1, 2: 0}),  # legacy work first: the newest waits for a drain
        ({0: 1, 1: 1}, 3, 1, {0: 1, 1: 2}),  # a tie in remainders goes to the newer version
    ],
)
def test_target_partition_is_proportional_with_floors(loads, num_engines, newest, expected) -> None:
    target = target_partition(loads, num_engines, newest)
    assert target == expected
    assert sum(target.values()) == num_engines


def views(*specs: tuple[int, int]) -> list[EngineView]:
    return [EngineView(index=i, version=v, num_requests=n) for i, (v, n) in enumerate(specs)]


def test_plan_switches_donates_the_least_loaded_engine_to_the_least_loaded_receiver() -> None:
    engines = views((0, 5), (0, 1), (0, 3))
    assert plan_switches(engines, {0: 2, 1: 1}, 1, None) == [Switch(index=1, moves=((2, 1),))]
    assert plan_switches(engines, {0: 2, 1: 1}, 1, 4) == [Switch(index=1, moves=((2, 1),))]
    assert plan_switches(engines, {0: 2, 1: 1}, 1, 3) == []  # no receiver has a free slot: nothing moves


def test_plan_switches_spreads_requests_and_frees_idle_engines_first() -> None:
    engines = views((0, 0), (0, 2), (0, 2), (0, 0), (1, 7))
    plan = plan_switches(engines, {0: 1, 1: 4}, 1, None)
    assert plan == [Switch(index=0, moves=()), Switch(index=3, moves=()), Switch(index=1, moves=((2, 2),))]
    assert plan_switches(views((0, 1), (1, 0)), {0: 1, 1: 1}, 1, None) == []  # at target already


async def update(proxy: MultiVersionProxy, version: int) -> None:
    await proxy.suspend()
    await proxy.model_update({"w": version}, version)
    await proxy.resume()


async def migration_scenario(
    clients: Callable[[list[FakeEngine]], list] = list,
) -> tuple[MultiVersionProxy, list[FakeEngine], list, object, list[int]]:
    """Four requests on two engines; an update mid-way moves one engine's requests to the other. ``clients``
    turns the fake engines into what the proxy drives (themselves by default)."""
    engines = [FakeEngine(lengths=20, step_s=1.0) for _ in range(2)]
    proxy = MultiVersionProxy(clients(engines), async_ratio=1.0, clock=asyncio.get_running_loop().time)
    old = [
        asyncio.ensure_future(proxy.generate(make_request(f"old{i}", max_new_tokens=20))) for i in range(4)
    ]
    await asyncio.sleep(5.5)
    await update(proxy, 1)
    await proxy.update_applied(1)
    versions_during = sorted(proxy.versions())
    new = await proxy.generate(make_request("new", max_new_tokens=20))
    return proxy, engines, [await call for call in old], new, versions_during


def test_update_moves_one_engine_to_the_newest_version_and_migrates_its_requests() -> None:
    proxy, engines, old, new, versions_during = run_shuffled(migration_scenario, seed=0)
    for generation in old:  # continued on the other engine, identical to an uninterrupted run, all at v0
        tokens, logprobs = expected_tokens(generation.request_id, 20)
        assert (generation.token_ids, generation.logprobs) == (tokens, logprobs)
        assert generation.versions == [0] * 20 and generation.finish_reason is FinishReason.LENGTH
    assert new.versions == [1] * 20
    assert versions_during == [0, 1]
    assert proxy.versions() == [1, 1]  # the legacy engine followed once its work was done
    donor, receiver = (0, 1) if engines[0].exported else (1, 0)
    assert len(engines[donor].exported) == 2 and sorted(engines[receiver].imported) == sorted(
        engines[donor].exported
    )
    assert [request.version for request in engines[donor].received][-1] == 1
    stats = proxy.stats()
    assert (stats["num_migrations"], stats["num_switches"], stats["max_versions_alive"]) == (2, 2, 2)


def test_migration_schedules_conserve_every_request_and_its_version() -> None:
    async def one(seed: int) -> None:
        proxy, _, old, new, _ = await migration_scenario()
        assert all(g.versions == [0] * 20 and g.finish_reason is FinishReason.LENGTH for g in old)
        assert new.versions == [1] * 20
        assert proxy.stats()["num_calls"] == 0

    assert run_seeds(one, range(200)) == 200


async def window_scenario() -> tuple[list[int], dict]:
    """α = 0: version 1 becomes the newest only once every version-0 request has ended."""
    engines = [FakeEngine(lengths={"long": 30, "new": 3}, step_s=1.0) for _ in range(2)]
    proxy = MultiVersionProxy(engines, async_ratio=0.0, clock=asyncio.get_running_loop().time)
    long_call = asyncio.ensure_future(proxy.generate(make_request("long", max_new_tokens=30)))
    await asyncio.sleep(2.5)
    await update(proxy, 1)
    new = asyncio.ensure_future(proxy.generate(make_request("new", max_new_tokens=3)))
    await asyncio.sleep(5.0)
    held_while_old_ran = proxy.stats()["num_held"]
    await long_call
    await new
    return [held_while_old_ran, new.result().versions[0]], proxy.stats()


def test_window_waits_for_the_oldest_version_before_serving_the_new_one() -> None:
    (held, new_version), stats = run_shuffled(window_scenario, seed=1)
    assert (held, new_version) == (1, 1)
    assert stats["num_window_waits"] == 1 and stats["max_versions_alive"] == 1


def test_abort_reaches_a_request_on_its_engine_and_a_held_one() -> None:
    async def scenario():
        engines = [FakeEngine(lengths=50, step_s=1.0)]
        proxy = MultiVersionProxy(engines, clock=asyncio.get_running_loop().time)
        running = asyncio.ensure_future(proxy.generate(make_request("run", max_new_tokens=50)))
        await asyncio.sleep(3.5)
        await proxy.suspend()
        held = asyncio.ensure_future(proxy.generate(make_request("held")))
        await asyncio.sleep(0)
        partial = await proxy.abort("run")
        empty = await proxy.abort("held")
        return partial, await running, empty, await held

    partial, running, empty, held = run_shuffled(scenario, seed=2)
    assert partial.finish_reason is FinishReason.ABORT and running.token_ids == partial.token_ids
    assert len(running.token_ids) == 3
    assert empty.token_ids == [] and held.finish_reason is FinishReason.ABORT


@pytest.mark.parametrize("migration", ["kv", "recompute"])
def test_real_engines_migrate_and_continue_token_identical(migration: str) -> None:
    """Two AsyncEngines on a tiny random Qwen2: the update moves engine 0's requests to engine 1, with their KV
    or (as for vLLM) as prefixes the receiver prefills again; either way the tokens are those of an
    uninterrupted run."""
    from test_proxy_real_engine import tiny_qwen2

    from asyncrl.config.engine import EngineConfig
    from asyncrl.engine import make_engine
    from asyncrl.engine.llm_engine import LLMEngine
    from asyncrl.types import Request, SamplingParams

    config = EngineConfig(max_running_requests=8, max_kv_tokens=1024)

    def request(i: int) -> Request:
        sampling = SamplingParams(max_new_tokens=100, ignore_eos=True, seed=i)
        return Request(request_id=f"r{i}", prompt_token_ids=[5 + i, 6, 7], sampling=sampling)

    reference = LLMEngine(tiny_qwen2(0), None, config)
    for i in range(4):
        reference.add_request(request(i))
    expected = {}
    while reference.has_work():
        expected.update({g.request_id: g.token_ids for g in reference.step()})

    async def scenario():
        engines = [make_engine(tiny_qwen2(0), None, config) for _ in range(2)]
        try:
            clients = engines if migration == "kv" else [RecomputeMigration(e) for e in engines]
            proxy = MultiVersionProxy(clients, async_ratio=1.0, slots_per_engine=8)
            calls = [asyncio.ensure_future(proxy.generate(request(i))) for i in range(4)]
            while min(e.core.num_generated_tokens for e in engines) < 6:
                await asyncio.sleep(0.001)
            await asyncio.gather(*(e.pause() for e in engines))  # hold every request mid-generation
            await proxy.suspend()
            await proxy.model_update(tiny_qwen2(1).state_dict(), 1)
            await proxy.resume()
            await proxy.update_applied(1)
            await engines[1].resume()
            return await asyncio.gather(*calls), proxy.stats()
        finally:
            for engine in engines:
                engine.shutdown()

    generations, stats = asyncio.run(scenario())
    assert {g.request_id: g.token_ids for g in generations} == expected
    assert all(g.versions == [0] * 100 for g in generations)
    assert stats["num_migrations"] == 2 and (stats["kv_bytes_moved"] > 0) == (migration == "kv")
    assert [e["version"] for e in stats["engines"]] == [1, 0]


def test_a_switch_that_fails_reaches_update_applied() -> None:
    async def scenario():
        proxy = MultiVersionProxy([FakeEngine(fail_control=frozenset({"update_weights"}))])
        await update(proxy, 1)
        with pytest.raises(EngineFailure, match="update_weights"):
            await proxy.update_applied(1)
        return proxy.healthy_engines()

    assert run_shuffled(scenario, seed=3) == []


async def spread_scenario() -> list[int]:
    engines = [FakeEngine(lengths=4, step_s=1.0) for _ in range(3)]
    proxy = MultiVersionProxy(engines, async_ratio=1.0, clock=asyncio.get_running_loop().time)
    calls = [asyncio.ensure_future(proxy.generate(make_request(f"r{i}", max_new_tokens=4))) for i in range(7)]
    await asyncio.sleep(0.5)
    in_flight = [engine["in_flight"] for engine in proxy.stats()["engines"]]
    await asyncio.gather(*calls)
    proxy.close()
    return in_flight


def test_requests_go_to_the_least_loaded_engine_through_the_load_index() -> None:
    for seed in range(3):
        assert run_shuffled(spread_scenario, seed=seed) == [3, 2, 2]  # ties go to the lower index


async def after_update_scenario() -> tuple[list[int], int]:
    """Six calls held through a weight update while engine 0 switches first and engine 1 is still busy."""
    engines = [FakeEngine(lengths=4, step_s=1.0), FakeEngine(lengths=30, step_s=1.0)]
    proxy = MultiVersionProxy(
        engines, async_ratio=1.0, slots_per_engine=2, clock=asyncio.get_running_loop().time
    )
    busy = asyncio.ensure_future(proxy.generate(make_request("old", max_new_tokens=30)))
    await asyncio.sleep(0.5)
    await proxy.suspend()
    await proxy.model_update({"w": 1}, 1)
    calls = [asyncio.ensure_future(proxy.generate(make_request(f"r{i}", max_new_tokens=4))) for i in range(6)]
    await proxy.resume()
    peak = 0
    while not all(call.done() for call in calls):
        peak = max(peak, max(engine["in_flight"] for engine in proxy.stats()["engines"]))
        await asyncio.sleep(0.25)
    await busy
    proxy.close()
    return [g.versions[0] for g in (call.result() for call in calls)], peak


def test_held_calls_do_not_overfill_the_first_engine_at_the_new_version() -> None:
    """The gate sends a call only to an engine with a free slot: the rest wait instead of queueing on the
    engine that switched first (the simulator found that pile-up)."""
    for seed in range(5):
        versions, peak = run_shuffled(after_update_scenario, seed=seed)
        assert versions == [1] * 6
        assert peak <= 2


class PrefixOnlyEngine:
    """A FakeEngine seen only through the ``EngineClient`` protocol: no KV export, like vLLM."""

    def __init__(self, engine: FakeEngine) -> None:
        self.inner = engine
        self.generate, self.abort = engine.generate, engine.abort
        self.pause, self.update_weights, self.resume = engine.pause, engine.update_weights, engine.resume


def prefix_only_migratable(engines: list[FakeEngine]) -> list:
    """The engines as vLLM looks to the proxy (no KV export), made migratable the way the factory does it."""
    wrapped = [migratable(PrefixOnlyEngine(engine)) for engine in engines]
    assert all(isinstance(w, RecomputeMigration) for w in wrapped)
    return wrapped


def test_engines_without_kv_export_migrate_by_recomputing_the_prefix_under_every_schedule() -> None:
    """The multi-version contract holds when requests move as prefixes (vLLM's way): every old request ends
    identical to an uninterrupted run, all at v0, and the receiver prefilled what the donor had generated."""

    async def one(seed: int) -> None:
        proxy, _, old, new, _ = await migration_scenario(prefix_only_migratable)
        for generation in old:
            tokens, logprobs = expected_tokens(generation.request_id, 20)
            assert (generation.token_ids, generation.logprobs) == (tokens, logprobs)
            assert generation.versions == [0] * 20 and generation.finish_reason is FinishReason.LENGTH
        assert new.versions == [1] * 20
        stats = proxy.stats()
        assert stats["num_calls"] == 0 and stats["kv_bytes_moved"] == 0
        assert stats["num_migrations"] == 2

    assert run_seeds(one, range(200)) == 200


def test_an_engine_that_exports_kv_is_not_wrapped_unless_it_says_it_cannot() -> None:
    engine = FakeEngine(lengths=5)
    assert migratable(engine) is engine
    engine.exports_kv = False  # e.g. a Ray client whose actor runs vLLM
    assert isinstance(migratable(engine), RecomputeMigration)


def test_a_call_that_lets_go_of_its_migration_before_it_starts_still_gives_back_the_receivers_arrival() -> (
    None
):
    """A call that ends (cancelled at shutdown, or retried) in the tick its migration is started has dropped
    ``call.handoff`` before the migration task runs: the task resolves its own future, so the receiver's
    arrival count returns to 0 (a count left at 1 would keep that engine from ever switching version)."""

    async def scenario() -> int:
        engines = [FakeEngine(lengths=20, step_s=1.0) for _ in range(2)]
        proxy = MultiVersionProxy(engines, async_ratio=1.0, clock=asyncio.get_running_loop().time)
        running = asyncio.ensure_future(proxy.generate(make_request("r", max_new_tokens=20)))
        await asyncio.sleep(2.5)
        [call] = [call for calls in proxy._on_engine.values() for call in calls.values()]
        donor = call.worker
        receiver = next(worker for worker in proxy._workers if worker is not donor)
        assert proxy._send_requests(donor, ((receiver.index, 1),)) == 1
        proxy._forget_handoff(call)  # in the same tick, before the migration task's first step
        await running
        await asyncio.sleep(1.0)
        return proxy._arriving[receiver.index]

    assert run_shuffled(scenario, seed=3) == 0
