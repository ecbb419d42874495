"""Command-line arguments shared by subcommands: a run config (``[CONFIG.yaml] [key=value ...]``), or a model."""

from __future__ import annotations

import argparse
from pathlib import Path

from asyncrl.config.base import ConfigError
from asyncrl.config.loader import parse_override
from asyncrl.config.run import RunConfig, load_run_config


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the positional ``CONFIG [KEY=VALUE ...]``: an optional YAML file, then dotted overrides."""
    parser.add_argument(
        "config_args",
        nargs="*",
        metavar="[CONFIG.yaml] [KEY=VALUE ...]",
        help="an optional YAML run config, then overrides such as trainer.lr=1e-5 or engine.seed=3 "
        "(values are YAML: 1e-5, true, null, [1, 2]); an argument holding '=' is an override",
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the positional ``MODEL`` (a directory, a shipped warm start or a hub id) and ``--revision``."""
    parser.add_argument(
        "model_dir",
        nargs="?",
        default="",
        help="model directory, shipped warm start (tiny-count) or hub id (Qwen/Qwen3-0.6B, through the HF "
        "cache; HF_HUB_OFFLINE=1 never downloads); empty: the embedded default",
    )
    parser.add_argument("--revision", default="", help="hub ids: branch, tag or commit; empty: main")


def names_no_config_file(config_args: list[str]) -> bool:
    """Whether the positional arguments are overrides only (commands then apply them to their default)."""
    return not config_args or "=" in config_args[0]


def split_config_args(items: list[str]) -> tuple[str | None, list[str]]:
    """Split positional arguments into the config file (at most one, given first) and the overrides."""
    path = None
    if items and "=" not in items[0]:
        path, items = items[0], items[1:]
    stray = [item for item in items if "=" not in item]
    if stray:
        raise ConfigError(f"expected key=value overrides after the config file, got {stray[0]!r}")
    return path, items


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    """The resolved ``RunConfig`` of arguments added by ``add_config_arguments``."""
    path, overrides = split_config_args(args.config_args)
    return load_run_config(path, overrides)


def checkpoint_run_config(args: argparse.Namespace, checkpoint: str | None) -> RunConfig:
    """The ``RunConfig`` of a command over a training ``checkpoint`` (``export``, ``eval --checkpoint``).

    A named CONFIG.yaml wins, with its overrides. Overrides alone apply on top of the config of the run that
    wrote the checkpoint (``<run>/config.json``), not on the default: the weights were trained from that run's
    ``model.path`` (a LoRA checkpoint holds only adapters to merge into it), and ``model.dtype=float32`` must
    not swap that base for the embedded default. A checkpoint with no run config above it takes the defaults
    only when the overrides name ``model.path``; otherwise it is an error saying so. No checkpoint: the
    arguments as every command reads them."""
    if checkpoint is None or not names_no_config_file(args.config_args):
        return run_config_from_args(args)
    from asyncrl.app.export import run_config_of  # imports torch: only once the command runs

    _, overrides = split_config_args(args.config_args)
    try:  # found from the path as given: the command verifies the checkpoint itself (hashing every file) once
        return run_config_of(Path(checkpoint), overrides)
    except FileNotFoundError:
        if not any(parse_override(text)[0] == ["model", "path"] for text in overrides):
            raise
    return load_run_config(None, overrides)
