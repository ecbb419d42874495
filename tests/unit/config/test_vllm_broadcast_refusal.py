"""The weight broadcast into a vLLM engine sharded over several GPUs is refused at config time, naming why and
the transport to use instead (each tensor-parallel worker would join the group as the engine's one rank)."""

from __future__ import annotations

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.run import load_run_config

BROADCAST_INTO_VLLM = [
    "engine.backend=vllm",
    "runtime.type=local",
    "weight_sync.type=broadcast",
    "proxy.max_engine_restarts=0",
]


def test_broadcast_into_tensor_parallel_vllm_is_refused_with_the_transport_to_use():
    with pytest.raises(ConfigError, match="tensor_parallel_size=2.*use weight_sync.type: object_store"):
        load_run_config(None, [*BROADCAST_INTO_VLLM, "engine.vllm.tensor_parallel_size=2"])
    assert load_run_config(None, BROADCAST_INTO_VLLM).weight_sync.type == "broadcast"  # one GPU: allowed
    tensor_parallel = ["engine.backend=vllm", "runtime.type=local", "engine.vllm.tensor_parallel_size=2"]
    assert (
        load_run_config(None, tensor_parallel).engine.vllm.tensor_parallel_size == 2
    )  # object_store: allowed
