"""Typed conversion between plain data (parsed YAML) and the frozen config dataclass tree.

Key decision: one generic, recursive converter driven by the dataclasses' type hints, so a new config
section needs no loader code. It is strict: unknown keys and wrong types are ``ConfigError``s naming the
dotted key (and the closest valid key); the only coercion is int -> float. A section class may define a
classmethod ``expand_data(data) -> data`` that rewrites its plain data before conversion (``loss.preset``
fills in the keys of a named recipe this way).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import enum
import functools
import inspect
import math
import textwrap
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")


class ConfigError(ValueError):
    """Bad configuration input: the message names the dotted key and, where it helps, the allowed values."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeyDoc:
    """Documentation of one leaf key of a config tree, as printed by ``asyncrl config docs``."""

    key: str
    """Dotted path, e.g. ``engine.max_kv_tokens``."""
    type_name: str
    """The field's type, written the way it is annotated (``int | None``)."""
    default: Any
    """The default value, or ``dataclasses.MISSING`` when the key is required."""
    doc: str
    """The attribute docstring written under the field (empty when there is none)."""


def from_dict(cls: type[T], data: Any, key: str = "") -> T:
    """Build the config dataclass ``cls`` from plain data, validating every key and type recursively.

    ``key`` is the dotted prefix used in error messages (empty for the root). Errors raised by a section's
    ``__post_init__`` (ValueError) come back as ``ConfigError`` with their message unchanged.
    """
    return _convert(data, cls, key)


def to_dict(config: Any) -> Any:
    """Plain-data form of a config (dicts, lists, scalars) that ``from_dict`` turns back into an equal config."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config) if f.init}
    if isinstance(config, enum.Enum):
        return config.value
    if isinstance(config, list | tuple):
        return [to_dict(item) for item in config]
    if isinstance(config, Mapping):
        return {k: to_dict(v) for k, v in config.items()}
    return config


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's init fields, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def unknown_key_error(key: str, parent: str, section: type) -> ConfigError:
    """The error for a key that ``section`` lacks, with the most likely intended key.

    A key the section lists in its ``REMOVED_KEYS`` (name → why it went) is named as removed, with why, so an
    old config learns what changed rather than a near miss. Otherwise the closest sibling (difflib) comes
    first; failing that, a deeper key with exactly this name (``lr`` written at the top instead of under
    ``trainer``); failing both, the list of valid keys.
    """
    removed = getattr(section, "REMOVED_KEYS", {})
    if key in removed:
        return ConfigError(f"key '{_join(parent, key)}' was removed: {removed[key]}; delete it")
    valid = list(field_types(section))
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    deeper = [d.key for d in iter_key_docs(section) if d.key.rsplit(".", 1)[-1] == key]
    full = _join(parent, key)
    if close or deeper:
        return ConfigError(f"unknown key '{full}' (did you mean '{_join(parent, (close or deeper)[0])}'?)")
    return ConfigError(f"unknown key '{full}'; valid keys here: {', '.join(valid)}")


def section_type(tp: Any) -> type | None:
    """The section class of a field typed ``Section`` or ``Section | None``; None for any other field."""
    if dataclasses.is_dataclass(tp):
        return tp
    if _is_union(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and dataclasses.is_dataclass(args[0]):
            return args[0]
    return None


def type_name(tp: Any) -> str:
    """Readable name of a type annotation: ``int``, ``float | None``, ``Literal['keep', 'recompute']``."""
    if tp is type(None):
        return "None"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if _is_union(tp):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    return getattr(tp, "__name__", repr(tp))


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a class: the string literal written right under each annotated field.

    Python keeps no such docstrings at run time, so they are read from the class's source with ``ast``.
    Returns an empty dict when the source is unavailable (e.g. a class defined in an interactive session).
    """
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    class_def = ast.parse(source).body[0]
    assert isinstance(class_def, ast.ClassDef)
    docs = {}
    for node, after in zip(class_def.body, class_def.body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _is_string(after):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def iter_key_docs(cls: type, prefix: str = "") -> list[KeyDoc]:
    """Documentation of every key of the config tree rooted at ``cls``, sections expanded in place.

    A section's own key is listed only when the section is optional (``Section | None``): that key can
    itself be set (to null).
    """
    docs = attribute_docs(cls)
    defaults = {f.name: _default_of(f) for f in dataclasses.fields(cls)}
    out: list[KeyDoc] = []
    for name, tp in field_types(cls).items():
        key = _join(prefix, name)
        section = section_type(tp)
        if section is None or section is not tp:  # a leaf, or an optional section: document the key itself
            out.append(
                KeyDoc(key=key, type_name=type_name(tp), default=defaults[name], doc=docs.get(name, ""))
            )
        if section is not None:
            out.extend(iter_key_docs(section, key))
    return out


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it converted (dataclasses built, int widened)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if _is_union(tp):
        return _convert_union(value, typing.get_args(tp), key)
    if origin is Literal:
        return _convert_literal(value, typing.get_args(tp), key)
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(value, tp, key)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(_convert_literal(value, tuple(member.value for member in tp), key))
    if origin in (list, tuple):
        return _convert_sequence(value, tp, key)
    if origin is dict:
        return _convert_mapping(value, tp, key)
    return _convert_scalar(value, tp, key)


def _convert_dataclass(value: Any, cls: type, key: str) -> Any:
    if not isinstance(value, Mapping):
        raise _type_error(key, "mapping of keys", value)
    expand = getattr(cls, "expand_data", None)
    if expand is not None:  # a section that rewrites its own data first (e.g. ``loss.preset``)
        try:
            value = expand(value)
        except ValueError as err:
            raise ConfigError(str(err)) from err
    types_by_name = field_types(cls)
    for name in value:
        if name not in types_by_name:
            raise unknown_key_error(str(name), key, cls)
    kwargs = {name: _convert(value[name], types_by_name[name], _join(key, name)) for name in value}
    missing = [n for n in _required_fields(cls) if n not in kwargs]
    if missing:
        raise ConfigError(f"missing required key '{_join(key, missing[0])}'")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from err


def _convert_union(value: Any, args: tuple[Any, ...], key: str) -> Any:
    if value is None and type(None) in args:
        return None
    candidates = [a for a in args if a is not type(None)]
    errors = []
    for candidate in candidates:
        try:
            return _convert(value, candidate, key)
        except ConfigError as err:
            errors.append(err)
    if (
        len(candidates) == 1
        and section_type(candidates[0]) is None
        and typing.get_origin(candidates[0]) is None
    ):
        raise _type_error(key, _union_name(args), value)  # a plain scalar: name the whole type, "int | None"
    if len(candidates) == 1:
        raise errors[0]
    raise ConfigError(f"{key or 'config'} must be of type {_union_name(args)}, got {value!r} ({errors[0]})")


def _convert_literal(value: Any, allowed: tuple[Any, ...], key: str) -> Any:
    # Compare type and value, so that True does not pass for Literal[1] nor 1 for Literal[True].
    if any(type(value) is type(a) and value == a for a in allowed):
        return value
    allowed_text = ", ".join(repr(a) for a in allowed)
    message = f"{key} must be one of {allowed_text}, got {value!r}"
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.6)
    if close:
        message += f" (did you mean '{close[0]}'?)"
    raise ConfigError(message)


