"""``asyncrl export CHECKPOINT OUT [--dtype D] [CONFIG] [KEY=VALUE ...]``: a checkpoint as a plain model directory."""

from __future__ import annotations

import argparse

from asyncrl.cli.args import add_config_arguments, run_config_from_args
from asyncrl.config.model import DTYPES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="a training checkpoint as a plain model directory (LoRA adapters merged)",
        description="Write the weights a training checkpoint holds as a Hugging Face model directory with its "
        "tokenizer; a LoRA checkpoint (adapter/) is merged into its base model. The base is the run's model.path "
        "(from the run's config.json), unless a config or overrides are given. A sharded checkpoint's weights "
        "are read from its master shards (sharded/), not from its serving export (model/).",
    )
    parser.add_argument("checkpoint", help="a checkpoint step directory, or a run directory (its newest)")
    parser.add_argument("out", help="the directory to write the model into")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="the dtype of the exported weights (default: the run's model.dtype, the dtype it trained in)",
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from asyncrl.app.export import export_model

    config = run_config_from_args(args) if args.config_args else None
    out = export_model(args.checkpoint, args.out, config, args.dtype)
    print(f"exported {args.checkpoint} to {out}")
    return 0
