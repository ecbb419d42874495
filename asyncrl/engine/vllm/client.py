"""The asyncrl side of the vLLM backend: the proxy's ``EngineClient`` over a worker in vLLM's environment.

Key decision: vLLM's CPU wheel pins an older transformers than asyncrl, so the engine lives in its own
environment behind a process boundary (``worker_main.py``, started with that environment's interpreter) and
only builtins cross its socket: a weight update travels bucket by bucket through shared-memory files
(``bucket_stream``), an adapter update (small) as safetensors bytes. The proxy cannot tell this client from
the built-in engine: ``generate`` returns token ids, per-token log-probs and per-token policy versions;
``abort`` returns the generation so far (a continued request's prefix included); ``pause`` /
``update_weights`` / ``resume`` keep running requests and their KV ("keep": tokens after the update are the
new policy's and tagged with its version). A weight update is checked against the served model's names and
shapes (read from its safetensors headers) before a byte is sent, so a mismatched update is a
``WeightSyncError`` and the engine keeps serving its old version; the worker checks each bucket against the
manifest again and refuses a partial update by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

import torch

from asyncrl.config.engine import EngineConfig, VLLMConfig, serving_dtype
from asyncrl.config.model import ModelConfig
from asyncrl.engine.async_engine import resolve_threadsafe
from asyncrl.engine.vllm.bucket_stream import DEFAULT_BUCKET_BYTES, stream_update
from asyncrl.models.loading import model_dir, resolve_device
from asyncrl.types import FinishReason, Generation, Request
from asyncrl.weight_sync.broadcast import GROUP_PREFIX, pin_staged
from asyncrl.weight_sync.protocol import (
    ManifestEntry,
    WeightSyncError,
    WeightSyncTimeout,
    WeightUpdate,
    check_manifest,
    check_version,
)
from asyncrl.weight_sync.receiver import tensors_of

WORKER = Path(__file__).with_name("worker_main.py")
UPDATE_REFUSED = "UpdateRefused"
"""The name of the worker's error for an update its manifest check refuses (``worker_main.UpdateRefused``)."""


class VLLMWorkerError(RuntimeError):
    """The vLLM worker failed a call or died; the message carries its reason."""


def default_vllm_python() -> Path:
    """Where ``asyncrl backends install vllm`` puts the vLLM environment's interpreter."""
    return Path.home() / ".cache" / "asyncrl" / "vllm-venv" / "bin" / "python"


def vllm_python(config: VLLMConfig | None = None) -> Path | None:
    """The vLLM environment's interpreter (config, ``$ASYNCRL_VLLM_PYTHON``, the default), if it exists."""
    configured = (config.python if config else "") or os.environ.get("ASYNCRL_VLLM_PYTHON", "")
    path = Path(configured) if configured else default_vllm_python()
    return path if path.is_file() else None


