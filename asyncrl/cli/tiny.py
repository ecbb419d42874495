"""``asyncrl tiny build OUT_DIR``: a tiny Qwen2 model with a tokenizer trained for it, saved as an HF directory."""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tiny build`` and its model-shape options."""
    parser = subparsers.add_parser("tiny", help="Build a tiny Qwen2 model and a tokenizer trained for it.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build",
        help="build and save a randomly initialised tiny model with its tokenizer",
        description="Train a byte-level BPE tokenizer, build a Qwen2 causal LM sized to it, and save both "
        "with save_pretrained, loadable by from_pretrained / AutoTokenizer.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    build.add_argument("out_dir", help="directory to write (created if missing)")
    build.add_argument("--hidden", type=int, default=128, help="hidden size")
    build.add_argument("--layers", type=int, default=2, help="number of transformer layers")
    build.add_argument("--heads", type=int, default=4, help="attention heads")
    build.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    build.add_argument("--vocab", type=int, default=512, help="largest tokenizer vocabulary")
    build.add_argument("--max-position", type=int, default=2048, help="longest sequence")
    build.add_argument("--untied", action="store_true", help="give the output layer its own weights")
    build.add_argument(
        "--texts", default=None, help="UTF-8 file, one training text per line (default: built-in)"
    )
    build.add_argument("--seed", type=int, default=0, help="initialisation and corpus seed")


def run(args: argparse.Namespace) -> int:
    """Build, save, and print a one-line JSON summary of the model."""
    from asyncrl.models.corpus import sample_texts
    from asyncrl.models.loading import describe, save_tiny
    from asyncrl.models.tiny import build_tiny

    texts = _read_texts(args.texts) if args.texts else sample_texts(seed=args.seed)
    model, tokenizer = build_tiny(
        texts,
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        max_position_embeddings=args.max_position,
        tie_word_embeddings=not args.untied,
        seed=args.seed,
    )
    out = save_tiny(model, tokenizer, args.out_dir)
    print(json.dumps({"out_dir": str(out), "vocab_size": len(tokenizer), **describe(model)}))
    return 0


def _read_texts(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        texts = [line.rstrip("\n") for line in f if line.strip()]
    if not texts:
        raise ValueError(f"--texts {path}: no non-empty lines to train a tokenizer on")
    return texts