def _convert_sequence(value: Any, tp: Any, key: str) -> Any:
    if not isinstance(value, list | tuple):
        raise _type_error(key, "list", value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise ConfigError(f"{key} must be a list of {len(args)} items, got {len(value)}: {value!r}")
        item_types = list(args)
    else:
        item_types = [args[0] if args else Any] * len(value)
    items = [_convert(v, t, f"{key}[{i}]") for i, (v, t) in enumerate(zip(value, item_types, strict=True))]
    return tuple(items) if origin is tuple else items


def _convert_mapping(value: Any, tp: Any, key: str) -> dict[Any, Any]:
    if not isinstance(value, Mapping):
        raise _type_error(key, "mapping", value)
    key_type, value_type = typing.get_args(tp) or (Any, Any)
    return {
        _convert(k, key_type, f"{key} key {k!r}"): _convert(v, value_type, _join(key, str(k)))
        for k, v in value.items()
    }


def _convert_scalar(value: Any, tp: Any, key: str) -> Any:
    # bool is a subclass of int in Python; a config never means True when it asks for a number.
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (isinstance(value, bool) and tp is not bool):
        raise _type_error(key, type_name(tp), value)
    if tp is float and not math.isfinite(value):
        # NaN passes every ``x < 0`` check below it, and no setting documents an infinite value.
        raise ConfigError(f"{key or 'config'} must be a finite number, got {value!r}")
    return value


def _type_error(key: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{key or 'config'} must be of type {expected}, got {type(value).__name__} {value!r}")


def _union_name(args: tuple[Any, ...]) -> str:
    return " | ".join(type_name(a) for a in args)


def _required_fields(cls: type) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _is_string(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
