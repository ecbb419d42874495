"""``asyncrl generate MODEL_DIR --prompt TEXT ...``: complete prompts with the built-in engine and print them."""

from __future__ import annotations

import argparse
import json

from asyncrl.cli.args import add_model_arguments


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="Generate completions for prompts with the built-in engine.",
        description="Load a model (a directory or a hub id, from_pretrained), serve every --prompt through the "
        "continuous-batching engine, and print one completion per prompt in order.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for several)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="most tokens generated per prompt")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 disables")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeat for several)")
    parser.add_argument("--seed", type=int, default=0, help="engine seed; each prompt's draws derive from it")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--json", action="store_true", help="print one JSON object per completion")


def run(args: argparse.Namespace) -> int:
    from asyncrl.config.engine import EngineConfig
    from asyncrl.engine.llm_engine import LLMEngine
    from asyncrl.engine.requests import sampling_params_from_dict
    from asyncrl.models.loading import load_model_and_tokenizer
    from asyncrl.types import Request

    model, tokenizer = load_model_and_tokenizer(
        args.model_dir, dtype=args.dtype, device=args.device, revision=args.revision
    )
    params = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "stop_strings": args.stop,
    }
    prompts = [tokenizer(prompt).input_ids for prompt in args.prompt]
    longest = max(len(ids) for ids in prompts) + args.max_new_tokens
    config = EngineConfig(
        seed=args.seed,
        max_running_requests=min(len(prompts), 64),
        max_model_len=min(longest, model.config.max_position_embeddings),  # the KV pool needs no more
    )
    engine = LLMEngine(model, tokenizer, config)
    for index, ids in enumerate(prompts):
        rid = f"prompt-{index}"
        sampling = sampling_params_from_dict(params, request_id=rid)
        engine.add_request(Request(request_id=rid, prompt_token_ids=ids, sampling=sampling))
    finished = {}
    while engine.has_work():
        finished.update({g.request_id: g for g in engine.step()})
    for index, prompt in enumerate(args.prompt):
        _print(prompt, finished[f"prompt-{index}"], as_json=args.json)
    return 0


def _print(prompt: str, generation, *, as_json: bool) -> None:
    if as_json:
        record = {
            "prompt": prompt,
            "completion": generation.text,
            "finish_reason": generation.finish_reason.value,
            "num_tokens": generation.num_tokens,
        }
        print(json.dumps(record))
    else:
        print(f"{prompt}{generation.text}")
        print(f"--- [{generation.finish_reason.value}, {generation.num_tokens} tokens]")
