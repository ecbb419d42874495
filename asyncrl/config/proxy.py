"""Configuration of the LLMProxy: routing, timeouts, engine health and recovery, the weight-update policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asyncrl.config.deadlines import bytes_deadline_s

UPDATE_POLICIES = ("in_flight", "drain")


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """How the proxy spreads requests over engine workers and moves them to new weights."""

    update_policy: Literal["in_flight", "drain"] | None = None
    """``drain``: each engine applies an update once its in-flight requests have finished, so every
    generation comes from exactly one version (``sync``, ``one_step_off``, ``async`` modes). ``in_flight``:
    suspend pauses every engine, the update lands mid-generation and in-flight requests continue under the new
    weights with per-token versions (``partial_rollout`` mode). None: the policy ``controller.mode`` needs
    (a proxy built outside a run drains)."""
    affinity_slack: int = 2
    """A request whose ``affinity_key`` is already served by an engine goes there if that engine has at most
    this many more in-flight requests than the least-loaded one; 0 keeps affinity only on ties."""
    request_timeout_s: float | None = None
    """Longest one engine call of a request may take; on expiry the request is aborted on the engine and
    ``RequestTimeout`` is raised. Time held at the proxy does not count, nor time the engines sleep under
    ``runtime.switch`` (``LLMProxy.suspend(engines_asleep=True)``); time the engine spends paused for an
    in-flight update does, so keep it well above an update's duration. None: no timeout."""
    control_timeout_s: float = 300.0
    """Longest an engine may take to answer pause, resume or abort before it is declared failed (and
    unhealthy). A weight update has a deadline of its own, sized by its bytes (``update_timeout_floor_s``)."""
    update_timeout_floor_s: float = 120.0
    """A weight update's deadline on one engine is this floor plus the update's bytes at
    ``update_timeout_gbps`` (in the proxy and in the Ray runtime's call to the engine actor): a model's update
    is never cut off by a deadline sized for a pause, and an engine that dies or wedges mid-update is still
    found (the update fails or passes its deadline, and the engine is replaced)."""
    update_timeout_gbps: float = 0.2
    """The conservative bandwidth (GB/s) an update's deadline assumes: at 0.2, Qwen3-8B in bf16 (16.4 GB)
    gets 120 + 82 s and in fp32 (32.8 GB) 120 + 164 s. An update slower than this is taken for a wedged
    engine: lower it for a slow link rather than raising the floor."""
    max_consecutive_failures: int = 3
    """An engine whose requests fail (raise or time out) this many times in a row is marked unhealthy and no
    longer receives requests."""
    retry_on_engine_failure: bool = False
    """Re-run a request whose engine failed on another healthy engine, whose version the proxy knows. Off by
    default: a failure then reaches the caller as ``EngineFailure``."""
    max_engine_restarts: int = 8
    """How many times each engine may be killed and replaced after it died or wedged (``proxy.recovery``;
    only where the runtime can start engines: ``runtime.inline`` with the built-in engine, Ray). Its requests
    are re-routed and the replacement receives the latest weights before any of them. 0: a failed engine
    stays unhealthy."""
    health_check_interval_s: float | None = 30.0
    """With recovery: probe every engine this often, which finds one that is alive but silent; None: probe an
    engine only after one of its calls failed."""
    health_check_timeout_s: float = 30.0
    """A health probe unanswered after this long counts as a hang: the engine is replaced."""
    max_continuations: int = 32
    """Most times one request is transparently continued after an abort it did not ask for (``in_flight``
    policy); past it, the partial generation is returned with ``finish_reason="abort"``."""

    def __post_init__(self) -> None:
        if self.update_policy is not None and self.update_policy not in UPDATE_POLICIES:
            raise ValueError(
                f"proxy.update_policy must be one of {UPDATE_POLICIES}, got {self.update_policy!r}"
            )
        if self.affinity_slack < 0:
            raise ValueError(f"proxy.affinity_slack must be >= 0, got {self.affinity_slack}")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError(f"proxy.request_timeout_s must be > 0 or None, got {self.request_timeout_s}")
        if self.control_timeout_s <= 0:
            raise ValueError(f"proxy.control_timeout_s must be > 0, got {self.control_timeout_s}")
        for name in ("update_timeout_floor_s", "update_timeout_gbps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"proxy.{name} must be > 0, got {getattr(self, name)}")
        if self.max_consecutive_failures < 1:
            raise ValueError(
                f"proxy.max_consecutive_failures must be >= 1, got {self.max_consecutive_failures}"
            )
        if self.max_engine_restarts < 0:
            raise ValueError(f"proxy.max_engine_restarts must be >= 0, got {self.max_engine_restarts}")
        for name in ("health_check_interval_s", "health_check_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"proxy.{name} must be > 0, got {value}")
        if self.max_continuations < 0:
            raise ValueError(f"proxy.max_continuations must be >= 0, got {self.max_continuations}")

    def update_timeout_s(self, nbytes: int) -> float:
        """The deadline of one engine's weight update of ``nbytes`` bytes (``update_timeout_floor_s``)."""
        return bytes_deadline_s(self.update_timeout_floor_s, self.update_timeout_gbps, nbytes)
