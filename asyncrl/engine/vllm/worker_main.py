"""The vLLM engine worker: runs *inside the vLLM environment*, serving one model over a local socket.

Key decision: this file imports nothing from asyncrl (asyncrl pins a newer transformers than vLLM's CPU wheel,
so the two live in separate environments). It speaks the small protocol of ``asyncrl.engine.vllm.protocol``
over ``multiprocessing.connection`` on 127.0.0.1 with an auth key, carrying only builtins (ints, floats,
strings, lists, dicts) and weights as safetensors bytes, never pickled objects of either side's libraries.

One thread reads commands; one thread runs vLLM's ``LLMEngine.step()`` loop (continuous batching). Every
sampled token is tagged with the weight version that produced it. ``pause`` stops stepping with every
running request's KV kept; an update replaces the weights in place (``reload_weights``), resets the prefix
cache, and ``resume`` continues the requests under the new weights ("keep" semantics).

    python worker_main.py --model DIR --port P --authkey-hex K [--dtype float32] [--max-model-len N]
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
import threading
import traceback
from multiprocessing.connection import Listener


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--authkey-hex", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    parser.add_argument("--engine-args-json", default="{}")
    args = parser.parse_args()
    check_engine_args(json.loads(args.engine_args_json))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(args.kv_cache_gib))))
    with Listener(("127.0.0.1", args.port), authkey=bytes.fromhex(args.authkey_hex)) as listener:
        print("asyncrl-vllm-worker listening", flush=True)
        with listener.accept() as conn:
            Worker(conn, args).serve()


def check_engine_args(extra: dict) -> None:
    """Exit with a message naming an unknown ``vllm.EngineArgs`` field and the closest valid one."""
    from vllm import EngineArgs

    valid = [f.name for f in dataclasses.fields(EngineArgs)]
    for name in extra:
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            sys.exit(f"engine.vllm.engine_args: unknown vLLM engine argument {name!r}{hint}")


class Worker:
    def __init__(self, conn, args) -> None:
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.conn = conn
        self.send_lock = threading.Lock()
        engine_args = EngineArgs(
            model=args.model,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            seed=args.seed,
            skip_tokenizer_init=True,
            enforce_eager=True,
            max_num_seqs=args.max_num_seqs,
            gpu_memory_utilization=args.gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=False,
            # vllm-cpu 0.32 rewinds a seeded request's generator when its prefill is chunked, which CPU
            # generators cannot do ("CPU Generator does not use offset"): prefill whole prompts instead.
            **{"enable_chunked_prefill": False, **json.loads(args.engine_args_json)},
        )
        self.engine = LLMEngine.from_engine_args(engine_args)
        self.cond = threading.Condition()
        self.version = 0
        self.paused = False
        self.stopped = False
        self.running: dict[str, dict] = {}
        self.pending_commands: list = []

    # ---- protocol ---------------------------------------------------------------------------------------

    def serve(self) -> None:
        stepper = threading.Thread(target=self.step_loop, daemon=True)
        stepper.start()
        self.send({"event": "ready", "version": self.version, "pid": os.getpid()})
        try:
            while True:
                message = self.conn.recv()
                if message["op"] == "shutdown":
                    break
                self.enqueue(message)
        except EOFError:
            pass
        finally:
            with self.cond:
                self.stopped = True
                self.cond.notify()
            stepper.join(timeout=30)

    def enqueue(self, message: dict) -> None:
        with self.cond:
            self.pending_commands.append(message)
            self.cond.notify()

    def send(self, message: dict) -> None:
        with self.send_lock:
            self.conn.send(message)

    # ---- the engine thread ------------------------------------------------------------------------------

    def step_loop(self) -> None:
        try:
            self.serve_steps()
        except (
            Exception
        ) as err:  # deliberate: a dead step loop must reach every caller, not leave them waiting
            self.send(
                {
                    "event": "fatal",
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc(),
                }
            )

    def serve_steps(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and not self.pending_commands and not self.can_step():
                    self.cond.wait()
                if self.stopped:
                    return
                commands, self.pending_commands = self.pending_commands, []
            for command in commands:
                self.run_command(command)
            if self.can_step():
                self.step()

    def can_step(self) -> bool:
        return not self.paused and bool(self.running)

    def run_command(self, message: dict) -> None:
        op, call = message["op"], message.get("call")
        try:
            result = getattr(self, f"op_{op}")(message)
        except Exception as err:  # deliberate: every failure goes back to the caller, named
            self.send(
                {
                    "event": "error",
                    "call": call,
                    "request_id": message.get("request_id"),
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc(),
                }
            )
            return
        if call is not None:
            self.send({"event": "result", "call": call, "result": result})

    def step(self) -> None:
        for output in self.engine.step():
            state = self.running.get(output.request_id)
            if state is None:
                continue
            completion = output.outputs[0]
            new_ids = list(completion.token_ids)[len(state["token_ids"]) :]
            new_logprobs = [
                _sampled_logprob(entry, token)
                for entry, token in zip(
                    (completion.logprobs or [])[len(state["logprobs"]) :], new_ids, strict=False
                )
            ]
            state["token_ids"] += new_ids
            state["logprobs"] += new_logprobs
            state["versions"] += [self.version] * len(new_ids)
            if output.finished:
                reason = "length" if completion.finish_reason == "length" else "stop"
                self.finish(output.request_id, reason)

    def finish(self, request_id: str, reason: str) -> dict:
        state = self.running.pop(request_id)
        generation = {
            "request_id": request_id,
            "token_ids": state["token_ids"],
            "logprobs": state["logprobs"],
            "versions": state["versions"],
            "finish_reason": reason,
        }
        self.send({"event": "finished", "generation": generation})
        return generation

    # ---- operations -------------------------------------------------------------------------------------

    def op_add(self, message: dict) -> None:
        from vllm import SamplingParams

        sampling = message["sampling"]
        params = SamplingParams(
            max_tokens=sampling["max_new_tokens"],
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            top_k=sampling["top_k"] if sampling["top_k"] > 0 else -1,
            seed=sampling["seed"],
            stop_token_ids=sampling["stop_token_ids"],
            ignore_eos=sampling["ignore_eos"],
            logprobs=0,
            detokenize=False,
        )
        request_id = message["request_id"]
        if request_id in self.running:
            raise ValueError(f"request {request_id!r} is already running")
        self.engine.add_request(request_id, {"prompt_token_ids": message["prompt_token_ids"]}, params)
        self.running[request_id] = {"token_ids": [], "logprobs": [], "versions": []}

    def op_abort(self, message: dict) -> dict | None:
        request_id = message["request_id"]
        if request_id not in self.running:
            return None
        self.engine.abort_request([request_id])
        return self.finish(request_id, "abort")

    def op_pause(self, message: dict) -> None:
        self.paused = True

    def op_resume(self, message: dict) -> None:
        self.paused = False

    def op_stats(self, message: dict) -> dict:
        return {
            "version": self.version,
            "paused": self.paused,
            "running_tokens": {rid: len(state["token_ids"]) for rid, state in self.running.items()},
        }

    def op_update(self, message: dict) -> int:
        """Weights as safetensors bytes; applied with every request paused in place (their KV kept)."""
        from safetensors.torch import load

        tensors = load(message["safetensors"])
        version = int(message["version"])
        if version < self.version:
            raise ValueError(f"weight update v{version} is older than the served v{self.version}; refused")
        self.engine.collective_rpc(_reload, args=(list(tensors.items()),))
        self.engine.reset_prefix_cache()
        self.version = version
        return version


def _reload(worker, items) -> None:
    """Runs on the vLLM worker: replace the weights in place, then repack a tied output layer."""
    model_runner = worker.model_runner
    model_runner.reload_weights(weights_iterator=iter(items))
    model = model_runner.get_model()
    lm_head = getattr(model, "lm_head", None)
    method = getattr(lm_head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(lm_head)  # the CPU backend keeps a packed copy of lm_head


def _sampled_logprob(entry, token: int) -> float:
    if entry is None or token not in entry:
        return float("nan")
    value = entry[token]
    return float(getattr(value, "logprob", value))


if __name__ == "__main__":
    main()
