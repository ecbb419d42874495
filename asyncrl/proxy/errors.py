"""The errors the proxy raises: each names the request and/or engine involved, so a log line is actionable."""

from __future__ import annotations


class ProxyClosed(RuntimeError):
    """The proxy was closed; every call waiting in it (held, draining, on an engine) fails with this."""


class NoHealthyEngine(RuntimeError):
    """No healthy engine can serve the request (all unhealthy, or none at the version it is pinned to)."""


class EnginesLost(NoHealthyEngine):
    """Every engine is out for good (dropped, or its replacement failed): no request can be served again, so
    the run cannot go on (``ProxyShell.engines_lost``)."""


class EngineFailure(RuntimeError):
    """An engine raised (or did not answer) while serving a request or a control call; the cause is chained."""

    def __init__(self, engine_index: int, operation: str, request_id: str | None = None) -> None:
        self.engine_index = engine_index
        self.operation = operation
        self.request_id = request_id
        subject = f"request {request_id!r}" if request_id is not None else "the proxy"
        super().__init__(f"engine {engine_index} failed {operation} for {subject}")


class RequestTimeout(TimeoutError):
    """One engine call of a request ran past ``proxy.request_timeout_s``; it was aborted on that engine."""

    def __init__(self, request_id: str, engine_index: int, timeout_s: float) -> None:
        self.request_id = request_id
        self.engine_index = engine_index
        self.timeout_s = timeout_s
        super().__init__(f"request {request_id!r} timed out after {timeout_s} s on engine {engine_index}")


class EngineReclaimed(EngineFailure):
    """The request's engine was found dead or wedged and is being replaced; the call was taken back from it
    (``proxy.recovery``), so the proxy serves the request again elsewhere."""
