"""Property-based fuzzing of the config loader: any YAML text, any override, any value at any key either
builds a config or raises ``ConfigError`` naming the key; nothing crashes, nothing is silently changed."""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.config.base import ConfigError, from_dict, iter_key_docs, to_dict
from asyncrl.config.loader import apply_overrides, load_config, parse_override
from asyncrl.config.run import RunConfig
from asyncrl.testing.fuzz import values

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEFAULTS = to_dict(RunConfig())


def leaf_keys() -> list[str]:
    """Every dotted key whose default is a plain value (sections expanded)."""
    keys = []
    for doc in iter_key_docs(RunConfig):
        node: Any = DEFAULTS
        for part in doc.key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            keys.append(doc.key)
    return keys


KEYS = leaf_keys()


def with_value(key: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(DEFAULTS)
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}  # an optional section (default None) holding just this key
        node = node[part]
    node[leaf] = value
    return data


def read_back(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return to_dict(config)


def same_value(given_value: Any, stored: Any) -> bool:
    """Stored as given, allowing only int -> float widening, list <-> tuple, None filled with the default
    the field documents (``loss.mismatch.cap: None`` takes 2.0 in mode 'truncate'), and an optional section
    given as a mapping completed with its defaults."""
    if given_value is None:
        return True
    if isinstance(given_value, list | tuple) and isinstance(stored, list | tuple):
        return len(given_value) == len(stored) and all(map(same_value, given_value, stored))
    if isinstance(given_value, dict) and isinstance(stored, dict):  # an optional section fills its defaults
        return all(k in stored and same_value(given_value[k], stored[k]) for k in given_value)
    if isinstance(stored, float) and not isinstance(given_value, bool) and isinstance(given_value, int):
        return float(given_value) == stored
    return type(given_value) is type(stored) and given_value == stored


def names_key(message: str, key: str) -> bool:
    """The error names the key, or its section for a rule across the section's keys (``loss.grpo is set
    but loss.name is 'ppo'``)."""
    parts = key.split(".")
    return any(".".join(parts[: i + 1]) in message or parts[i] in message for i in range(len(parts)))


def holds_nan(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list | tuple):
        return any(map(holds_nan, value))
    if isinstance(value, dict):
        return any(map(holds_nan, value.values()))
    return False


@FUZZ
@given(key=st.sampled_from(KEYS), value=values)
def test_any_value_at_any_key_is_built_unchanged_or_refused_by_name(key, value):
    try:
        config = from_dict(RunConfig, with_value(key, value))
    except ConfigError as err:
        assert names_key(str(err), key), f"{key}={value!r}: {err}"
        return
    stored = read_back(config, key)
    assert same_value(value, stored), f"{key}={value!r} was stored as {stored!r}"
    assert not holds_nan(stored), f"{key}={value!r}: a non-finite float was silently accepted"


@FUZZ
@given(text=st.text(max_size=40))
def test_any_override_text_parses_or_is_a_config_error(text):
    try:
        path, _ = parse_override(text)
        apply_overrides(RunConfig, {}, [text])
    except ConfigError:
        return
    assert all(path)


@FUZZ
@given(key=st.sampled_from(KEYS), text=st.text(max_size=12))
def test_any_override_value_builds_or_names_the_key(key, text):
    try:
        load_config(RunConfig, None, [f"{key}={text}"])
    except ConfigError as err:
        assert names_key(str(err), key) or "YAML" in str(err), str(err)


@FUZZ
@given(text=st.text(alphabet=st.sampled_from(list("ab:-[]{}, \n'\"&*!|>#%@`1.e")), max_size=60))
def test_any_yaml_file_loads_or_is_a_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    path.write_text(text)
    with contextlib.suppress(ConfigError):  # any other exception fails the test
        load_config(RunConfig, path)
