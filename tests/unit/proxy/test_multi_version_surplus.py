"""``has_surplus`` (the partition's O(versions) early exit) never skips a switch: ``plan_switches`` moves an
engine only when it says a legacy version has more engines than its target."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.proxy.multi_version import EngineView, has_surplus, plan_switches, target_partition

NEWEST = 3

engines = st.lists(st.tuples(st.integers(0, NEWEST), st.integers(0, 5)), min_size=1, max_size=10)
loads = st.dictionaries(st.integers(0, NEWEST), st.integers(0, 20), max_size=NEWEST + 1)


@settings(max_examples=400, deadline=None)
@given(engines=engines, loads=loads, slots=st.sampled_from([None, 2, 5]))
def test_plan_switches_moves_an_engine_only_where_has_surplus_says(engines, loads, slots) -> None:
    views = [EngineView(index=i, version=v, num_requests=n) for i, (v, n) in enumerate(engines)]
    target = target_partition(loads, len(views), NEWEST)
    surplus = has_surplus(Counter(v.version for v in views), target, NEWEST)
    switches = plan_switches(views, target, NEWEST, slots)
    assert surplus or not switches


def test_has_surplus_reads_legacy_versions_only() -> None:
    target = {1: 1, 2: 1}
    assert has_surplus({1: 2, 2: 1}, target, newest=2)  # v1 holds two engines for a target of one
    assert not has_surplus({1: 1, 2: 3}, target, newest=2)  # the newest may hold more than its target
    assert has_surplus({0: 1, 1: 1, 2: 1}, target, newest=2)  # v0 has no target left
