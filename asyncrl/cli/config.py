"""``asyncrl config show [CONFIG] [KEY=VALUE ...]`` and ``asyncrl config docs [PREFIX]``."""

from __future__ import annotations

import argparse
import dataclasses

from asyncrl.cli.args import add_config_arguments, run_config_from_args
from asyncrl.config.base import KeyDoc, iter_key_docs
from asyncrl.config.loader import to_yaml
from asyncrl.config.run import RunConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``config`` with its two actions."""
    parser = subparsers.add_parser("config", help="Print a resolved run config, or document every key.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show",
        help="print the fully resolved run config as YAML",
        description="Print the run config after defaults, the YAML file and the overrides, as YAML that "
        "loads back to the same config.",
    )
    add_config_arguments(show)
    docs = actions.add_parser("docs", help="list every config key with its type, default and meaning")
    docs.add_argument("prefix", nargs="?", default="", help="only keys starting with this, e.g. engine")


def run(args: argparse.Namespace) -> int:
    """Print to stdout; bad configs raise ConfigError, which ``main`` reports in one line."""
    if args.action == "show":
        print(to_yaml(run_config_from_args(args)), end="")
    else:
        print(format_key_docs([d for d in iter_key_docs(RunConfig) if d.key.startswith(args.prefix)]))
    return 0


def format_key_docs(docs: list[KeyDoc]) -> str:
    """``key: type = default`` lines, each followed by its docstring indented by four spaces."""
    blocks = []
    for doc in docs:
        default = "(required)" if doc.default is dataclasses.MISSING else f"= {doc.default!r}"
        text = "\n".join(f"    {line}" for line in (doc.doc or "(undocumented)").splitlines())
        blocks.append(f"{doc.key}: {doc.type_name} {default}\n{text}")
    return "\n".join(blocks)
