"""``asyncrl export CHECKPOINT OUT [--dtype D] [CONFIG] [KEY=VALUE ...]``: a checkpoint as a plain model directory."""

from __future__ import annotations

import argparse

from asyncrl.cli.args import add_config_arguments, checkpoint_run_config
from asyncrl.config.model import DTYPES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="a training checkpoint as a plain model directory (LoRA adapters merged)",
        description="Write the weights a training checkpoint holds as a Hugging Face model directory with its "
        "tokenizer; a LoRA checkpoint (adapter/) is merged into its base model. The config is the run's own "
        "(its config.json: model.path, the base it trained from), with any overrides on top; a CONFIG.yaml "
        "given first replaces it. A sharded checkpoint's weights are read from its master shards (sharded/), "
        "not from its serving export (model/).",
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

    out = export_model(args.checkpoint, args.out, checkpoint_run_config(args, args.checkpoint), args.dtype)
    print(f"exported {args.checkpoint} to {out}")
    return 0
