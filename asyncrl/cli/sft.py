"""``asyncrl sft [CONFIG.yaml] [key=value ...]``: the supervised warm start that produces the shipped checkpoint.

The config is an ``SFTConfig`` (``asyncrl/config/sft.py``), e.g. ``asyncrl sft max_steps=300
task.type=reverse output_dir=runs/tiny-reverse``. Torch is imported only inside ``run``.
"""

from __future__ import annotations

import argparse

from asyncrl.cli.args import add_config_arguments, split_config_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``sft`` subcommand: an optional YAML ``SFTConfig`` then dotted overrides."""
    help_text = "Supervised warm start of a tiny model on task demonstrations (writes a checkpoint)."
    parser = subparsers.add_parser("sft", help=help_text, description=help_text)
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Train, save and evaluate; prints the held-out mean reward and pass@k."""
    from asyncrl.config.loader import load_config
    from asyncrl.config.sft import SFTConfig
    from asyncrl.metrics.progress import Progress
    from asyncrl.models.sft import run_sft

    path, overrides = split_config_args(args.config_args)
    config = load_config(SFTConfig, path, overrides)
    command = " ".join(["asyncrl sft", *args.config_args])
    run_sft(config, command=command, progress=Progress(config.max_steps, label="sft", min_interval_s=5.0))
    print(f"sft: checkpoint written to {config.output_dir}")
    return 0
