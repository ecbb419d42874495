"""Hypothesis strategies shared by the fuzz tests: arbitrary values of every kind bad input takes.

Test-only (like the rest of ``asyncrl.testing``); imports hypothesis, which is a dev dependency.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=4),
)
"""One value of any plain type, edge cases included (NaN, inf, huge ints, bool, bytes, empty strings)."""

anything = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
    ),
    max_leaves=8,
)
"""Any value parsed data could hold, nested a few levels."""

edge_values = st.sampled_from(
    [float("nan"), float("inf"), -float("inf"), 0, -1, 0.0, -0.5, 2**63, True, False, "", " ", None, [], {}]
)
"""The values validation most often forgets: NaN, infinities, zero and negatives, bool for int, empties."""

values = st.one_of(edge_values, anything)
"""``anything``, with the edge cases drawn far more often than chance would draw them."""

json_like = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
"""A value JSON (and YAML) can hold, including NaN and infinities (Python's json reads and writes them)."""


def is_int(value: Any) -> bool:
    """An int that is not a bool (bool is an int subclass, but never means a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)
