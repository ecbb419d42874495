"""YAML 1.2 scalars, dotted overrides, and the YAML round trip of configs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.config.base import ConfigError, from_dict
from asyncrl.config.loader import (
    apply_overrides,
    dump_yaml,
    load_config,
    parse_override,
    parse_yaml,
    to_yaml,
)


@dataclass(frozen=True, kw_only=True)
class Opt:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)


@dataclass(frozen=True, kw_only=True)
class Root:
    name: str = "run"
    steps: int = 10
    opt: Opt = field(default_factory=Opt)
    maybe: Opt | None = None
    tags: dict[str, int] = field(default_factory=dict)


def test_yaml_reads_core_schema_scalars():
    text = (
        "a: 1e-5\nb: yes\nc: no\nd: true\ne: 010\nf: 0x1F\ng: -.inf\nh: 1_000\ni: 1:20\nj: ~\nk: 2.\nl: Off\n"
    )
    data = parse_yaml(text)
    assert data == {
        "a": 1e-5, "b": "yes", "c": "no", "d": True, "e": 10, "f": 31, "g": -math.inf,
        "h": "1_000", "i": "1:20", "j": None, "k": 2.0, "l": "Off",
    }  # fmt: skip
    assert type(data["e"]) is int and type(data["k"]) is float


def test_dump_quotes_strings_that_would_read_back_as_other_types():
    data = {"a": "1e-5", "b": "true", "c": "010", "d": "null", "e": "yes", "f": 1e-5, "g": [1, "2"]}
    assert parse_yaml(dump_yaml(data)) == data


def test_yaml_syntax_error_is_one_line_config_error():
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: [1, 2", "cfg.yaml")
    assert str(info.value).startswith("cannot parse YAML in cfg.yaml: ")
    assert "\n" not in str(info.value)


def test_parse_override_splits_path_and_parses_value():
    assert parse_override("opt.lr=1e-5") == (["opt", "lr"], 1e-5)
    assert parse_override("opt.betas=[0.8, 0.9]") == (["opt", "betas"], [0.8, 0.9])
    assert parse_override("name=a=b") == (["name"], "a=b")
    assert parse_override("maybe=null") == (["maybe"], None)
    for bad in ("opt.lr", "=3", "opt..lr=1"):
        with pytest.raises(ConfigError, match="must look like key.subkey=value"):
            parse_override(bad)


def test_overrides_set_nested_keys_without_touching_the_input():
    data = {"opt": {"lr": 0.1}, "maybe": None}
    result = apply_overrides(Root, data, ["opt.lr=0.2", "maybe.lr=3", "tags.x=1", "steps=5"])
    assert result == {"opt": {"lr": 0.2}, "maybe": {"lr": 3}, "tags": {"x": 1}, "steps": 5}
    assert data == {"opt": {"lr": 0.1}, "maybe": None}
    assert from_dict(Root, result) == Root(steps=5, opt=Opt(lr=0.2), maybe=Opt(lr=3.0), tags={"x": 1})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("opt.lrr=1", "override 'opt.lrr=1': unknown key 'opt.lrr' (did you mean 'opt.lr'?)"),
        ("stps=1", "override 'stps=1': unknown key 'stps' (did you mean 'steps'?)"),
        ("lr=1", "override 'lr=1': unknown key 'lr' (did you mean 'opt.lr'?)"),
        ("tags.a.b=1", "override 'tags.a.b=1': 'tags.a' is of type int and has no sub-keys"),
        ("steps.x=1", "override 'steps.x=1': 'steps' is of type int and has no sub-keys"),
        ("maybe.zz=1", "override 'maybe.zz=1': unknown key 'maybe.zz'; valid keys here: lr, betas"),
    ],
)
def test_override_on_unknown_path_is_an_error(override, message):
    with pytest.raises(ConfigError) as info:
        apply_overrides(Root, {}, [override])
    assert str(info.value) == message


def test_load_config_reads_file_then_applies_overrides(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("name: exp\nopt:\n  lr: 1e-4\n")
    assert load_config(Root, path, ["opt.betas=[0, 1]"]) == Root(
        name="exp", opt=Opt(lr=1e-4, betas=(0.0, 1.0))
    )
    assert load_config(Root, None) == Root()


def test_load_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: "):
        load_config(Root, tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="must hold a mapping of keys at the top, got list"):
        load_config(Root, tmp_path / "list.yaml")
    (tmp_path / "empty.yaml").write_text("")
    assert load_config(Root, tmp_path / "empty.yaml") == Root()
    (tmp_path / "bad.yaml").write_text("opt:\n  lr: fast\n")
    with pytest.raises(ConfigError, match="^opt.lr must be of type float, got str 'fast'$"):
        load_config(Root, tmp_path / "bad.yaml")


# Control characters other than newline and tab are left out: PyYAML folds some of them (NEL, U+0085) into
# line breaks, and no config needs them.
_TEXT = st.text(st.characters(exclude_categories=("Cc", "Cs"), include_characters="\n\t"), max_size=20)


@settings(deadline=None)  # a pause of the loaded CI box is not a slow example
@given(
    name=_TEXT,
    steps=st.integers(),
    lr=st.floats(allow_nan=False, allow_infinity=False),  # non-finite floats are refused (test_config_fuzz)
    tags=st.dictionaries(_TEXT, st.integers(), max_size=3),
)
def test_yaml_round_trip_gives_the_same_config(name, steps, lr, tags):
    cfg = Root(name=name, steps=steps, opt=Opt(lr=lr), maybe=Opt(), tags=tags)
    assert from_dict(Root, parse_yaml(to_yaml(cfg))) == cfg
