"""Helpers shared by the engine tests: building requests, draining the core, reference log-probs."""

from __future__ import annotations

import torch

from asyncrl.config.engine import EngineConfig
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.testing.models import device_under_test, tiny_llama, tiny_qwen2  # noqa: F401 (re-exported)
from asyncrl.types import Generation, Request, SamplingParams


class CharTokenizer:
    """A fake tokenizer for stop strings: token t decodes to one letter."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + t % 26) for t in token_ids)


def request(rid: str, prompt: list[int], **sampling) -> Request:
    return Request(request_id=rid, prompt_token_ids=prompt, sampling=SamplingParams(**sampling))


def engine(model, tokenizer=None, *, asleep: int = 0, **config) -> LLMEngine:
    """An engine over ``model``, moved (in place) to the device under test so the HF references follow it;
    it serves in the model's own dtype unless ``dtype`` is given, so the references compare like with like
    on CUDA too (where ``engine.dtype: auto`` would serve bfloat16)."""
    model_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    defaults = {
        "max_running_requests": 4,
        "max_kv_tokens": 1024,
        "max_prefill_tokens_per_step": 16,
        "dtype": model_dtype,
    }
    config = EngineConfig(**{**defaults, **config})
    return LLMEngine(model.to(device_under_test()), tokenizer, config, asleep=asleep)


def drain(core: LLMEngine, max_steps: int = 10_000) -> dict[str, Generation]:
    finished = {}
    for _ in range(max_steps):
        if not core.has_work():
            return finished
        finished.update({g.request_id: g for g in core.step()})
    raise AssertionError("engine did not drain")


@torch.inference_mode()
def reference_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    """Log-probs of ``output`` after ``prompt`` under one full HF forward pass."""
    logits = model(torch.tensor([prompt + output], device=model.device)).logits[0].float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    return [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(output)]


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt], device=model.device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()
