"""The generic dict -> dataclass converter: every accepted shape and every error message, exactly."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Literal

import pytest

from asyncrl.config.base import (
    ConfigError,
    KeyDoc,
    attribute_docs,
    from_dict,
    iter_key_docs,
    to_dict,
    type_name,
)


@dataclass(frozen=True, kw_only=True)
class Inner:
    """A nested section."""

    rate: float = 0.5
    """Learning rate of the inner part."""
    mode: Literal["fast", "slow"] = "fast"
    """How it runs."""

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"inner.rate must be > 0, got {self.rate}")


@dataclass(frozen=True, kw_only=True)
class Outer:
    """The root of a test tree."""

    name: str
    """Required name."""
    count: int = 1
    flag: bool = False
    """A switch."""
    limit: int | None = None
    """Optional limit;
    spans two lines."""
    sizes: tuple[int, ...] = ()
    pair: tuple[int, str] = (0, "")
    words: list[str] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    extra: Inner | None = None
    """An optional section."""


def test_builds_nested_tree_with_defaults_and_conversions():
    data = {
        "name": "x",
        "sizes": [1, 2],
        "pair": [3, "b"],
        "weights": {"a": 1, "b": 0.5},
        "inner": {"rate": 2},
        "extra": {"mode": "slow"},
    }
    cfg = from_dict(Outer, data)
    assert cfg == Outer(
        name="x",
        sizes=(1, 2),
        pair=(3, "b"),
        weights={"a": 1.0, "b": 0.5},
        inner=Inner(rate=2.0),
        extra=Inner(mode="slow"),
    )
    assert type(cfg.inner.rate) is float and type(cfg.weights["a"]) is float


def test_to_dict_gives_back_plain_data_that_rebuilds_the_same_config():
    cfg = Outer(name="x", sizes=(1,), pair=(2, "y"), words=["w"], extra=Inner(rate=3.0))
    plain = to_dict(cfg)
    assert (
        plain["sizes"] == [1]
        and plain["pair"] == [2, "y"]
        and plain["extra"] == {"rate": 3.0, "mode": "fast"}
    )
    assert from_dict(Outer, plain) == cfg


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "x", "cont": 2}, "unknown key 'cont' (did you mean 'count'?)"),
        ({"name": "x", "inner": {"rte": 1.0}}, "unknown key 'inner.rte' (did you mean 'inner.rate'?)"),
        ({"name": "x", "inner": {"zzz": 1}}, "unknown key 'inner.zzz'; valid keys here: rate, mode"),
        ({"name": "x", "mode": "slow"}, "unknown key 'mode' (did you mean 'inner.mode'?)"),
        ({}, "missing required key 'name'"),
        ({"name": 3}, "name must be of type str, got int 3"),
        ({"name": "x", "count": 1.0}, "count must be of type int, got float 1.0"),
        ({"name": "x", "count": True}, "count must be of type int, got bool True"),
        ({"name": "x", "flag": "yes"}, "flag must be of type bool, got str 'yes'"),
        ({"name": "x", "flag": 1}, "flag must be of type bool, got int 1"),
        ({"name": "x", "limit": "5"}, "limit must be of type int | None, got str '5'"),
        ({"name": "x", "sizes": 3}, "sizes must be of type list, got int 3"),
        ({"name": "x", "sizes": [1, "2"]}, "sizes[1] must be of type int, got str '2'"),
        ({"name": "x", "pair": [1]}, "pair must be a list of 2 items, got 1: [1]"),
        ({"name": "x", "weights": {"a": "b"}}, "weights.a must be of type float, got str 'b'"),
        ({"name": "x", "inner": 3}, "inner must be of type mapping of keys, got int 3"),
        (
            {"name": "x", "inner": {"mode": "slw"}},
            "inner.mode must be one of 'fast', 'slow', got 'slw' (did you mean 'slow'?)",
        ),
        ({"name": "x", "inner": {"mode": "zz"}}, "inner.mode must be one of 'fast', 'slow', got 'zz'"),
        ({"name": "x", "inner": {"rate": -1}}, "inner.rate must be > 0, got -1.0"),
        ({"name": "x", "extra": {"rate": "a"}}, "extra.rate must be of type float, got str 'a'"),
    ],
)
def test_errors_name_the_dotted_key(data, message):
    with pytest.raises(ConfigError) as info:
        from_dict(Outer, data)
    assert str(info.value) == message


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_literal_compares_type_as_well_as_value():
    @dataclass(frozen=True, kw_only=True)
    class Choice:
        level: Literal[1, 2] = 1

    assert from_dict(Choice, {"level": 2}) == Choice(level=2)
    with pytest.raises(ConfigError, match="level must be one of 1, 2, got True"):
        from_dict(Choice, {"level": True})


def test_union_of_several_types_tries_each():
    @dataclass(frozen=True, kw_only=True)
    class Either:
        value: int | str = 0

    assert from_dict(Either, {"value": "a"}).value == "a"
    with pytest.raises(ConfigError, match=r"^value must be of type int \| str, got 1.5 \("):
        from_dict(Either, {"value": 1.5})


def test_attribute_docs_reads_the_string_under_each_field():
    docs = attribute_docs(Outer)
    assert docs["name"] == "Required name."
    assert docs["limit"] == "Optional limit;\nspans two lines."
    assert "count" not in docs and "sizes" not in docs


def test_iter_key_docs_expands_sections_in_place():
    docs = iter_key_docs(Outer)
    assert [d.key for d in docs] == [
        "name", "count", "flag", "limit", "sizes", "pair", "words", "weights",
        "inner.rate", "inner.mode", "extra", "extra.rate", "extra.mode",
    ]  # fmt: skip
    assert docs[0] == KeyDoc(key="name", type_name="str", default=dataclasses.MISSING, doc="Required name.")
    assert docs[8] == KeyDoc(
        key="inner.rate", type_name="float", default=0.5, doc="Learning rate of the inner part."
    )
    assert docs[10] == KeyDoc(key="extra", type_name="Inner | None", default=None, doc="An optional section.")


def test_type_name_writes_annotations_readably():
    assert type_name(int | None) == "int | None"
    assert type_name(tuple[int, ...]) == "tuple[int, ...]"
    assert type_name(dict[str, float]) == "dict[str, float]"
    assert type_name(Literal["a", "b"]) == "Literal['a', 'b']"


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_enums_load_by_value_and_save_as_values():
    @dataclass(frozen=True, kw_only=True)
    class Paint:
        color: Color = Color.RED

    assert from_dict(Paint, {"color": "blue"}) == Paint(color=Color.BLUE)
    assert to_dict(Paint(color=Color.BLUE)) == {"color": "blue"}
    with pytest.raises(ConfigError, match="^color must be one of 'red', 'blue', got 'green'$"):
        from_dict(Paint, {"color": "green"})
