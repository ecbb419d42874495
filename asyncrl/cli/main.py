"""The ``asyncrl`` command: subcommands registered by name and imported only when the command line names them.

Key decision: the top-level parser knows each subcommand by its name and one-line help from ``COMMANDS``;
only the module of the subcommand being run is imported (to add its full parser), so ``asyncrl --help`` and
every subcommand start without torch, and a subcommand whose module fails to import breaks only itself.

A subcommand module ``asyncrl/cli/<name>.py`` exposes ``add_parser(subparsers) -> None``, which adds the
parser named ``<name>``, and ``run(args) -> int``, the exit status. Its top level must not import torch or
transformers; it imports them inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from asyncrl import __version__
from asyncrl.metrics.progress import library_bars_follow_terminal
from asyncrl.sandbox.bwrap import SandboxUnavailable  # light: no torch, no subprocess started

COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "asyncrl.cli.train",
        "Train a policy with RL from a run config (YAML plus key=value overrides).",
    ),
    "eval": ("asyncrl.cli.eval", "Evaluate a model checkpoint on a task's held-out split."),
    "export": ("asyncrl.cli.export", "Write a checkpoint as a plain model directory (LoRA adapters merged)."),
    "generate": ("asyncrl.cli.generate", "Generate completions for prompts with the built-in engine."),
    "sft": ("asyncrl.cli.sft", "Supervised warm start of a model on task demonstrations."),
    "config": ("asyncrl.cli.config", "Print a resolved run config, or the documentation of every key."),
    "tiny": ("asyncrl.cli.tiny", "Build a tiny Qwen2 model and a byte-level BPE tokenizer trained for it."),
    "simulate": (
        "asyncrl.cli.simulate",
        "Simulate a run at any scale: real scheduling code, cost-model workers.",
    ),
    "serve": ("asyncrl.cli.serve", "Serve a model behind an OpenAI-compatible endpoint."),
    "calibrate": (
        "asyncrl.cli.calibrate",
        "Measure this machine's device (GEMM, bandwidth, decode, prefill, training) for the cost model.",
    ),
    "plan": ("asyncrl.cli.plan", "Recommend the rollout/train split and async ratio (ROLL Flash Prop. 2)."),
    "backends": (
        "asyncrl.cli.backends",
        "Install an optional inference backend (vLLM) into its own environment.",
    ),
    "report": ("asyncrl.cli.report", "Charts and an HTML page of runs: curves, staleness, timelines."),
    "doctor": (
        "asyncrl.cli.doctor",
        "Check this machine against a run config: devices, memory, model, Ray, vLLM.",
    ),
}
"""Subcommand name -> (module path, one-line help). Adding a subcommand is one entry plus its module."""

EXIT_BAD_INPUT = 2
"""Exit status for bad user input (as argparse uses for usage errors)."""


class CommandUnavailable(Exception):
    """The module of a registered subcommand is not installed."""


def build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, ModuleType | None]:
    """The top-level parser and the module of the subcommand ``argv`` names (None when it names none)."""
    parser = argparse.ArgumentParser(
        prog="asyncrl",
        description="Asynchronous reinforcement-learning post-training of LLMs.",
        epilog="Run 'asyncrl COMMAND --help' for the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"asyncrl {__version__}")
    parser.add_argument("--traceback", action="store_true", help="on errors, show the full Python traceback")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = _command_named(argv)
    module = None
    for name, (module_path, help_text) in COMMANDS.items():
        if name == chosen:
            module = _import_command(name, module_path)
            module.add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=help_text, description=help_text)
    return parser, module


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``asyncrl`` script: parse, run the subcommand, turn bad input into one stderr line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Set at run time of the command, not at import: every model this process loads is local.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    library_bars_follow_terminal()  # under a pipe or in a log, no library redraws a bar with carriage returns
    try:
        parser, module = build_parser(argv)
    except CommandUnavailable as err:
        return _fail(str(err))
    args = parser.parse_args(argv)
    assert module is not None, "argparse accepted a command that build_parser did not import"
    return _run(module, args)


def _run(module: ModuleType, args: argparse.Namespace) -> int:
    try:
        return int(module.run(args))
    except (ValueError, FileNotFoundError, SandboxUnavailable) as err:  # ConfigError is a ValueError
        if args.traceback:
            raise
        return _fail(f"{args.command}: {err}")
    except KeyboardInterrupt:
        return _fail(f"{args.command}: interrupted", status=130)


def _fail(message: str, status: int = EXIT_BAD_INPUT) -> int:
    print(f"asyncrl: error: {' '.join(message.split())}", file=sys.stderr)
    return status


def _command_named(argv: Sequence[str]) -> str | None:
    """The first argument that is not an option: top-level options take no values, so it is the command."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _import_command(name: str, module_path: str) -> ModuleType:
    try:
        return importlib.import_module(module_path)
    except ModuleNotFoundError as err:
        if err.name != module_path:
            raise  # the module exists but one of its own imports is missing: a real bug, keep the traceback
        raise CommandUnavailable(
            f"command '{name}' is not available: module {module_path} is missing"
        ) from err


if __name__ == "__main__":
    sys.exit(main())
