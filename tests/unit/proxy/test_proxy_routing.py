"""Routing decisions (pure) and the proxy config, with exact expected values."""

from __future__ import annotations

import pytest

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy.routing import AffinityTable, EngineLoad, LeastLoadedRouting, make_routing_policy


def mk(
    index: int,
    num_in_flight: int = 0,
    tokens: int = 0,
    *,
    version: int = 0,
    ready: bool = True,
    healthy: bool = True,
) -> EngineLoad:
    return EngineLoad(
        index=index,
        num_in_flight=num_in_flight,
        num_in_flight_tokens=tokens,
        version=version,
        ready=ready,
        healthy=healthy,
    )


def test_least_in_flight_wins():
    assert LeastLoadedRouting(0).choose([mk(0, 3), mk(1, 1), mk(2, 2)]) == 1


def test_tie_on_requests_goes_to_fewer_tokens_then_lower_index():
    routing = LeastLoadedRouting(0)
    assert routing.choose([mk(0, 2, 500), mk(1, 2, 300), mk(2, 2, 300)]) == 1
    assert routing.choose([mk(0, 1, 10), mk(1, 1, 10)]) == 0


def test_unhealthy_and_excluded_engines_are_skipped():
    routing = LeastLoadedRouting(0)
    assert routing.choose([mk(0, 0, healthy=False), mk(1, 5), mk(2, 7)]) == 1
    assert routing.choose([mk(0, 0), mk(1, 5), mk(2, 7)], excluded=frozenset({0, 1})) == 2
    assert routing.choose([mk(0, healthy=False)]) is None


def test_ready_engines_come_before_draining_ones_even_when_busier():
    assert LeastLoadedRouting(0).choose([mk(0, 0, version=2, ready=False), mk(1, 4, version=2)]) == 1


def test_newest_effective_version_comes_before_load():
    assert LeastLoadedRouting(0).choose([mk(0, 0, version=1), mk(1, 3, version=2)]) == 1


def test_pinned_version_only_goes_to_engines_at_that_version():
    routing = LeastLoadedRouting(0)
    loads = [mk(0, 0, version=1), mk(1, 3, version=2), mk(2, 1, version=2)]
    assert routing.choose(loads, pinned_version=1) == 0
    assert routing.choose(loads, pinned_version=2) == 2
    assert routing.choose(loads, pinned_version=3) is None


@pytest.mark.parametrize(
    ("owner_load", "slack", "expected"),
    [(3, 2, 0), (4, 2, 1), (2, 0, 1), (1, 0, 0)],
)
def test_affinity_owner_wins_within_slack(owner_load: int, slack: int, expected: int):
    # engine 0 owns the key with owner_load requests; engine 1 is the least loaded with 1 request.
    loads = [mk(0, owner_load), mk(1, 1), mk(2, 5)]
    assert LeastLoadedRouting(slack).choose(loads, affinity_owner=0) == expected


def test_affinity_never_sends_to_a_draining_or_older_engine():
    routing = LeastLoadedRouting(10)
    assert routing.choose([mk(0, 0, ready=False), mk(1, 1)], affinity_owner=0) == 1
    assert routing.choose([mk(0, 0, version=1), mk(1, 1, version=2)], affinity_owner=0) == 1
    assert routing.choose([mk(0, 0, healthy=False), mk(1, 1)], affinity_owner=0) == 1


def test_affinity_table_tracks_owner_while_key_in_flight():
    table = AffinityTable()
    table.add("p", 1)
    table.add("p", 1)
    table.add("p", 0)  # routed elsewhere: ownership unchanged
    assert table.owner("p") == 1
    table.remove("p", 0)
    table.remove("p", 1)
    assert table.owner("p") == 1
    table.remove("p", 1)
    assert table.owner("p") is None and len(table) == 0
    table.add(None, 0)
    assert table.owner(None) is None and len(table) == 0


def test_make_routing_policy_uses_the_configured_slack():
    policy = make_routing_policy(ProxyConfig(affinity_slack=5))
    assert isinstance(policy, LeastLoadedRouting) and policy.affinity_slack == 5


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"update_policy": "sometimes"}, "proxy.update_policy"),
        ({"affinity_slack": -1}, "proxy.affinity_slack"),
        ({"request_timeout_s": 0.0}, "proxy.request_timeout_s"),
        ({"control_timeout_s": -1.0}, "proxy.control_timeout_s"),
        ({"max_consecutive_failures": 0}, "proxy.max_consecutive_failures"),
        ({"max_continuations": -1}, "proxy.max_continuations"),
    ],
)
def test_config_validation_names_the_key(kwargs: dict[str, object], key: str):
    with pytest.raises(ValueError, match=key):
        ProxyConfig(**kwargs)  # type: ignore[arg-type]
