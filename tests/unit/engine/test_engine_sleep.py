"""A sleeping engine (colocated sync, ``runtime.switch``) frees its KV pool, and with level 2 its weights' device
memory, and wakes to serve exactly as before: a fresh pool, the same weights, requests in flight prefilled again."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from engine_testlib import drain, engine, request

from asyncrl.config.engine import EngineConfig
from asyncrl.engine import host_weights
from asyncrl.engine.kv_cache import KVCache
from asyncrl.engine.llm_engine import LLMEngine


def test_sleep_frees_the_kv_pool_and_wake_restores_it(qwen2) -> None:
    core = engine(qwen2)
    pool = core.runner.cache.resident_bytes()
    assert pool > 0
    held = weakref.ref(core.runner.cache.keys[0])
    assert core.sleep(1) == pool
    gc.collect()
    assert held() is None, "a layer's key pool is still referenced: the memory was not freed"
    assert core.stats()["kv_pool_bytes"] == 0 and core.stats()["asleep"] == 1
    assert core.wake() == pool
    assert core.stats()["kv_pool_bytes"] == pool and core.stats()["asleep"] == 0
    assert all(torch.count_nonzero(k) == 0 for k in core.runner.cache.keys)  # zeroed as when built


def test_a_woken_engine_generates_what_a_never_slept_one_does(qwen2) -> None:
    prompts = {f"r{i}": [3 + i, 7, 11, 2 * i + 1] for i in range(3)}
    never = engine(qwen2)
    for rid, prompt in prompts.items():
        never.add_request(request(rid, prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True))
    want = {rid: g.token_ids for rid, g in drain(never).items()}

    slept = engine(qwen2)
    for level in (1, 2):
        slept.sleep(level)
        slept.wake()
    for rid, prompt in prompts.items():
        slept.add_request(request(rid, prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True))
    assert {rid: g.token_ids for rid, g in drain(slept).items()} == want


def test_level_two_moves_the_weights_to_the_host_and_back_bit_equal(qwen2) -> None:
    core = engine(qwen2)
    before = {name: p.detach().clone() for name, p in core.model.named_parameters()}
    weights = sum(p.nbytes for p in core.model.parameters())
    pool = core.runner.cache.resident_bytes()
    assert core.sleep(2) == pool + weights
    core.wake()
    for name, param in core.model.named_parameters():
        assert torch.equal(param, before[name]), name


def test_level_two_sleeps_allocate_their_host_copies_once_and_every_wake_is_bit_equal(qwen2, monkeypatch):
    """Each level-2 sleep used to take a fresh (on CUDA pinned) copy of the model, pinned anew at every step of a
    colocated switch (the decode captures after each wake empty PyTorch's pinned cache): now the host buffer is
    allocated at the first sleep and later sleeps copy into it, the weights an update brought in between
    included, and every wake serves them bit for bit."""
    allocations: list[int] = []
    allocate = host_weights.allocate_host
    monkeypatch.setattr(
        host_weights, "allocate_host", lambda nbytes: allocations.append(nbytes) or allocate(nbytes)
    )
    core = engine(copy.deepcopy(qwen2))
    params = dict(core.model.named_parameters())
    weights = sum(p.nbytes for p in params.values())
    expected = {name: p.detach().clone() for name, p in params.items()}
    held = None
    for sleep in range(3):
        core.sleep(2)
        if held is None:
            held = {name: p.data_ptr() for name, p in params.items()}
        assert {name: p.data_ptr() for name, p in params.items()} == held, f"sleep {sleep}: copied elsewhere"
        core.wake()
        for name, param in params.items():
            assert torch.equal(param, expected[name]), (sleep, name)
            assert param.data_ptr() != held[name], "awake weights alias the host buffer"
        with torch.no_grad():  # an update while awake: the next sleep must hold it
            for name, param in params.items():
                param.add_(1.0)
                expected[name] = param.detach().clone()
    assert len(allocations) == 1 and weights <= allocations[0] < weights + 256 * len(params)
    assert core.stats()["host_weight_bytes"] == allocations[0]


def test_requests_in_flight_are_prefilled_again_after_wake(qwen2) -> None:
    core = engine(qwen2)
    core.add_request(request("a", [5, 6, 7], max_new_tokens=6, ignore_eos=True))
    core.step()
    core.sleep(1)
    assert core.step() == [] and core.scheduler.kv_tokens_cached == 0  # asleep: nothing runs, no KV kept
    core.wake()
    assert len(drain(core)["a"].token_ids) == 6


def test_bad_levels_and_double_sleep_are_refused_by_name(qwen2) -> None:
    core = engine(qwen2)
    with pytest.raises(ValueError, match="sleep level must be 1"):
        core.sleep(3)
    core.sleep(1)
    with pytest.raises(RuntimeError, match="already asleep"):
        core.sleep(1)
    assert core.wake() > 0 and core.wake() == 0
    assert (core.stats()["num_sleeps"], core.stats()["num_wakes"]) == (1, 1)  # a refused call counts nothing


@pytest.mark.parametrize("level", [1, 2])
def test_an_engine_started_asleep_never_allocates_its_kv_pool_and_wakes_to_serve_as_one_built_awake(
    qwen2, monkeypatch, level
) -> None:
    """A replacement started while a colocated trainer trains (``runtime.switch``) must not take the KV pool
    mid-step: built asleep, it allocates no pool until woken (level 2: its weights in host memory too), then
    serves exactly as an engine built awake."""
    prompts = {f"r{i}": [3 + i, 7, 11, 2 * i + 1] for i in range(3)}
    never = engine(qwen2)
    pool = never.runner.cache.resident_bytes()
    for rid, prompt in prompts.items():
        never.add_request(request(rid, prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True))
    want = {rid: g.token_ids for rid, g in drain(never).items()}
    weights = sum(p.nbytes for p in qwen2.parameters())

    allocated = []
    restore = KVCache.restore
    monkeypatch.setattr(KVCache, "restore", lambda cache: allocated.append(cache) or restore(cache))
    core = engine(qwen2, asleep=level)
    assert allocated == [], "the KV pool was allocated by an engine built asleep"
    assert core.stats()["kv_pool_bytes"] == 0 and core.stats()["asleep"] == level
    for rid, prompt in prompts.items():
        core.add_request(request(rid, prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True))
    assert core.step() == [] and core.scheduler.kv_tokens_cached == 0  # asleep: nothing runs
    assert core.wake() == pool + (weights if level == 2 else 0)  # level 2: the weights came from the host
    assert len(allocated) == 1 and core.stats()["kv_pool_bytes"] == pool
    assert (core.stats()["num_sleeps"], core.stats()["num_wakes"]) == (1, 1)  # sleeps and wakes pair up
    assert {rid: g.token_ids for rid, g in drain(core).items()} == want


def test_an_engine_refuses_a_bad_start_level_by_name(qwen2) -> None:
    with pytest.raises(ValueError, match=r"sleep level must be 0 \(awake\), 1 .* got 3"):
        engine(qwen2, asleep=3)


@pytest.mark.parametrize("level", [1, 2])
def test_an_engine_started_asleep_takes_a_weight_update_before_it_wakes(qwen2, level) -> None:
    """A replacement started asleep may catch up while it sleeps (the update it is lent then): woken, it serves
    the updated weights exactly as an awake engine given the same update."""
    generator = torch.Generator().manual_seed(3)
    update = [
        (name, (p.detach().cpu() + 0.01 * torch.randn(p.shape, generator=generator)).to(p.dtype))
        for name, p in qwen2.named_parameters()
    ]
    prompts = {f"r{i}": [3 + i, 7, 11] for i in range(2)}

    def served(core) -> dict[str, list[int]]:
        for rid, prompt in prompts.items():
            core.add_request(request(rid, prompt, max_new_tokens=6, temperature=0.0, ignore_eos=True))
        return {rid: g.token_ids for rid, g in drain(core).items()}

    original = {name: p.detach().clone() for name, p in qwen2.named_parameters()}
    try:
        awake = engine(qwen2)
        awake.update_weights(update, 1)
        want = served(awake)
        with torch.no_grad():
            for name, p in qwen2.named_parameters():
                p.copy_(original[name])
        asleep = engine(qwen2, asleep=level)
        asleep.update_weights(update, 1)
        asleep.wake()
        assert asleep.version == 1 and served(asleep) == want
    finally:
        with torch.no_grad():
            for name, p in qwen2.named_parameters():
                p.data = original[name].to(p.device)


DEVICE = torch.device("meta")
"""The accelerator's twin on a CPU-only machine: a device that is not host memory (and holds no bytes, so an
engine placed there is built and inspected, never woken: ``param.data`` cannot be set across to it)."""


def test_a_model_in_host_memory_starts_asleep_at_level_two_with_its_weights_left_there(qwen2) -> None:
    """A replacement started at level 2 under ``runtime.switch`` is loaded into host memory, not onto its device
    (``engine.load_engine_model``): built asleep, its weights stay where they were loaded, for its wake to move
    to the runner's device, as a level-2 sleep would have left them; its buffers (rotary frequencies), its
    runner and its KV pool's device are the device's, the pool unallocated."""
    model = copy.deepcopy(qwen2).cpu()
    loaded = {name: p.detach().clone() for name, p in model.named_parameters()}
    core = LLMEngine(
        model, None, EngineConfig(max_running_requests=2, max_kv_tokens=64), asleep=2, device=DEVICE
    )
    assert {p.device.type for p in core.model.parameters()} == {"cpu"}, (
        "weights on the device before the wake"
    )
    assert all(torch.equal(p, loaded[name]) for name, p in core.model.named_parameters())
    assert {b.device for b in core.model.buffers()} == {DEVICE} and core.runner.device == DEVICE
    assert core.stats()["asleep"] == 2 and core.stats()["kv_pool_bytes"] == 0
    assert core.stats()["num_sleeps"] == 1  # paired with its first wake, as a start asleep on the device


@pytest.mark.parametrize("level", [0, 1])
def test_a_model_in_host_memory_serves_elsewhere_only_from_a_level_two_start(qwen2, level) -> None:
    """Awake or at level 1 the engine serves where its weights are: a model elsewhere is refused by name."""
    with pytest.raises(
        ValueError, match=f"serves on meta only when its engine starts asleep at level 2.*{level}"
    ):
        LLMEngine(copy.deepcopy(qwen2).cpu(), None, EngineConfig(), asleep=level, device=DEVICE)


def test_a_level_two_host_start_wakes_onto_the_device_under_test_and_serves_as_an_engine_built_there(
    qwen2,
) -> None:
    """The real wake of a replacement loaded into host memory: pinned there on CUDA, moved to the device under
    test by its first wake, then serving the tokens an engine built on that device serves. On CPU host and
    device coincide; the GPU kit's unit section runs it with ``ASYNCRL_TEST_DEVICE=cuda``."""
    prompts = {f"r{i}": [5 + i, 9, 13] for i in range(3)}

    def served(core: LLMEngine) -> dict[str, list[int]]:
        for rid, prompt in prompts.items():
            core.add_request(request(rid, prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True))
        return {rid: g.token_ids for rid, g in drain(core).items()}

    built_there = engine(copy.deepcopy(qwen2))
    want, device = served(built_there), next(built_there.model.parameters()).device  # cuda:0, not cuda
    model = copy.deepcopy(qwen2).cpu()
    config = EngineConfig(
        max_running_requests=4, max_kv_tokens=1024, max_prefill_tokens_per_step=16, dtype="float32"
    )
    core = LLMEngine(model, None, config, asleep=2, device=device)
    assert {p.device.type for p in core.model.parameters()} == {"cpu"}
    if device.type == "cuda":
        assert all(p.is_pinned() for p in core.model.parameters()), "host weights not pinned for their wake"
    core.wake()
    assert {p.device for p in core.model.parameters()} == {device}
    assert served(core) == want
