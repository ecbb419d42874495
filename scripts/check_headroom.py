"""Does RL have headroom on a checkpoint? Held-out mean reward (mean@1) vs pass@k under temperature-1 sampling.

Usage: python scripts/check_headroom.py [MODEL_DIR] [--prompts 128] [--k 8] [task overrides: type=count ...]
A pass@k clearly above mean@1 means the policy already samples correct answers that RL can reinforce.
"""

from __future__ import annotations

import argparse
import os

DEFAULT_DIR = ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", default=DEFAULT_DIR, help="a model directory or shipped name")
    parser.add_argument("--prompts", type=int, default=128, help="held-out prompts to sample")
    parser.add_argument("--k", type=int, default=8, help="samples per prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("task_overrides", nargs="*", help="TaskConfig overrides, e.g. type=reverse")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from asyncrl.metrics.progress import library_bars_follow_terminal

    library_bars_follow_terminal()

    from asyncrl.config.loader import load_config
    from asyncrl.config.task import TaskConfig
    from asyncrl.data import make_task
    from asyncrl.models.loading import load_model_and_tokenizer
    from asyncrl.models.sft import evaluate_by_sampling

    model, tokenizer = load_model_and_tokenizer(args.model_dir, device="cpu")
    task = make_task(load_config(TaskConfig, None, args.task_overrides))
    held_out = list(task.split("eval"))[: args.prompts]
    result = evaluate_by_sampling(model, tokenizer, held_out, k=args.k, max_new_tokens=192, seed=args.seed)
    print(
        f"{args.model_dir}: mean@1 {result.mean_reward:.3f}  pass@{result.k} {result.pass_at_k:.3f}  "
        f"({result.num_prompts} prompts, {result.mean_response_tokens:.1f} tokens/response, {result.seconds:.0f}s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
