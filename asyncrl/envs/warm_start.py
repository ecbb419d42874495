"""A warm start for Sokoban: supervised training on scripted (breadth-first optimal) episodes, multi-turn.

Key decision: each demonstration is a whole episode tokenised exactly as the EnvManager builds an agentic
context (observation ids, then the response ids and EOS, then the next observation ids, ...), with the loss on
the response tokens only, so turn t of a demonstration is token for token what the policy will see at turn t.
Training reuses the SFT loop (``asyncrl.models.sft.train_steps``), label smoothing included, so the warm start
is a partial solver and RL has headroom.

    python -m asyncrl.envs.warm_start --out runs/tiny-sokoban [--num-rooms 64 --steps 150]
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from asyncrl.config.env_kinds import SokobanConfig
from asyncrl.config.sft import SFTConfig
from asyncrl.envs.sokoban import generate_room, push, render, shortest_solution
from asyncrl.models.sft import IGNORE_INDEX, EncodedExample

DEMO_SEED_OFFSET = 1_000_003
"""Demonstration rooms use seeds from here on, away from the small seeds tests and examples print."""


def scripted_episode(config: SokobanConfig, seed: int) -> tuple[list[str], list[str]]:
    """(observations, responses) of an optimal episode: one observation before each response; responses are
    the one-letter moves (``" d"``)."""
    room, _ = generate_room(config, random.Random(seed))
    solution = shortest_solution(room)
    assert solution is not None, f"sokoban: generated room of seed {seed} has no solution"
    observations = []
    for move in solution:
        observations.append(render(room))
        room = push(room, move)
    return observations, [" " + move[0] for move in solution]  # the one-letter form: one token to learn


def encode_episode(tokenizer: Any, observations: list[str], responses: list[str]) -> EncodedExample:
    """The episode's context ids with labels on response tokens and their EOS (env tokens are unlabelled)."""
    input_ids: list[int] = []
    labels: list[int] = []
    for observation, response in zip(observations, responses, strict=True):
        observation_ids = tokenizer.encode(observation, add_special_tokens=False)
        response_ids = tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]
        input_ids += observation_ids + response_ids
        labels += [IGNORE_INDEX] * len(observation_ids) + response_ids
    return EncodedExample(input_ids=input_ids, labels=labels)


def warm_start(
    *, model_path: str, out_dir: str, sokoban: SokobanConfig, num_rooms: int, sft: SFTConfig
) -> list[float]:
    """Fine-tune ``model_path`` on ``num_rooms`` scripted episodes and save it to ``out_dir``; the losses."""
    from asyncrl.models.loading import load_model_and_tokenizer, save_tiny
    from asyncrl.models.sft import train_steps

    model, tokenizer = load_model_and_tokenizer(model_path, device="cpu")
    examples = [
        encode_episode(tokenizer, *scripted_episode(sokoban, DEMO_SEED_OFFSET + i)) for i in range(num_rooms)
    ]
    losses = train_steps(model, examples, sft, tokenizer.pad_token_id)
    save_tiny(model, tokenizer, out_dir)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description="Sokoban warm start on scripted episodes")
    parser.add_argument("--model", default="tiny-copy")
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-rooms", type=int, default=64)
    parser.add_argument("--num-pulls", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sft = SFTConfig(
        max_steps=args.steps,
        lr=args.lr,
        batch_size=16,
        warmup_steps=10,
        seed=args.seed,
        log_every=25,
        label_smoothing=0.1,
    )
    sokoban = SokobanConfig(num_pulls=args.num_pulls)
    losses = warm_start(
        model_path=args.model, out_dir=args.out, sokoban=sokoban, num_rooms=args.num_rooms, sft=sft
    )
    print(f"warm start: {len(losses)} steps, final loss {losses[-1]:.4f}, saved to {args.out}")


if __name__ == "__main__":
    main()
