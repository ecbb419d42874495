"""LLMProxy: one ``await generate(request)`` over many engine workers (routing, timeouts, health, weight updates)."""

from asyncrl.proxy.errors import EngineFailure, EnginesLost, NoHealthyEngine, ProxyClosed, RequestTimeout
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.proxy.routing import EngineLoad, LeastLoadedRouting, RoutingPolicy, make_routing_policy
from asyncrl.proxy.worker import EngineClient

__all__ = [
    "EngineClient",
    "EngineFailure",
    "EngineLoad",
    "EnginesLost",
    "LLMProxy",
    "LeastLoadedRouting",
    "NoHealthyEngine",
    "ProxyClosed",
    "RequestTimeout",
    "RoutingPolicy",
    "make_routing_policy",
]
