"""``asyncrl serve MODEL_DIR [--host 127.0.0.1 --port N --api-key K]``: the OpenAI-compatible endpoint alone.

The model is served through the built-in engine and the LLM proxy, exactly as in a training run (where
``producer: external`` serves the same endpoint and trains on what harnesses finish); here nothing trains,
and finished trajectories go to ``--export`` as JSONL.
"""

from __future__ import annotations

import argparse
import json

from asyncrl.cli.args import add_model_arguments


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="Serve a model behind an OpenAI-compatible endpoint (token-in/token-out trajectories).",
        description="Serve MODEL_DIR on /v1/chat/completions, /v1/completions and /v1/models; name a "
        "trajectory in the URL (/trajectories/ID/v1) to keep its tokens across calls. Binds 127.0.0.1 "
        "unless --host says otherwise.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it to the network)"
    )
    parser.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one")
    parser.add_argument("--api-key", default="", help="require 'Authorization: Bearer KEY'; empty: no key")
    parser.add_argument("--chat-format", default="template", choices=("template", "plain"))
    parser.add_argument(
        "--chat-template-kwargs",
        type=json.loads,
        default={},
        help="extra chat template variables as JSON, e.g. '{\"enable_thinking\": false}' for Qwen3",
    )
    parser.add_argument("--export", default="", help="append every finished trajectory to this JSONL file")
    parser.add_argument(
        "--max-concurrent-calls",
        type=int,
        default=256,
        help="calls served at once; one more gets 429 with Retry-After (serve.max_concurrent_calls)",
    )
    parser.add_argument("--retry-after", type=float, default=1.0, help="Retry-After of a 429/503, seconds")
    parser.add_argument("--max-running-requests", type=int, default=64, help="the engine's batch (slots)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--seed", type=int, default=0, help="engine seed")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from asyncrl.config.engine import EngineConfig
    from asyncrl.config.serve import ServeConfig
    from asyncrl.engine import make_engine
    from asyncrl.models.loading import load_model_and_tokenizer
    from asyncrl.proxy.llm_proxy import LLMProxy
    from asyncrl.serve.server import EndpointServer
    from asyncrl.serve.service import CompletionService

    config = ServeConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        chat_format=args.chat_format,
        export_path=args.export,
        max_concurrent_calls=args.max_concurrent_calls,
        retry_after_s=args.retry_after,
    )
    model, tokenizer = load_model_and_tokenizer(
        args.model_dir, dtype=args.dtype, device=args.device, revision=args.revision
    )
    engine = make_engine(
        model,
        tokenizer,
        EngineConfig(seed=args.seed, max_running_requests=args.max_running_requests, dtype=args.dtype),
    )

    async def serve() -> None:
        proxy = LLMProxy([engine])
        server = EndpointServer(
            CompletionService(
                proxy=proxy,
                tokenizer=tokenizer,
                config=config,
                seed=args.seed,
                chat_template_kwargs=args.chat_template_kwargs,
            )
        )
        await server.start()
        print(f"serving {config.model_name} on {server.url}/v1 (Ctrl-C stops)", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()
            await proxy.aclose()

    try:
        asyncio.run(serve())
    finally:
        engine.shutdown()
    return 0
