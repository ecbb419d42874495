"""YAML files and dotted command-line overrides (``trainer.lr=1e-5``) into a typed config.

Key decision: YAML is read with YAML 1.2 core-schema scalars, not PyYAML's default 1.1 ones, so ``1e-5`` is a
float (1.1 reads a string), and ``yes``/``no``/``on``/``off`` stay strings (1.1 reads booleans: a country code
``no`` would become False). Only ``true``/``false`` are booleans. Dumping quotes any string that would read
back as something else, so ``to_yaml`` -> ``from_yaml`` gives back an equal config.
"""

from __future__ import annotations

import copy
import os
import re
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

import yaml

from asyncrl.config.base import (
    ConfigError,
    field_types,
    from_dict,
    section_type,
    to_dict,
    type_name,
    unknown_key_error,
)

T = TypeVar("T")

_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_REPLACED_TAGS = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema booleans, integers and floats."""


class _Yaml12Dumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly the strings ``_Yaml12Loader`` would not read back as strings."""


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)  # base 10 even with leading zeros: "010" is 10, not YAML 1.1's octal 8


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).lower()
    return float(text.replace(".inf", "inf").replace(".nan", "nan"))


def _install_yaml12_scalars(cls: type) -> None:
    cls.yaml_implicit_resolvers = {
        first: [(tag, regex) for tag, regex in resolvers if tag not in _REPLACED_TAGS]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    cls.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
    cls.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
    cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789"))


_install_yaml12_scalars(_Yaml12Loader)
_install_yaml12_scalars(_Yaml12Dumper)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML text with YAML 1.2 scalars; a syntax error becomes a one-line ``ConfigError``."""
    try:
        return yaml.load(text, Loader=_Yaml12Loader)
    except yaml.YAMLError as err:
        raise ConfigError(f"cannot parse YAML in {source}: {' '.join(str(err).split())}") from err


def dump_yaml(data: Any) -> str:
    """YAML text of plain data (dicts keep their order) that ``parse_yaml`` reads back equal."""
    return yaml.dump(
        data, Dumper=_Yaml12Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def read_yaml_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping at the top of a YAML file; an empty file is an empty mapping."""
    try:
        with open(path, encoding="utf-8") as f:
            data = parse_yaml(f.read(), str(path))
    except FileNotFoundError as err:
        raise ConfigError(f"config file not found: {path}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys at the top, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and its value, parsed as YAML (``[1, 2]``, ``null``, ``1e-5``)."""
    key, sep, raw_value = text.partition("=")
    path = key.strip().split(".")
    if not sep or not all(path):
        raise ConfigError(f"override {text!r} must look like key.subkey=value")
    return path, parse_yaml(raw_value, f"override {text!r}")


def apply_overrides(cls: type, data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``data`` with each override set, after checking its key path exists in the ``cls`` tree."""
    result = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        _check_override_path(cls, path, text)
        _set_nested(result, path, value)
    return result


def load_config(cls: type[T], path: str | os.PathLike[str] | None, overrides: Sequence[str] = ()) -> T:
    """Read a YAML file (None: all defaults), apply dotted overrides, and build the typed config ``cls``."""
    data = read_yaml_file(path) if path is not None else {}
    return from_dict(cls, apply_overrides(cls, data, overrides))


def to_yaml(config: Any) -> str:
    """The YAML text of a config; loading it back gives an equal config."""
    return dump_yaml(to_dict(config))


def _check_override_path(cls: type, path: list[str], text: str) -> None:
    """Walk the type tree along ``path``: through sections by field name, through dicts by any key."""
    tp: Any = cls
    for depth, name in enumerate(path):
        parent = ".".join(path[:depth])
        section = section_type(tp)
        if section is not None:
            fields = field_types(section)
            if name not in fields:
                raise ConfigError(f"override {text!r}: {unknown_key_error(name, parent, section)}")
            tp = fields[name]
        elif tp is Any or tp is dict or typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1] if typing.get_args(tp) else Any
        else:
            raise ConfigError(f"override {text!r}: '{parent}' is of type {type_name(tp)} and has no sub-keys")


def _set_nested(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for name in path[:-1]:
        if not isinstance(node.get(name), dict):
            node[name] = {}  # a missing or null section becomes a mapping holding the override
        node = node[name]
    node[path[-1]] = value
