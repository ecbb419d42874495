"""The engine a training config runs, as the simulator's keys, so that ``asyncrl plan`` with
``memory.train_config`` simulates the engine whose memory it plans.

Key decisions:
- The built-in engine (``cost.kv: reserved``) is carried as it is: its slots (``engine.max_running_requests``),
  KV budget (``engine.max_kv_tokens``) and context cap (``engine.max_model_len``) become the simulated engine's,
  whose admission is the real one (``engine.admission``), so the simulation runs as many requests at once as
  the run would, and the memory plan holds the slots the run preallocates, admitted or not (``asyncrl doctor``
  says when some never are).
- vLLM (``cost.kv: paged``) is carried as its own settings: ``max_num_seqs`` slots in the KV its
  ``gpu_memory_utilization`` leaves beside the weights (``sim.derive`` sizes that KV), and the context cap.
- An explicit simulator key that says otherwise is refused, naming both values: the plan and the simulation
  would describe two engines.
"""

from __future__ import annotations

from typing import Any

from asyncrl.config.engine import EngineConfig


def simulated_engine_keys(engine: EngineConfig) -> dict[str, Any]:
    """The simulator keys (dotted path → value) of ``engine``, a training config's ``engine`` section."""
    if engine.backend == "builtin":
        keys: dict[str, Any] = {
            "cost.kv": "reserved",
            "engine.max_running_requests": engine.max_running_requests,
            "engine.max_kv_tokens": engine.max_kv_tokens,
        }
    elif engine.backend == "vllm":
        keys = {
            "cost.kv": "paged",
            "cost.max_num_seqs": engine.vllm.max_num_seqs,
            "cost.memory_utilization": engine.vllm.gpu_memory_utilization,
        }
    else:
        raise ValueError(f"engine.backend={engine.backend!r} has no simulated engine")
    if engine.max_model_len is not None:
        keys["engine.max_model_len"] = engine.max_model_len
    return keys


def with_run_engine(data: dict[str, Any], engine: EngineConfig, source: str) -> dict[str, Any]:
    """Simulator ``data`` (a config's nested keys) with ``engine``'s keys set where ``data`` leaves them unset;
    ``ValueError`` naming the key when ``data`` sets one to another value (``source``: where ``engine`` is
    from, for the message)."""
    merged = {
        section: dict(values) if isinstance(values, dict) else values for section, values in data.items()
    }
    for dotted, value in simulated_engine_keys(engine).items():
        section, key = dotted.split(".")
        given = merged.setdefault(section, {})
        if key in given and given[key] != value:
            raise ValueError(
                f"{dotted}={given[key]!r} disagrees with {source}'s engine ({dotted}={value!r} there): the plan "
                f"would check one engine's memory and simulate another; drop {dotted}, or change {source}"
            )
        given[key] = value
    return merged
