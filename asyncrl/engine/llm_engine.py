"""The synchronous engine core: add requests, step, abort, pause / update weights / resume.

One ``step()`` = schedule (admit + plan chunks) → run the model over the slot KV cache → sample the tokens
that are due → finish what stopped. Every sampled token is tagged with ``self.version``, the policy version
of the weights that produced it. Nothing here is thread-safe: ``AsyncEngine`` drives it from one thread.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from asyncrl.config.engine import EngineConfig, serving_dtype
from asyncrl.engine import migration
from asyncrl.engine.adapters import adapters_for
from asyncrl.engine.capture_turns import CaptureTurns
from asyncrl.engine.host_weights import HostWeights
from asyncrl.engine.kv_cache import available_bytes, pool_bytes
from asyncrl.engine.model_runner import ModelRunner, kv_dimensions
from asyncrl.engine.requests import check_request
from asyncrl.engine.sampler import sample
from asyncrl.engine.scheduler import Scheduler
from asyncrl.engine.sequence import Sequence
from asyncrl.engine.stop_strings import stop_string_hit
from asyncrl.engine.weights import NamedTensors, copy_into, resolve_update
from asyncrl.types import FinishReason, Generation, Request, checked_request
from asyncrl.weight_sync.receiver import InPlaceReceiver, expected_shapes, tensors_of


class LLMEngine:
    """Continuous batching over one model replica (Qwen2 or Llama architecture, on the model's device)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        config: EngineConfig | None = None,
        *,
        asleep: int = 0,
        device: torch.device | str | None = None,
        capture_turns: CaptureTurns | None = None,
    ) -> None:
        """``asleep``: start asleep at that level (``sleep``), the KV pool never allocated until ``wake``: a
        replacement under a colocated switch (``runtime.switch``) must not take the pool's memory beside the
        trainer's step. Its pool is not checked against the device's free memory then (the trainer may hold
        that memory now; the run's first engines passed the check with the same settings).

        ``device``: where the model serves (default: where its parameters are). A model whose parameters are
        still in host memory (``models.loading.load_configured_model(on_host=True)``) serves on another
        device only when it starts asleep at level 2: its weights stay in host memory, copied into the buffer
        ``sleep(2)`` would have put them in (pinned for CUDA), and reach ``device`` at the first ``wake``, so a replacement
        never holds the whole model on the device beside a colocated trainer's step.

        ``capture_turns``: shared with a trainer on the same device in this process (the inline runtime), so
        that no CUDA graph capture of the decode step overlaps its calls (``engine.capture_turns``)."""
        _check_level(asleep, allowed=(0, 1, 2))
        loaded_on = next(model.parameters()).device
        device = _serving_device(loaded_on, device, asleep)
        self.config = config or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        model_len = self.config.max_model_len or model.config.max_position_embeddings
        self.max_model_len = min(model_len, self.config.max_kv_tokens)
        self.scheduler = Scheduler(
            max_running_requests=self.config.max_running_requests,
            max_kv_tokens=self.config.max_kv_tokens,
            max_prefill_tokens_per_step=self.config.max_prefill_tokens_per_step,
            max_model_len=self.max_model_len,
        )
        self.dtype = cast_to_serving_dtype(model, self.config.dtype, device)
        if device != loaded_on:  # the small buffers (rotary frequencies) serve from the device at once
            move_buffers(model, device)
        if not asleep:
            check_kv_pool_fits(model, self.config, self.max_model_len)
        self.adapters = adapters_for(model, self.dtype)
        self.runner = self._make_runner(device, allocate_kv=not asleep, capture_turns=capture_turns)
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self._init_serving_state(device)
        if asleep:  # counted as a sleep, so that sleeps and wakes pair up; frees nothing at level 1
            self.sleep(asleep)

    def _make_runner(
        self, device: torch.device, *, allocate_kv: bool, capture_turns: CaptureTurns | None
    ) -> ModelRunner:
        """The model runner over ``engine.*``'s slots and decode settings; its KV pool allocated only with
        ``allocate_kv`` (an engine started asleep allocates it at its first ``wake``)."""
        return ModelRunner(
            self.model,
            num_slots=self.config.max_running_requests,
            max_len=self.max_model_len,
            decode_graphs=self.config.decode_graphs,
            decode_graph_min_uses=self.config.decode_graph_min_uses,
            allocate_kv=allocate_kv,
            device=device,
            adapters_fingerprint=self.adapters.fingerprint,
            capture_turns=capture_turns,
        )

    def _init_serving_state(self, device: torch.device) -> None:
        """What changes as the engine serves: its weights' version, pause and sleep state, the host buffers a
        level-2 sleep reuses, its counters and the requests in flight."""
        self.version = 0
        self.in_place = InPlaceReceiver()
        """Weight updates patched in place (delta transport), with the chain fetched before a pause."""
        self.paused = False
        self.asleep = 0
        """The sleep level (``sleep``): 0 awake, 1 KV pool freed, 2 weights on the host too."""
        self.num_sleeps = 0
        self.num_wakes = 0
        """Times this engine slept and woke (``runtime.switch``: once each per step)."""
        pin = torch.device(device).type == "cuda"
        self._host_parameters = HostWeights(pin)
        """Where a level-2 sleep keeps the parameters: allocated (pinned on CUDA) at the first such sleep, reused
        by every later one (``engine.host_weights``)."""
        self._host_adapters = HostWeights(pin)
        """The same for the adapter state, apart: its layout changes with the adapter, the parameters' never."""
        self.num_generated_tokens = 0
        self.busy_seconds = 0.0
        self._sequences: dict[str, Sequence] = {}

    def add_request(self, request: Request) -> None:
        """Queue a request; ``ValueError`` naming it if it is malformed or its id is already in flight."""
        request = checked_request(request)
        if request.request_id in self._sequences:
            raise ValueError(f"request {request.request_id}: a request with this id is already in flight")
        check_request(
            request,
            max_model_len=self.max_model_len,
            vocab_size=self.model.config.vocab_size,
            has_tokenizer=self.tokenizer is not None,
        )
        seq = Sequence.from_request(request, self.config.seed)
        seq.timings["arrival"] = time.perf_counter()
        self.scheduler.add(seq)
        self._sequences[request.request_id] = seq

    def step(self) -> list[Generation]:
        """Advance every running request by one scheduled chunk; return the generations that finished."""
        if self.paused or self.asleep or not self.scheduler.has_work:
            return []
        started = time.perf_counter()
        moves, chunks = self.scheduler.schedule()
        logits = self.runner.run(moves, chunks, self.scheduler.num_slots_in_use)
        finished = self._append_tokens(self.scheduler.commit(chunks), logits)
        self.busy_seconds += time.perf_counter() - started
        return finished

    def abort(self, request_id: str) -> Generation | None:
        """End the request now; its partial generation (``finish_reason="abort"``), or None if not in flight."""
        seq = self.scheduler.abort(request_id)
        return None if seq is None else self._release(seq)

    def export_request(self, request_id: str) -> migration.RequestState | None:
        """Take the request out of this engine with its KV (contract: engine/migration.py); None if not here."""
        seq = self._sequences.pop(request_id, None)
        return None if seq is None else migration.export_request(self, seq)

    def import_request(self, state: migration.RequestState) -> bool:
        """Continue an exported request here; True when its KV was reused, False when it must be prefilled
        again (no slot or KV budget free now). ``ValueError`` on a version mismatch or a duplicate id."""
        if state.request_id in self._sequences:
            raise ValueError(f"request {state.request_id}: a request with this id is already in flight")
        seq = migration.import_request(self, state)
        self._sequences[state.request_id] = seq
        return seq.num_cached > 0

    def pause(self) -> None:
        """Stop stepping; requests stay queued or running with their KV until ``resume()``."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def sleep(self, level: int = 1) -> int:
        """Give the device back while a colocated trainer trains (``runtime.switch``); the bytes freed.
        Level 1 frees the KV pool; level 2 also moves the weights to host memory, into buffers allocated at the
        first such sleep and kept for the engine's life (pinned on CUDA: ``engine.host_weights``). Requests in
        flight stay queued and are prefilled again after ``wake`` (their KV is gone). No step runs asleep."""
        _check_level(level, allowed=(1, 2))
        if self.asleep:
            raise RuntimeError(f"engine is already asleep (level {self.asleep}); wake it first")
        self.scheduler.reset_kv()
        freed = self.runner.cache.release()
        if self.runner.static is not None:
            self.runner.static.release()  # the graphs' pool would outlive the KV pool it points into
        if level == 2:
            freed += self._weights_to_host()
        if self.runner.device.type == "cuda":
            torch.cuda.empty_cache()  # return the blocks to the device, for a trainer in another process too
        self.asleep = level
        self.num_sleeps += 1
        return freed

    def wake(self) -> int:
        """Undo ``sleep``: the weights back on their device (level 2; their host buffers stay, for the next
        sleep), a fresh zeroed KV pool; the bytes allocated (0 when awake already)."""
        if not self.asleep:
            return 0
        allocated = 0
        if self.asleep == 2:  # adapters an update brought while asleep too (made on the host)
            for weight in self._weights():  # a copy even on CPU: the host buffer stays the sleep's alone
                weight.data = weight.data.to(self.runner.device, copy=True)
                allocated += weight.nbytes
        allocated += self.runner.cache.restore()
        self.asleep = 0
        self.num_wakes += 1
        return allocated

    def _weights_to_host(self) -> int:
        """Copy every weight into its host buffer (``HostWeights``) and serve it from there until ``wake``; the
        device bytes freed (none for weights loaded in host memory, never on the device: an engine started
        asleep, ``__init__``'s ``device``)."""
        freed = 0
        parameters, adapters = list(self.model.parameters()), self.adapters.tensors()
        for weights, host in ((parameters, self._host_parameters), (adapters, self._host_adapters)):
            copies = host.hold([weight.data for weight in weights])
            for weight, copy in zip(weights, copies, strict=True):
                if weight.device == self.runner.device:
                    freed += weight.nbytes
                weight.data = copy
        return freed

    def _weights(self) -> list[torch.Tensor]:
        """What a level-2 sleep moves to the host: the parameters and the adapter state beside them (the
        low-rank pairs, or the base copies of merged layers: ``engine.adapters``)."""
        return [*self.model.parameters(), *self.adapters.tensors()]

    def update_weights(self, named_tensors: NamedTensors, version: int, *, partial: bool = False) -> None:
        """Copy new weights into the model and tag later tokens with ``version`` (contract: engine/weights.py).

        ``named_tensors`` may be a ``WeightUpdate``: it is then refused (``WeightSyncError``) if older than the
        served version or not matching the model, before anything is copied. An adapter-only one (kind
        ``lora``) is merged into float32 weights, served low-rank beside half-precision ones
        (``engine.adapters``); a full one replaces them and drops the adapter.

        In-flight requests survive: with ``kv_on_update="recompute"`` their whole context is prefilled again
        under the new weights before they continue; with ``"keep"`` they continue on their old KV.
        """
        if self.in_place.handles(named_tensors):  # a delta: patched in place, no second copy of the model
            self.adapters.restore_base()
            self.in_place.apply(self.model, named_tensors, self.version)
        else:
            named = tensors_of(
                named_tensors, serving_version=self.version, shapes=expected_shapes(self.model)
            )
            adapter = getattr(named_tensors, "adapter", None)  # a WeightUpdate of kind 'lora'
            if adapter is not None:
                self.adapters.apply(named, adapter.scaling, version)
            else:
                pairs = resolve_update(
                    self.model, named, partial=partial
                )  # checked before the base comes back
                self.adapters.restore_base()
                copy_into(pairs)
        self.version = version
        if self.config.kv_on_update == "recompute":
            self.scheduler.reset_kv()

    def apply_bucket(self, named_tensors: NamedTensors) -> None:
        """Copy one bucket of a streamed broadcast (``runtime.EngineActor``) into the model, leaving the
        version as it is until ``finish_stream``; ``ValueError`` naming the first tensor that does not fit the
        model, before any of this bucket is copied."""
        copy_into(resolve_update(self.model, named_tensors, partial=True))

    def finish_stream(self, version: int) -> None:
        """Every bucket of ``version`` was applied: later tokens carry it (as ``update_weights`` would tag
        them), and with ``kv_on_update="recompute"`` in-flight requests are prefilled again."""
        self.version = version
        if self.config.kv_on_update == "recompute":
            self.scheduler.reset_kv()

    def prefetch_weights(self, update: Any) -> None:
        """Read what a coming update needs before the engine pauses for it (delta transport; no-op for the
        others); safe from another thread than the one stepping the engine."""
        self.in_place.prefetch(update, self.version)

    def has_work(self) -> bool:
        return self.scheduler.has_work

    def output_so_far(self, request_id: str) -> list[int] | None:
        """The token ids the request's Generation would hold now (its prefix included); None if not in flight.
        Read between steps, for callers that stream tokens as they are sampled; a fresh list each call, which
        the caller may keep (``AsyncLLMEngine`` hands it to its observer's loop as is, without a second copy)."""
        seq = self._sequences.get(request_id)
        return None if seq is None else seq.output_token_ids

    def stats(self) -> dict[str, Any]:
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_tokens_reserved": self.scheduler.kv_tokens_reserved,
            "kv_tokens_cached": self.scheduler.kv_tokens_cached,
            "kv_tokens_capacity": self.config.max_kv_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "busy_seconds": self.busy_seconds,
            "version": self.version,
            "paused": self.paused,
            "asleep": self.asleep,
            "num_sleeps": self.num_sleeps,
            "num_wakes": self.num_wakes,
            "kv_pool_bytes": self.runner.cache.resident_bytes(),
            "host_weight_bytes": self._host_parameters.nbytes + self._host_adapters.nbytes,
            **(self.runner.static.stats() if self.runner.static is not None else {}),
        }

    def _append_tokens(self, due: list[Sequence], logits: torch.Tensor) -> list[Generation]:
        if not due:
            return []
        out = sample(
            logits,
            [seq.request.sampling for seq in due],
            [seq.sample_seed for seq in due],
            [seq.num_output_tokens for seq in due],
        )
        self.num_generated_tokens += len(due)
        now = time.perf_counter()
        finished = []
        for seq, token_id, logprob in zip(due, out.token_ids, out.logprobs, strict=True):
            seq.append(token_id, logprob, self.version)
            seq.timings.setdefault("ttft_s", now - seq.timings["arrival"])
            reason = self._finish_reason(seq)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                finished.append(self._release(seq))
        return finished

    def _finish_reason(self, seq: Sequence) -> FinishReason | None:
        params, token_id = seq.request.sampling, seq.token_ids[-1]
        if token_id in params.stop_token_ids or (token_id in self.eos_token_ids and not params.ignore_eos):
            return FinishReason.STOP
        if params.stop_strings and stop_string_hit(
            self._decode,
            seq.token_ids,
            seq.num_prompt_tokens,
            params.stop_strings,
            whole=seq.num_output_tokens == len(seq.request.prefix_token_ids) + 1,  # the prefix is unchecked
        ):
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_new_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _release(self, seq: Sequence) -> Generation:
        del self._sequences[seq.request_id]
        seq.timings["latency_s"] = time.perf_counter() - seq.timings.pop("arrival")
        text = (
            None if self.tokenizer is None else self._decode(seq.output_token_ids, skip_special_tokens=True)
        )
        return seq.to_generation(text)

    def _decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def cast_to_serving_dtype(
    model: torch.nn.Module, engine_dtype: str, device: torch.device | None = None
) -> torch.dtype:
    """Cast ``model`` in place to the dtype it is served in on ``device`` (``engine.dtype``, see
    ``serving_dtype``; default: the device its parameters are on) and return that dtype; the KV pool, built
    from the model's parameters, follows it. A model still in host memory is cast there.

    In place because the engine owns the replica it serves (the runtimes hand it its own copy), and a second
    copy of the weights in the serving dtype would cost more memory than the cast saves. Weight updates are
    copied into these parameters, so they arrive cast too (they carry parameters only, never a buffer:
    ``engine.weights``). The cast leaves ``model`` as ``from_pretrained(dtype=target)`` would have built it
    (``cast_like_from_pretrained``)."""
    current = next(model.parameters()).dtype
    device = device or next(model.parameters()).device
    target = getattr(torch, serving_dtype(engine_dtype, str(current).removeprefix("torch."), device.type))
    if target != current:
        cast_like_from_pretrained(model, target)
    return target


