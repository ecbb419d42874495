"""Same-session A/B of ``asyncrl train`` between two commits: the same run at each, interleaved, every repeat kept.

Why: a slowdown found by comparing two results measured hours apart may be the machine, not the code (timings
here move by tens of per cent from one hour to the next). This checks out both commits side by side (git
worktrees under a temporary directory), runs ``asyncrl train`` with the given overrides in each, alternating
A B B A ..., each run in a fresh process whose imports come from its own checkout, and prints per run the
training loop's samples/s (trained samples over ``train_wall_s`` of its ``summary.json``) and the paired
ratios B / A. Nothing is written to the repository.

    python scripts/ab_commits.py OLD NEW [--repeats 3] [-- key=value ...]
    python scripts/ab_commits.py 25d871e HEAD -- controller.mode=sync buffer.async_ratio=0 controller.num_steps=40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkout(commit: str, where: Path) -> Path:
    """A detached worktree of ``commit`` at ``where`` (removed by :func:`main` when done)."""
    subprocess.run(["git", "worktree", "add", "--detach", str(where), commit], cwd=ROOT, check=True)
    return where


def train(tree: Path, overrides: list[str], out: Path) -> float:
    """One ``asyncrl train`` in ``tree``'s code; its training loop's samples/s."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "asyncrl.cli.main", "train", *overrides, f"output_dir={out}"]
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / "summary.json").read_text())
    return summary["trained_samples"] / summary["train_wall_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="commit A")
    parser.add_argument("new", help="commit B")
    parser.add_argument("--repeats", type=int, default=3)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.overrides = argv[split + 1 :]
    with tempfile.TemporaryDirectory(prefix="ab-commits-") as tmp:
        trees = {"A": checkout(args.old, Path(tmp) / "a"), "B": checkout(args.new, Path(tmp) / "b")}
        runs: dict[str, list[float]] = {"A": [], "B": []}
        try:
            for repeat in range(args.repeats):
                for side in ("A", "B") if repeat % 2 == 0 else ("B", "A"):
                    rate = train(trees[side], args.overrides, Path(tmp) / f"run-{side}-{repeat}")
                    runs[side].append(rate)
                    print(f"{side} repeat {repeat}: {rate:.1f} samples/s", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    ratios = [b / a for a, b in zip(runs["A"], runs["B"], strict=True)]
    print(
        f"A {args.old}: median {statistics.median(runs['A']):.1f} samples/s; B {args.new}: median "
        f"{statistics.median(runs['B']):.1f}; B/A per paired repeat: median {statistics.median(ratios):.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
