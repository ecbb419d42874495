"""``RleSequence`` behaves exactly as the list it stands for, under every operation the real code applies to it."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.rle import RleSequence, kept, starts_with

parts = st.lists(
    st.one_of(
        st.tuples(st.just("runs"), st.integers(-2, 2), st.integers(0, 5)),
        st.tuples(st.just("literal"), st.lists(st.integers(-2, 2), max_size=5)),
    ),
    max_size=6,
)


def build(spec: list[tuple]) -> tuple[RleSequence[int], list[int]]:
    """A ``RleSequence`` joined from ``spec`` with ``+`` (and ``list + runs``), and the list it stands for."""
    runs: RleSequence[int] = RleSequence()
    expected: list[int] = []
    for kind, *args in spec:
        if kind == "runs":
            value, count = args
            runs = runs + RleSequence.repeat(value, count)
            expected += [value] * count
        else:
            (values,) = args
            runs = runs + values
            expected += values
    return runs, expected


@settings(deadline=None)  # a pause of the loaded CI box is not a slow example
@given(parts, st.lists(st.integers(-2, 2), max_size=4))
def test_runs_equals_the_list_it_stands_for(spec: list[tuple], head: list[int]) -> None:
    runs, expected = build(spec)
    assert len(runs) == len(expected)
    assert list(runs) == expected
    assert runs == expected and expected == runs
    joined = head + runs
    assert isinstance(joined, RleSequence) and joined == head + expected
    for index in range(-len(expected), len(expected)):
        assert runs[index] == expected[index]


@settings(deadline=None)
@given(parts, st.integers(-8, 8), st.integers(-8, 8), st.sampled_from([None, 1, 2, -1]))
def test_slices_are_lists_equal_to_the_list_slices(
    spec: list[tuple], start: int, stop: int, step: int | None
) -> None:
    runs, expected = build(spec)
    sliced = runs[start:stop:step]
    assert isinstance(sliced, list)
    assert sliced == expected[start:stop:step]


def test_from_runs_keeps_order_and_counts() -> None:
    versions = RleSequence.from_runs([[3, 2], [4, 1]])
    assert list(versions) == [3, 3, 4]
    assert versions[0] == 3 and versions[-1] == 4
    values = [5, 6]
    literal = RleSequence(values)
    values.append(7)  # the constructor copies: a list mutated afterwards does not change it
    assert literal == [5, 6] and len(RleSequence()) == 0


def test_index_out_of_range_and_inequality() -> None:
    runs = RleSequence.repeat(0, 3)
    with pytest.raises(IndexError):
        runs[3]
    with pytest.raises(IndexError):
        runs[-4]
    assert runs != [0, 0] and runs != [0, 0, 1] and runs != "000"
    with pytest.raises(ValueError, match="count >= 0"):
        RleSequence.repeat(0, -1)


def test_pickles_as_the_same_sequence() -> None:
    """Trajectories cross process boundaries (Ray actors) with their loss masks."""
    runs = [7, 8] + RleSequence.from_runs([(0, 2), (1, 3)])
    restored = pickle.loads(pickle.dumps(runs))
    assert isinstance(restored, RleSequence) and restored == [7, 8, 0, 0, 1, 1, 1]


def test_kept_copies_a_list_and_keeps_runs_as_they_are() -> None:
    """A prefix kept for a continuation: a list the caller mutates later must not change it; runs are immutable."""
    values = [1, 2]
    copy = kept(values)
    values.append(3)
    assert copy == [1, 2] and isinstance(copy, list)
    runs = RleSequence.repeat(1, 512)
    assert kept(runs) is runs


def test_starts_with_by_shared_parts_or_item_by_item() -> None:
    prefix = [7, 8] + RleSequence.repeat(0, 1000)
    continued = prefix + RleSequence.repeat(1, 5)
    assert starts_with(continued, prefix)  # joined onto the prefix: its parts are the prefix's own
    assert starts_with(list(continued), list(prefix)) and starts_with(list(continued), prefix)
    assert starts_with(RleSequence(list(continued)), prefix)  # other parts: compared item by item
    assert not starts_with(RleSequence.repeat(1, 1005), prefix)
    assert not starts_with([7], [7, 8]) and starts_with([7, 8], [])