class VLLMEngineClient:
    """One vLLM engine replica as the proxy drives it (see ``asyncrl.proxy.worker.EngineClient``)."""

    def __init__(
        self, process: subprocess.Popen, conn: Any, expected_shapes: dict[str, tuple[int, ...]]
    ) -> None:
        self._process = process
        self._conn = conn
        self._expected_shapes = expected_shapes
        self._send_lock = threading.Lock()
        self._calls = itertools.count()
        self._waiting: dict[Any, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._generations: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future, Request]] = {}
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self.version = 0
        self.weight_sync_timeout_s = 300.0
        """Deadline of every weight operation on the worker (``weight_sync.timeout_s``; the runtime sets it)."""
        self.bucket_bytes = DEFAULT_BUCKET_BYTES
        """Largest bucket of a weight update (``weight_sync.bucket_mb``; the runtime sets it)."""
        self.broadcast_apply = "staged"
        """How a broadcast reaches this engine (``RunConfig.broadcast_apply``; the runtime sets it): staged whole
        on vLLM's worker until ``update_weights``, or streamed into the model as it arrives (``stage_weights``)."""
        self.streamed_version: int | None = None
        """The last version a whole stream applied (what ``update_weights`` of it confirms)."""
        self.streamed_failed: dict[int, WeightSyncError] = {}
        """Streams the worker refused, by version: ``update_weights`` of one raises its failure."""
        self.last_stream: dict[str, Any] | None = None
        """The worker's report of the last stream: ``held_peak`` and ``largest_bucket`` bytes, its error."""
        self.num_generated_tokens = 0
        self.request_seeds = False
        """Whether each request samples from its own seed (``engine.vllm.request_seeds``; ``start`` sets it):
        vLLM then samples it through a per-request generator, which is slower."""
        self._reader = threading.Thread(target=self._read_loop, name="asyncrl-vllm-reader", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls,
        model_dir: str | os.PathLike[str],
        config: VLLMConfig,
        *,
        max_model_len: int,
        seed: int = 0,
        expected_shapes: dict[str, tuple[int, ...]] | None = None,
    ) -> VLLMEngineClient:
        """Start a worker serving ``model_dir`` and wait until its engine is built and it says ready, all within
        ``config.startup_timeout_s`` (``engine.vllm.startup_timeout_s``): past it the worker's whole session is
        killed and ``VLLMWorkerError`` names the setting. The deadline covers vLLM's model load, not only the
        socket: the worker listens before it builds its engine (loading, compiling, capturing graphs). On CUDA
        the worker first waits, within the same deadline, until its devices have the free memory vLLM demands
        at start (``worker_main.wait_for_engine_memory``: a replaced engine's processes may still hold it).
        ``expected_shapes``: the served tensors' names and shapes where ``model_dir`` has no safetensors to
        read them from (a model vLLM initialises itself, ``engine_args: {load_format: dummy}``)."""
        python = vllm_python(config)
        if python is None:
            raise FileNotFoundError(
                "engine.backend=vllm: no vLLM environment found; run `asyncrl backends install vllm` "
                "or set engine.vllm.python"
            )
        port, authkey = _free_port(), secrets.token_bytes(16)
        deadline = time.monotonic() + config.startup_timeout_s
        command = [
            str(python),
            str(WORKER),
            *worker_args(model_dir, config, max_model_len=max_model_len, seed=seed),
        ]
        # the worker dies with this process from its first moment (``worker_main.die_with_parent``)
        command += ["--port", str(port), "--authkey-hex", authkey.hex(), "--parent-pid", str(os.getpid())]
        # its wait for device memory ends early enough for its error to reach this side before the deadline
        command += ["--start-deadline", repr(deadline - WORKER_REPORT_MARGIN_S)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # never asyncrl's packages there
        env |= {"OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}
        log = Path(os.environ.get("ASYNCRL_VLLM_LOG", os.devnull))
        # stderr goes to a file, not a pipe: an unread pipe would fill with vLLM's logs and block the worker
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker; closed with the process)
        # a session of its own: vLLM's engine-core processes are the worker's children, and a kill must reach them
        process = subprocess.Popen(
            command, stdout=log.open("ab"), stderr=stderr, env=env, start_new_session=True
        )
        process._asyncrl_stderr = stderr  # type: ignore[attr-defined]
        conn = _connect(process, port, authkey, deadline, config.startup_timeout_s)
        _wait_ready(process, conn, deadline, config.startup_timeout_s)
        client = cls(process, conn, model_shapes(model_dir) if expected_shapes is None else expected_shapes)
        client.request_seeds = bool(config.request_seeds)
        return client

    # ---- the EngineClient protocol ---------------------------------------------------------------------

    @classmethod
    def for_model(cls, model: ModelConfig, engine: EngineConfig, *, seed: int = 0) -> VLLMEngineClient:
        """A worker for the model ``model.path`` names (a directory, or a hub id resolved into the hub cache
        here, so the worker reads a directory), its context length ``engine.max_model_len`` or else the
        model's own ``max_position_embeddings``; it serves in ``engine.dtype`` resolved as the trainer resolves it
        for the cast at publish, so vLLM serves exactly what arrives (``EngineConfig`` refuses an
        ``engine.vllm.dtype`` that differs)."""
        import dataclasses

        from transformers import AutoConfig

        directory = model_dir(model)
        max_model_len = (
            engine.max_model_len
            or AutoConfig.from_pretrained(directory, local_files_only=True).max_position_embeddings
        )
        dtype = serving_dtype(engine.dtype, model.dtype, resolve_device(model.device).type)
        vllm = dataclasses.replace(engine.vllm, dtype=dtype)
        return cls.start(directory, vllm, max_model_len=max_model_len, seed=seed)

    async def generate(self, request: Request) -> Generation:
        """The finished generation (``finish_reason`` abort when aborted: the tokens generated so far). A request
        with a prefix (a continued partial rollout) resumes after it, and its generation starts with it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._raise_if_failed()
            if request.request_id in self._generations:
                raise ValueError(f"request {request.request_id!r} is already running on this engine")
            self._generations[request.request_id] = (loop, future, request)
        sampling = request.sampling
        self._send(
            {
                "op": "add",
                "call": None,
                "request_id": request.request_id,
                "prompt_token_ids": list(request.prompt_token_ids) + list(request.prefix_token_ids),
                "sampling": {
                    "max_new_tokens": sampling.max_new_tokens - len(request.prefix_token_ids),
                    "temperature": sampling.temperature,
                    "top_p": sampling.top_p,
                    "top_k": sampling.top_k,
                    "seed": sampling.seed if self.request_seeds else None,
                    "stop_token_ids": list(sampling.stop_token_ids),
                    "stop_strings": list(sampling.stop_strings),
                    "ignore_eos": sampling.ignore_eos,
                },
            }
        )
        try:
            return await future
        except asyncio.CancelledError:
            await self.abort(request.request_id)
            raise

    async def abort(self, request_id: str) -> Generation | None:
        """The aborted request's whole generation, as its ``generate`` returns it (the built-in engine's
        contract): the request's prompt ids, then its prefix and the tokens generated here, with their
        log-probs and versions; None if it is not running here. The worker knows only the tokens it generated
        (it got prompt and prefix as one context), so the prefix comes from the request as it was sent."""
        with self._lock:
            running = self._generations.get(request_id)
        result = await self._call("abort", request_id=request_id)
        if result is None:
            return None
        if running is None:  # never: a request leaves the worker before its end reaches this side
            raise VLLMWorkerError(f"vLLM worker aborted request {request_id!r}, which this client never sent")
        return self._generation(result, running[2])

    async def pause(self) -> None:
        await self._call("pause")

    async def resume(self) -> None:
        await self._call("resume")

    async def sleep(self, level: int = 1) -> int:
        """vLLM's sleep mode (the worker's ``op_sleep``: level 1 weights to host and KV dropped, level 2 both
        dropped); a ``RuntimeError`` naming why where the installed vLLM or platform has none."""
        return await self._call("sleep", self.weight_sync_timeout_s, level=level)

    async def wake(self) -> int:
        """Undo ``sleep`` (vLLM's ``wake_up``)."""
        return await self._call("wake", self.weight_sync_timeout_s)

    async def update_weights(
        self, named_tensors: WeightUpdate | Mapping[str, Any] | Iterable[tuple[str, Any]], version: int
    ) -> None:
        """Check the update against the served model, then stream it to the worker bucket by bucket through
        shared memory (``WeightSyncError`` on a mismatch or a stale version: nothing is sent, the old weights
        keep serving). An adapter-only update (kind ``lora``) becomes vLLM's newest LoRA adapter
        (``worker_main.op_update_adapter``)."""
        if isinstance(named_tensors, WeightUpdate) and named_tensors.transport == "broadcast":
            if self.broadcast_apply == "streamed":
                self._confirm_streamed(named_tensors, version)
            else:
                await self._apply_staged(named_tensors, version)
            return
        named = tensors_of(named_tensors, serving_version=self.version, shapes=self._expected_shapes)
        if getattr(named_tensors, "adapter", None) is not None:  # checked by tensors_of
            await self._update_adapter(named, named_tensors.adapter.scaling, version)
            return
        if isinstance(named_tensors, WeightUpdate):  # its manifest was checked by tensors_of
            manifest, items = named_tensors.manifest, named
        else:  # a mapping is read twice (manifest, then bytes), so a lazy one never holds every tensor
            items = named.items() if isinstance(named, Mapping) else list(named)
            manifest = tuple(
                ManifestEntry(name=name, dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape))
                for name, t in items
            )
            update = WeightUpdate(version=version, transport="vllm-buckets", manifest=manifest, handle=None)
            check_version(update, self.version)
            check_manifest(update, self._expected_shapes)
        try:
            self.version = await stream_update(
                self._call, manifest, items, version, self.bucket_bytes, self.weight_sync_timeout_s
            )
        except VLLMWorkerError as err:
            if UPDATE_REFUSED in str(err):  # the worker's manifest check: named, never a dead engine
                raise WeightSyncError(str(err)) from err
            raise

    async def _update_adapter(self, named: Any, scaling: float, version: int) -> None:
        """Adapter pairs as safetensors bytes (small: rank × width per layer), served by vLLM's LoRA support."""
        from safetensors.torch import save

        items = dict(named.items() if isinstance(named, Mapping) else named)
        payload = await asyncio.to_thread(
            save, {name: t.detach().contiguous().clone().cpu() for name, t in items.items()}
        )
        self.version = await self._call(
            "update_adapter",
            self.weight_sync_timeout_s,
            version=version,
            safetensors=payload,
            scaling=scaling,
        )

    async def join_weight_group(
        self, *, host: str, port: int, rank: int, world_size: int, device: str, timeout_s: float
    ) -> None:
        """Make vLLM's worker a member (``rank``) of the trainer's weight-broadcast group
        (``weight_sync.broadcast``); returns once every member joined. A staged update lands in host memory
        on vLLM's worker, pinned where ``device`` is a GPU (``pin_staged``, the built-in engine's rule)."""
        await self._call(
            "join_group",
            timeout_s + 5,
            host=host,
            port=port,
            rank=rank,
            world_size=world_size,
            device=device,
            group_timeout_s=timeout_s,  # the group's own deadline; the call's (above) allows 5 s more
            prefix=GROUP_PREFIX,
            pin_staged=pin_staged(torch.device(device)),
        )

    async def stage_weights(self) -> int:
        """Receive the next broadcast update: into staging on vLLM's worker (applied later by
        ``update_weights``), or, streamed, into the model bucket by bucket as it arrives (``worker_main.
        op_stream``, each bucket checked by name against the served model); its version. A refused stream
        still returns its version (the group's publish succeeds for the other engines) and its
        ``update_weights`` raises the refusal; a failed broadcast raises here."""
        if self.broadcast_apply != "streamed":
            return await self._call("stage", self.weight_sync_timeout_s)
        shapes = [[name, list(shape)] for name, shape in self._expected_shapes.items()]
        try:
            report = await self._call("stream", self.weight_sync_timeout_s, shapes=shapes)
        except VLLMWorkerError as err:
            if UPDATE_REFUSED in str(err):
                raise WeightSyncError(str(err)) from err
            raise
        self.last_stream = report
        version = report["version"]
        if report["error"] is not None:
            self.streamed_failed[version] = WeightSyncError(
                f"vLLM worker: streamed weight update v{version} refused: {report['error']}"
            )
            return version
        self.version = self.streamed_version = version
        self.streamed_failed = {v: e for v, e in self.streamed_failed.items() if v > version}
        return version

    def streamed_versions(self) -> set[int]:
        """Versions a stream delivered here, applied or refused (``update_weights`` of one confirms it)."""
        landed = {self.streamed_version} if self.streamed_version is not None else set()
        return landed | set(self.streamed_failed)

    def _confirm_streamed(self, update: WeightUpdate, version: int) -> None:
        """``update_weights`` of a streamed broadcast: the weights landed as they arrived, so only its
        refusal (``WeightSyncError``, named) or its absence is left to report."""
        if update.version != version:
            raise WeightSyncError(
                f"update_weights: the update is version {update.version}, the call says {version}"
            )
        if version in self.streamed_failed:
            raise self.streamed_failed.pop(version)
        if version != self.streamed_version:
            raise WeightSyncError(
                f"weight update v{version}: no stream of it reached this engine "
                f"(the last streamed is v{self.streamed_version})"
            )

    async def _apply_staged(self, update: WeightUpdate, version: int) -> None:
        """Serve a staged broadcast update after checking its version and manifest against the served
        model (``WeightSyncError``: nothing is applied, the old weights keep serving)."""
        if update.version != version:
            raise WeightSyncError(
                f"update_weights: the update is version {update.version}, the call says {version}"
            )
        check_version(update, self.version)
        check_manifest(update, self._expected_shapes)
        self.version = await self._call("apply_staged", self.weight_sync_timeout_s, version=version)

    async def weight_digest(self) -> dict[str, str]:
        """vLLM's parameter name → sha256 of the bytes it serves (its fused names: ``qkv_proj``,
        ``gate_up_proj``); for checking an update bit for bit."""
        return await self._call("weight_digest", self.weight_sync_timeout_s)

    async def worker_stats(self) -> dict[str, Any]:
        """The worker's own view: served version, paused, tokens generated so far per running request."""
        return await self._call("stats")

    def stats(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "num_running": len(self._generations),
            "num_generated_tokens": self.num_generated_tokens,
            "worker_pid": self._process.pid,
            "alive": self._process.poll() is None,
        }

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the worker process; waiting callers get ``VLLMWorkerError``."""
        with contextlib.suppress(OSError, VLLMWorkerError):  # already gone: nothing to stop
            self._send({"op": "shutdown"})
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(self._process)
        self._conn.close()

    # ---- plumbing ------------------------------------------------------------------------------------

    async def _call(self, op: str, timeout_s: float | None = None, **fields: Any) -> Any:
        """The worker's reply to ``op``; with ``timeout_s`` (weight operations) ``WeightSyncTimeout`` past it,
        and the worker bounds its own side by the same deadline."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call = next(self._calls)
        with self._lock:
            self._raise_if_failed()
            self._waiting[call] = (loop, future)
        self._send({"op": op, "call": call, "timeout_s": timeout_s, **fields})
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            with self._lock:
                self._waiting.pop(call, None)
            raise WeightSyncTimeout(
                f"vLLM worker (pid {self._process.pid}): {op} not answered within {timeout_s} s"
            ) from None

    def _send(self, message: dict[str, Any]) -> None:
        with self._send_lock:
            try:
                self._conn.send(message)
            except OSError as err:
                raise VLLMWorkerError(f"vLLM worker (pid {self._process.pid}) is gone: {err}") from err

    def _read_loop(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                self._dispatch(message)
        except (EOFError, OSError) as err:
            code = self._process.poll()
            self._fail(
                VLLMWorkerError(
                    f"vLLM worker (pid {self._process.pid}) stopped (exit {code}): {_stderr_tail(self._process) or err}"
                )
            )

    def _dispatch(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if event == "fatal":  # vLLM's engine died in the worker: every waiting call fails with its reason
            self._fail(
                VLLMWorkerError(
                    f"vLLM engine failed in the worker: {message['error']}\n{message['traceback']}"
                )
            )
            return
        if event == "finished":
            generation = message["generation"]
            with self._lock:
                waiting = self._generations.pop(generation["request_id"], None)
            self.num_generated_tokens += len(generation["token_ids"])
            if waiting is not None:
                loop, future, _ = waiting
                resolve_threadsafe(loop, future, result=self._generation(generation, waiting[2]))
            return
        if event == "error" and message["call"] is None:  # a request the worker refused: fail its generate
            with self._lock:
                refused = self._generations.pop(message.get("request_id"), None)
            if refused is not None:
                error = VLLMWorkerError(
                    f"vLLM worker refused request {message['request_id']}: {message['error']}"
                )
                resolve_threadsafe(refused[0], refused[1], exception=error)
            return
        with self._lock:
            waiting_call = self._waiting.pop(message["call"], None)
        if waiting_call is None:
            return
        loop, future = waiting_call
        if event == "error":
            resolve_threadsafe(loop, future, exception=VLLMWorkerError(f"vLLM worker: {message['error']}"))
        else:
            resolve_threadsafe(loop, future, result=message["result"])

    @staticmethod
    def _generation(data: dict[str, Any], request: Request) -> Generation:
        """``request``'s Generation from the worker's (which holds only the tokens generated on this engine):
        its prompt ids, and its prefix before the new tokens, log-probs and versions."""
        return Generation(
            request_id=data["request_id"],
            prompt_token_ids=list(request.prompt_token_ids),
            token_ids=list(request.prefix_token_ids) + list(data["token_ids"]),
            logprobs=list(request.prefix_logprobs) + list(data["logprobs"]),
            versions=list(request.prefix_versions) + list(data["versions"]),
            finish_reason=FinishReason(data["finish_reason"]),
        )

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            self._failure = error
            waiting = list(self._waiting.values()) + [
                (loop, fut) for loop, fut, _ in self._generations.values()
            ]
            self._waiting.clear()
            self._generations.clear()
        for loop, future in waiting:
            resolve_threadsafe(loop, future, exception=error)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise VLLMWorkerError(str(self._failure)) from self._failure


def model_shapes(model_dir: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Parameter name → shape of a save_pretrained directory, from its safetensors headers (no tensor read);
    a tied model's ``lm_head.weight`` is added under its own name, as weight sync always sends it."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    if "lm_head.weight" not in shapes and "model.embed_tokens.weight" in shapes:
        shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]
    return shapes


STARTUP_KEY = "engine.vllm.startup_timeout_s"
"""The setting whose deadline a worker's start missed (named by the error, so the fix is one search away)."""

WORKER_REPORT_MARGIN_S = 2.0
"""How long before the start deadline the worker gives up waiting for device memory
(``worker_main.wait_for_engine_memory``), so that its ``DeviceMemoryBusy`` ends it and reaches this side as the
reason, rather than this side's kill at the deadline. The worker gets the deadline as ``time.monotonic()``
(``--start-deadline``): Linux's monotonic clock is one for every process of the machine."""


def _connect(process: subprocess.Popen, port: int, authkey: bytes, deadline: float, timeout_s: float) -> Any:
    """The connection to the worker's socket, opened before ``deadline`` (``time.monotonic``)."""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise VLLMWorkerError(
                f"vLLM worker exited with {process.returncode} before answering:\n{_stderr_tail(process)}"
            )
        try:
            return Client(("127.0.0.1", port), authkey=authkey)
        except ConnectionRefusedError:
            time.sleep(0.1)
    _kill(process)
    raise VLLMWorkerError(
        f"vLLM worker (pid {process.pid}) did not open its socket within {STARTUP_KEY}={timeout_s:g} s; "
        "killed it"
    )


EXIT_GRACE_S = 10.0
"""How long a worker whose connection closed during start-up may take to exit on its own: its traceback reaches
its stderr only as its interpreter exits, after the connection closed, and a kill before then loses it."""


def _wait_ready(process: subprocess.Popen, conn: Any, deadline: float, timeout_s: float) -> None:
    """Wait for the worker's ``ready`` (sent once vLLM's engine is built) until ``deadline``; a worker that
    misses it, dies or says anything else is killed with its session (vLLM's engine core included) and the
    ``VLLMWorkerError`` says why: the wait never outlives the deadline, whatever vLLM does meanwhile."""
    try:
        answered = conn.poll(max(0.0, deadline - time.monotonic()))
        ready = conn.recv() if answered else None
    except (EOFError, OSError):  # it is dying while building its engine: its stderr says why, once written
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=EXIT_GRACE_S)
        _kill(process)
        conn.close()
        raise VLLMWorkerError(
            f"vLLM worker exited with {process.returncode} while starting its engine:\n{_stderr_tail(process)}"
        ) from None
    if ready is not None and ready.get("event") == "ready":
        return
    _kill(process)
    conn.close()
    if ready is None:
        raise VLLMWorkerError(
            f"vLLM worker (pid {process.pid}) did not load its model and answer within {STARTUP_KEY}="
            f"{timeout_s:g} s; killed it (raise {STARTUP_KEY} for a large model or a first CUDA-graph capture)"
            f"\n{_stderr_tail(process)}"
        )
    raise VLLMWorkerError(f"vLLM worker did not start: {ready}")


def _kill(process: subprocess.Popen) -> None:
    """Kill the worker and every process of its session (vLLM's engine core and its workers)."""
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _stderr_tail(process: subprocess.Popen, num_chars: int = 3000) -> str:
    """The end of what the worker wrote to stderr (its stderr is a temporary file, see ``start``)."""
    stream = getattr(process, "_asyncrl_stderr", None)
    if stream is None:
        return ""
    stream.seek(0)
    return stream.read().decode(errors="replace")[-num_chars:]


def worker_args(
    model_dir: str | os.PathLike[str], config: VLLMConfig, *, max_model_len: int, seed: int
) -> list[str]:
    """The worker's command-line arguments for serving ``model_dir`` as ``config`` says (connection aside):
    what ``worker_main.parse_args`` reads and turns into vLLM's engine arguments."""
    return [
        "--model",
        str(model_dir),
        "--dtype",
        # unresolved (``start`` called directly): float32, not vLLM's "auto", which serves an fp32 model in half
        config.dtype or "float32",
        "--max-model-len",
        str(max_model_len),
        "--seed",
        str(seed),
        "--kv-cache-gib",
        str(config.kv_cache_gib),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--gpu-memory-utilization",
        str(config.gpu_memory_utilization),
        "--engine-args-json",
        json.dumps({"tensor_parallel_size": config.tensor_parallel_size, **config.engine_args}),
        "--max-lora-rank",
        str(config.max_lora_rank),
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
