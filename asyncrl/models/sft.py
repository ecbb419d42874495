"""Supervised warm start: train a tiny model on task demonstrations so RL starts from a partial solver.

Key decisions: the loss covers only the response and the token that ends it (prompt tokens are labelled -100),
so the model learns to answer, not to write prompts; prompt and response are tokenised separately and
concatenated, exactly as the engine sees them at generation time. The ending trained is the one sampling stops
at: EOS after a plain prompt, and after a chat-templated prompt the template's own end-of-turn token
(``<|im_end|>`` for ChatML), taken from the template's rendering of the whole conversation, demonstration
included (``chat_response_text``), since rollouts and evaluation stop a templated turn there (``PromptStops``).
Evaluation samples at temperature 1 (the RL behaviour policy) and reports mean reward and pass@k, whose gap is
the headroom RL can claim.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from asyncrl.config.sft import SFTConfig
from asyncrl.config.task import TaskConfig
from asyncrl.data import TaskSample, make_task, render_prompt
from asyncrl.data.base import is_chat_templated
from asyncrl.data.procedural import GENERATORS
from asyncrl.metrics.progress import Progress
from asyncrl.models.corpus import sample_texts
from asyncrl.models.loading import save_tiny
from asyncrl.models.tiny import build_tiny_model
from asyncrl.models.tokenizer import train_tokenizer
from asyncrl.rewards import get_reward
from asyncrl.serve.chat_format import PromptStops

IGNORE_INDEX = -100
"""Label of positions that carry no loss (prompt and padding), as Hugging Face losses expect."""


@dataclass(frozen=True, kw_only=True)
class EncodedExample:
    """Token ids of prompt + response + its ending (``encode_example``), and labels IGNORE_INDEX on the prompt."""

    input_ids: list[int]
    labels: list[int]


@dataclass(frozen=True, kw_only=True)
class EvalResult:
    """Sampling evaluation on held-out prompts."""

    mean_reward: float
    """Mean reward over every sample (mean@1)."""
    pass_at_k: float
    """Share of prompts with at least one correct sample among k."""
    k: int
    num_prompts: int
    mean_response_tokens: float
    seconds: float


def tokenizer_texts(seed: int, num_per_task: int = 2000) -> list[str]:
    """Texts the tokenizer is trained on: every built-in task's prompts and responses plus a generic corpus,
    so one tokenizer serves all built-in tasks."""
    texts = sample_texts(num_per_task, seed=seed)
    for name in GENERATORS:
        config = TaskConfig(type=name, seed=seed, num_train=num_per_task, num_eval=1)
        texts += [s.prompt + s.demonstration for s in make_task(config).split("train")]
    return texts


def encode_example(tokenizer: Any, sample: TaskSample) -> EncodedExample:
    """Prompt ids then the response's ids up to the token sampling stops at; only the response is labelled.

    A plain prompt's response is its demonstration then EOS. A chat-templated prompt's is what the template
    renders after the prompt for the assistant turn (``chat_response_text``: for ChatML, the demonstration then
    ``<|im_end|>\\n``), cut after its end-of-turn token (``end_of_turn_ids``): ``<|im_end|>`` is trained, the
    newline after it is not, as sampling stops at ``<|im_end|>`` and never writes it. A template whose turns
    close with no special token has no end-of-turn stop, so its rendered turn is followed by EOS, the only stop."""
    return encode_examples(tokenizer, [sample])[0]


def encode_examples(tokenizer: Any, samples: Sequence[TaskSample]) -> list[EncodedExample]:
    """``encode_example`` for many samples, tokenised in two batched calls (fast)."""
    missing = [s.uid for s in samples if s.demonstration is None]
    if missing:
        raise ValueError(f"sample {missing[0]} has no demonstration to train on")
    prompt_texts = [render_prompt(s, tokenizer) for s in samples]
    stops = PromptStops(tokenizer)
    response_texts = [
        chat_response_text(tokenizer, s, p) if is_chat_templated(s, tokenizer) else s.demonstration
        for s, p in zip(samples, prompt_texts, strict=True)
    ]
    prompts = tokenizer(prompt_texts, add_special_tokens=False)["input_ids"]
    responses = tokenizer(response_texts, add_special_tokens=False)["input_ids"]
    examples = []
    for sample, p, r in zip(samples, prompts, responses, strict=True):
        target = _ended(r, stops(sample), tokenizer.eos_token_id)
        examples.append(EncodedExample(input_ids=p + target, labels=[IGNORE_INDEX] * len(p) + target))
    return examples


def chat_response_text(tokenizer: Any, sample: TaskSample, prompt_text: str) -> str:
    """What the chat template renders after ``prompt_text`` (the sample's prompt with the generation prompt) when
    the conversation goes on with the demonstration as the assistant's turn: the demonstration and whatever
    the template closes a turn with. Rendered, not assembled by hand, so the turn ends as the template ends it."""
    messages = [dict(m) for m in sample.messages or ()]
    messages.append({"role": "assistant", "content": sample.demonstration})
    whole = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=False, **sample.chat_template_kwargs
    )
    if not whole.startswith(prompt_text):
        raise ValueError(
            f"sample {sample.uid}: the chat template renders the demonstration's turn by rewriting the prompt "
            "before it, so prompt and demonstration cannot be trained as the engine sees them; train on plain "
            "prompts (task.chat_template: never)"
        )
    return whole[len(prompt_text) :]


def _ended(response: list[int], end_of_turn: tuple[int, ...], eos: int) -> list[int]:
    """``response`` up to and with its first end-of-turn token, or with EOS appended where it has none."""
    cut = next((i for i, token in enumerate(response) if token in end_of_turn), None)
    return response[: cut + 1] if cut is not None else [*response, eos]


def collate(examples: Sequence[EncodedExample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` ([B, T]); padding is never labelled."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        labels[row, :n] = torch.tensor(example.labels)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def sft_loss(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    label_smoothing: float = 0.0,
    labelled_tokens: int | None = None,
) -> torch.Tensor:
    """Mean next-token cross-entropy over labelled (response) tokens of the batch; with ``labelled_tokens``, the
    sum over this batch divided by that count instead (a micro-batch's share of its whole batch's mean)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    shifted_logits = logits[:, :-1].float()  # position t predicts token t + 1
    shifted_labels = batch["labels"][:, 1:]
    loss = torch.nn.functional.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.shape[-1]),
        shifted_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
        reduction="mean" if labelled_tokens is None else "sum",
    )
    return loss if labelled_tokens is None else loss / labelled_tokens


