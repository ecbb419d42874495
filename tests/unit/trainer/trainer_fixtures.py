"""Shared helpers of the trainer tests: a tiny random Qwen2 and hand-built groups (import by module name)."""

from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from asyncrl.types import Group, Trajectory  # noqa: E402

VOCAB = 300


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    """A 2-layer, hidden-64 Qwen2 with tied embeddings and random weights (float32, CPU)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).eval()


def make_trajectory(
    prompt: list[int], response: list[int], *, reward: float, uid: str = "p", index: int = 0, version: int = 0
) -> Trajectory:
    """A trajectory whose response tokens carry behaviour log-prob -1.0 and ``version``."""
    n_prompt, n_response = len(prompt), len(response)
    return Trajectory(
        prompt_uid=uid,
        sample_index=index,
        token_ids=prompt + response,
        loss_mask=[0] * n_prompt + [1] * n_response,
        logprobs=[0.0] * n_prompt + [-1.0] * n_response,
        versions=[-1] * n_prompt + [version] * n_response,
        start_version=version,
        num_prompt_tokens=n_prompt,
        reward=reward,
    )


def random_groups(num_groups: int = 3, group_size: int = 4, seed: int = 0) -> list[Group]:
    """Groups of varied lengths (prompts 3-6 tokens, responses 1-12) and 0/1 rewards, deterministic in seed."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(num_groups):
        prompt = torch.randint(
            0, VOCAB, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen
        ).tolist()
        trajectories = []
        for i in range(group_size):
            length = int(torch.randint(1, 13, (1,), generator=gen))
            response = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
            reward = float(torch.randint(0, 2, (1,), generator=gen))
            trajectories.append(make_trajectory(prompt, response, reward=reward, uid=f"g{g}", index=i))
        groups.append(Group(prompt_uid=f"g{g}", trajectories=trajectories))
    return groups


def with_model_logprobs(
    groups: list[Group], model: torch.nn.Module, noise: float = 0.0, seed: int = 0
) -> list[Group]:
    """Give every response token the model's own log-prob (plus uniform noise in ±noise) as behaviour log-prob,
    as an engine serving these weights would report it."""
    from asyncrl.trainer.batching import build_train_batch
    from asyncrl.trainer.logprobs import compute_token_logprobs

    gen = torch.Generator().manual_seed(seed)
    num_samples = sum(len(g) for g in groups)
    batch = build_train_batch(groups, [0.0] * num_samples)
    with torch.no_grad():
        logprobs = compute_token_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.loss_mask, chunk_size=64
        ).logprobs
    logprobs = logprobs + noise * (2 * torch.rand(logprobs.shape, generator=gen) - 1) * batch.loss_mask
    row = 0
    for group in groups:
        for trajectory in group.trajectories:
            trajectory.logprobs = logprobs[row, : len(trajectory.token_ids)].tolist()
            row += 1
    return groups