def cast_like_from_pretrained(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast ``model`` in place to ``dtype`` the way Hugging Face's ``from_pretrained(dtype=dtype)`` builds it:
    parameters and buffers in ``dtype``, except the rotary modules' frequency buffers (``inv_freq``,
    ``original_inv_freq``), which stay as they are (float32).

    Why not ``model.to(dtype)``: it casts every floating buffer, and bf16 frequencies put the angle of
    position p off by up to p × 2⁻⁹ radians (cos off by 0.2 at position 200, by 1.5 at 1.5 k with Qwen3's
    rope), far past bf16's own rounding of cos (0.002), in the engine's cos/sin table and in HF's rotary
    alike. HF computes the frequencies in float32 whatever the load dtype, and the trainer keeps them so.
    The other buffers of the supported families (Gemma's ``embed_scale``) HF builds in the load dtype, so
    they follow the parameters; ``test_engine_serving_dtype`` compares every parameter and buffer with
    ``from_pretrained``'s, family by family, so a family whose buffers HF treats otherwise is caught there.
    None of the supported families declares ``_keep_in_fp32_modules``, HF's other exception."""
    kept = [
        (module, name, buffer)
        for module in model.modules()
        if _is_rotary(module)
        for name, buffer in module.named_buffers(recurse=False)
    ]
    model.to(dtype)
    for module, name, buffer in kept:
        setattr(module, name, buffer)


def _is_rotary(module: torch.nn.Module) -> bool:
    """A rotary embedding module, recognised as HF's own ``_init_weights`` recognises it to refill its
    frequencies."""
    return "RotaryEmbedding" in type(module).__name__


def _serving_device(loaded_on: torch.device, device: torch.device | str | None, asleep: int) -> torch.device:
    """Where an engine whose model was loaded on ``loaded_on`` serves: ``device`` (default: there), which may
    differ only for an engine that starts asleep at level 2 (its weights move there at its first wake)."""
    serving = loaded_on if device is None else indexed(torch.device(device))
    if serving != loaded_on and asleep != 2:
        raise ValueError(
            f"a model loaded on {loaded_on} serves on {serving} only when its engine starts asleep at "
            f"level 2 (its weights moved there at wake), got asleep={asleep}"
        )
    return serving


def indexed(device: torch.device) -> torch.device:
    """``device`` as the tensors placed there report it (``cuda`` is ``cuda:<current device>``), so that it
    compares equal to their ``.device``."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def move_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Move ``model``'s buffers (not its parameters) to ``device``, in place: what a level-2 sleep leaves on the
    device, for a model whose parameters are still in host memory."""
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            setattr(module, name, buffer.to(device))


def _check_level(level: int, allowed: tuple[int, ...]) -> None:
    if level not in allowed:
        start = "0 (awake), " if 0 in allowed else ""
        raise ValueError(
            f"engine sleep level must be {start}1 (KV pool) or 2 (KV pool and weights), got {level}"
        )


KV_POOL_MEMORY_SHARE = 0.9
"""Most of the device's free memory the preallocated KV pool may take; the rest is left to activations."""


def check_kv_pool_fits(model: torch.nn.Module, config: EngineConfig, max_len: int) -> None:
    """Refuse, naming the settings, a KV pool that cannot fit before allocating it.

    The pool holds every slot's longest context up front, so with ``engine.max_model_len`` unset a real
    model's context window (32 k positions for Qwen2-0.5B) times 64 slots asks for tens of GiB: the process
    would be killed mid-allocation, or swap, instead of saying which setting to lower.
    """
    dims = kv_dimensions(model)
    slots = config.max_running_requests
    need = pool_bytes(num_slots=slots, max_len=max_len, **dims)
    device = next(model.parameters()).device
    free = available_bytes(device)
    if free is None or need <= KV_POOL_MEMORY_SHARE * free:
        return
    fitting_len = int(KV_POOL_MEMORY_SHARE * free * (max_len + 1) / need) - 1
    source = "engine.max_model_len" if config.max_model_len else "the model's max_position_embeddings"
    if max_len == config.max_kv_tokens:
        source = "engine.max_kv_tokens"
    gib = 2**30
    raise ValueError(
        f"the engine's KV pool needs {need / gib:.1f} GiB on {device} ({slots} slots, "
        f"engine.max_running_requests, × {max_len} positions, from {source}; {dims['num_layers']} layers), "
        f"more than {KV_POOL_MEMORY_SHARE:.0%} of the {free / gib:.1f} GiB available there: set "
        f"engine.max_model_len to the longest prompt + rollout.max_new_tokens the run needs (at most "
        f"{max(fitting_len, 0)} fits with {slots} slots), or lower engine.max_running_requests"
    )


def eos_token_ids(model: torch.nn.Module, tokenizer: Any = None) -> frozenset[int]:
    """EOS ids from the generation config, else the model config, else the tokenizer (int or list)."""
    generation_config = getattr(model, "generation_config", None)
    for source in (generation_config, model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            return frozenset([value] if isinstance(value, int) else value)
    return frozenset()