def micro_batches(examples: Sequence[EncodedExample], max_tokens: int) -> list[list[EncodedExample]]:
    """Consecutive runs of ``examples`` whose padded size (rows × longest row) stays within ``max_tokens``; an
    example longer than that is a micro-batch of its own."""
    out: list[list[EncodedExample]] = []
    width = 0
    for example in examples:
        wider = max(width, len(example.input_ids))
        if out and wider * (len(out[-1]) + 1) <= max_tokens:
            out[-1].append(example)
            width = wider
        else:
            out.append([example])
            width = len(example.input_ids)
    return out


def lr_at(step: int, *, peak: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup_steps``, then a half cosine down to 10 % of it at the end."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def length_batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Index batches of examples of similar length, in random order: one epoch.

    Long-tailed lengths make random batches mostly padding (one long example pads all the short ones);
    sorting by length (ties broken at random) before chunking keeps the padding small.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def train_steps(
    model: torch.nn.Module,
    examples: Sequence[EncodedExample],
    config: SFTConfig,
    pad_token_id: int,
    log: Callable[[str], None] = print,
    progress: Progress | None = None,
) -> list[float]:
    """Run the optimizer loop until ``max_steps`` or ``max_minutes``; returns the loss of every step.

    With ``progress`` the loss is shown there every step instead of logged every ``log_every`` steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    rng = random.Random(config.seed)
    lengths = [len(e.input_ids) for e in examples]
    batches: list[list[int]] = []
    deadline = time.monotonic() + 60.0 * config.max_minutes
    losses: list[float] = []
    model.train()
    for step in range(config.max_steps):
        if time.monotonic() > deadline:
            log(f"sft: time budget of {config.max_minutes:g} min reached at step {step}")
            break
        batches = batches or length_batches(lengths, config.batch_size, rng)
        lr = lr_at(step, peak=config.lr, warmup_steps=config.warmup_steps, total_steps=config.max_steps)
        parts = micro_batches([examples[i] for i in batches.pop()], config.max_tokens_per_microbatch)
        losses.append(_optimizer_step(model, optimizer, parts, pad_token_id, lr, config.label_smoothing))
        if progress is not None:
            progress.update(step + 1, {"loss": sum(losses[-10:]) / len(losses[-10:])})
        elif config.log_every and (step + 1) % config.log_every == 0:
            recent = losses[-config.log_every :]
            log(f"sft: step {step + 1}/{config.max_steps} loss {sum(recent) / len(recent):.4f}")
    model.eval()
    return losses


def _optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    parts: list[list[EncodedExample]],
    pad_token_id: int,
    lr: float,
    label_smoothing: float,
) -> float:
    """One optimizer step on a batch given as micro-batches: gradients accumulate to the batch's mean loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    labelled = sum(sum(label != IGNORE_INDEX for label in e.labels[1:]) for part in parts for e in part)
    total = 0.0
    for part in parts:
        loss = sft_loss(model, collate(part, pad_token_id), label_smoothing, labelled)
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return total


@torch.no_grad()
def evaluate_by_sampling(
    model: Any,
    tokenizer: Any,
    samples: Sequence[TaskSample],
    *,
    k: int,
    max_new_tokens: int,
    seed: int,
    batch_size: int = 64,
) -> EvalResult:
    """Mean reward and pass@k of temperature-1 samples (Hugging Face ``generate``) on ``samples``.

    Prompts are batched by the length of their reference response (prompt length without one), so one long
    generation does not hold up a batch of short ones; each sample is scored by its own default reward.
    """
    start = time.perf_counter()
    torch.manual_seed(seed)
    correct: dict[str, list[float]] = {s.uid: [] for s in samples}
    num_tokens: list[int] = []
    ordered = sorted(samples, key=lambda s: len(s.demonstration or render_prompt(s, tokenizer)))
    per_batch = max(1, batch_size // k)
    for first in range(0, len(ordered), per_batch):
        chunk = ordered[first : first + per_batch]
        for sample, text, length in _generate(model, tokenizer, chunk, k, max_new_tokens):
            correct[sample.uid].append(float(get_reward(sample.reward)(text, sample) == 1.0))
            num_tokens.append(length)
    mean_reward, pass_at_k = mean_and_pass_at_k(list(correct.values()))
    return EvalResult(
        mean_reward=mean_reward,
        pass_at_k=pass_at_k,
        k=k,
        num_prompts=len(samples),
        mean_response_tokens=sum(num_tokens) / len(num_tokens),
        seconds=time.perf_counter() - start,
    )


def mean_and_pass_at_k(correct_per_prompt: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(mean over all samples, share of prompts with at least one correct sample) of 0/1 outcomes."""
    outcomes = [c for per_prompt in correct_per_prompt for c in per_prompt]
    solved = sum(any(c == 1.0 for c in per_prompt) for per_prompt in correct_per_prompt)
    return sum(outcomes) / len(outcomes), solved / len(correct_per_prompt)


def _generate(
    model: Any, tokenizer: Any, samples: Sequence[TaskSample], k: int, max_new_tokens: int
) -> list[tuple[TaskSample, str, int]]:
    """k temperature-1 continuations of each sample's prompt: (sample, response text, response tokens).

    A response ends at the model's EOS or at the stop tokens its prompt's format adds (``PromptStops``: a chat
    template's end-of-turn token), as a rollout of the same prompt does; samples are generated in one batch per
    stop set, since ``generate`` stops every row of a batch at the same ids."""
    prompt_stops = PromptStops(tokenizer)
    by_stops: dict[tuple[int, ...], list[TaskSample]] = {}
    for sample in samples:
        by_stops.setdefault(prompt_stops(sample), []).append(sample)
    results = []
    for extra, group in by_stops.items():
        stops = list(dict.fromkeys((tokenizer.eos_token_id, *extra)))
        results += _sample(model, tokenizer, group, k, max_new_tokens, stops)
    return results


def _sample(
    model: Any, tokenizer: Any, samples: Sequence[TaskSample], k: int, max_new_tokens: int, stops: list[int]
) -> list[tuple[TaskSample, str, int]]:
    prompts = [render_prompt(s, tokenizer) for s in samples for _ in range(k)]
    encoded = tokenizer(
        prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    )
    output = model.generate(
        **encoded,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=max_new_tokens,
        eos_token_id=stops,
        pad_token_id=tokenizer.pad_token_id,
    )
    responses = output[:, encoded["input_ids"].shape[1] :]
    results = []
    for row, sample in enumerate(s for s in samples for _ in range(k)):
        ids = responses[row].tolist()
        length = next((i + 1 for i, token in enumerate(ids) if token in stops), len(ids))
        results.append((sample, tokenizer.decode(ids[:length], skip_special_tokens=True), length))
    return results


def run_sft(
    config: SFTConfig,
    log: Callable[[str], None] = print,
    command: str = "asyncrl sft",
    progress: Progress | None = None,
) -> tuple[EvalResult | None, float]:
    """Build tokenizer and model, train on the task's demonstrations, save, evaluate, and write a README that
    records ``command`` (how to reproduce) and the measurements; returns (eval result, training seconds)."""
    start = time.perf_counter()
    task = make_task(config.task)
    tokenizer = train_tokenizer(tokenizer_texts(config.seed), config.vocab_size)
    model = build_tiny_model(
        architecture=config.architecture,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        intermediate_size=config.intermediate_size,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        seed=config.seed,
    )
    num_params = sum(p.numel() for p in model.parameters())
    log(f"sft: {num_params / 1e6:.2f}M parameters, vocab {len(tokenizer)}")
    examples = encode_examples(tokenizer, task.split("train"))
    losses = train_steps(model, examples, config, tokenizer.pad_token_id, log, progress)
    if progress is not None:
        progress.close()
    train_seconds = time.perf_counter() - start
    log(f"sft: {len(losses)} steps in {train_seconds:.0f}s, final loss {losses[-1]:.4f}")
    save_tiny(model, tokenizer, Path(config.output_dir))
    result = _evaluate(model, tokenizer, task.split("eval"), config) if config.eval_prompts else None
    if result is not None:
        log(
            f"sft: held-out mean reward {result.mean_reward:.3f}, pass@{result.k} {result.pass_at_k:.3f} "
            f"({result.num_prompts} prompts, {result.mean_response_tokens:.1f} tokens/response, "
            f"{result.seconds:.0f}s)"
        )
    facts = {
        "parameters": f"{num_params / 1e6:.2f}M",
        "steps": len(losses),
        "final loss": f"{losses[-1]:.4f}",
    }
    write_readme(Path(config.output_dir), command, facts, train_seconds, result)
    return result, train_seconds


def _evaluate(model: Any, tokenizer: Any, held_out: Sequence[TaskSample], config: SFTConfig) -> EvalResult:
    return evaluate_by_sampling(
        model,
        tokenizer,
        list(held_out)[: config.eval_prompts],
        k=config.eval_samples_per_prompt,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
    )


def write_readme(
    out_dir: Path, command: str, facts: dict[str, Any], train_seconds: float, result: EvalResult | None
) -> None:
    """The checkpoint's README.md: how to reproduce it and what was measured when it was made."""
    lines = [
        f"# {out_dir.name}: warm-start checkpoint",
        "",
        "Made by the supervised warm start (`asyncrl/models/sft.py`). Reproduce it from the repository root:",
        "",
        "```",
        command,
        "```",
        "",
        f"- {', '.join(f'{k}: {v}' for k, v in facts.items())}",
        f"- training wall time: {train_seconds:.0f} s on the machine that made it (shared 2-core CPU)",
    ]
    if result is not None:
        lines.append(
            f"- held-out ({result.num_prompts} prompts, temperature-1 sampling, {result.k} samples each): "
            f"mean reward {result.mean_reward:.3f}, pass@{result.k} {result.pass_at_k:.3f}, "
            f"{result.mean_response_tokens:.1f} tokens per response"
        )
    lines += [
        "",
        "Numbers vary from run to run with thread scheduling (float summation order); "
        "`python scripts/check_headroom.py` re-measures mean reward and pass@k of this directory.",
        "",
    ]
    (out_dir / "README.md").write_text("\n".join(lines))
