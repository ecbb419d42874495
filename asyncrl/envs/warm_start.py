"""A warm start for Sokoban or FrozenLake: supervised training on scripted (shortest-path) episodes, multi-turn.

Key decision: each demonstration is a whole episode tokenised exactly as the EnvManager builds an agentic
context (observation ids, then the response ids and EOS, then the next observation ids, ...), with the loss on
the response tokens only, so turn t of a demonstration is token for token what the policy will see at turn t.
Training reuses the SFT loop (``asyncrl.models.sft.train_steps``), label smoothing included, so the warm start
is a partial solver and RL has headroom.

    python -m asyncrl.envs.warm_start --out runs/tiny-sokoban [--num-rooms 64 --steps 150]
    python -m asyncrl.envs.warm_start --env frozen_lake --out runs/tiny-frozen-lake [--size 4]
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from typing import Any

from asyncrl.config.env_kinds import SokobanConfig
from asyncrl.config.sft import SFTConfig
from asyncrl.envs import frozen_lake
from asyncrl.envs.sokoban import generate_room, push, render, shortest_solution
from asyncrl.models.sft import IGNORE_INDEX, EncodedExample

Episode = tuple[list[str], list[str]]
"""(observations, responses): one observation before each response."""

DEMO_SEED_OFFSET = 1_000_003
"""Demonstration rooms use seeds from here on, away from the small seeds tests and examples print."""


def scripted_episode(config: SokobanConfig, seed: int) -> Episode:
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


def frozen_lake_episode(size: int, seed: int, hole_fraction: float = 0.2) -> Episode:
    """(observations, responses) of a shortest path on the map of ``seed`` (``FrozenLakeEnv(size)``'s maps by
    default); responses are one letter (``" R"``), which ``frozen_lake.parse_move`` reads as the move."""
    rows = frozen_lake.random_map(size, seed, hole_fraction)
    path = frozen_lake.solve(rows)
    assert path is not None, f"frozen_lake: map of seed {seed} has no path"
    observations, position = [], (0, 0)
    for move in path:
        observations.append(frozen_lake.render(rows, position))
        dr, dc = frozen_lake.MOVES[move]
        position = (position[0] + dr, position[1] + dc)
    return observations, [" " + move for move in path]


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
    *, model_path: str, out_dir: str, episode: Callable[[int], Episode], num_rooms: int, sft: SFTConfig
) -> list[float]:
    """Fine-tune ``model_path`` on ``num_rooms`` scripted episodes (``episode(seed)``, seeds from
    ``DEMO_SEED_OFFSET``) and save it to ``out_dir``; the losses."""
    from asyncrl.models.loading import load_model_and_tokenizer, save_tiny
    from asyncrl.models.sft import train_steps

    model, tokenizer = load_model_and_tokenizer(model_path, device="cpu")
    examples = [encode_episode(tokenizer, *episode(DEMO_SEED_OFFSET + i)) for i in range(num_rooms)]
    losses = train_steps(model, examples, sft, tokenizer.pad_token_id)
    save_tiny(model, tokenizer, out_dir)
    return losses


def episode_maker(args: argparse.Namespace) -> Callable[[int], Episode]:
    """The scripted episodes of the env the command line names."""
    if args.env == "frozen_lake":
        return lambda seed: frozen_lake_episode(args.size, seed)
    sokoban = SokobanConfig(num_pulls=args.num_pulls)
    return lambda seed: scripted_episode(sokoban, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description="Sokoban or FrozenLake warm start on scripted episodes")
    parser.add_argument("--env", choices=("sokoban", "frozen_lake"), default="sokoban")
    parser.add_argument("--model", default="tiny-copy")
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-rooms", type=int, default=64)
    parser.add_argument("--num-pulls", type=int, default=2, help="sokoban: pulls from solved")
    parser.add_argument("--size", type=int, default=4, help="frozen_lake: the map's side (4 or 8)")
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
    losses = warm_start(
        model_path=args.model,
        out_dir=args.out,
        episode=episode_maker(args),
        num_rooms=args.num_rooms,
        sft=sft,
    )
    print(f"warm start: {len(losses)} steps, final loss {losses[-1]:.4f}, saved to {args.out}")


if __name__ == "__main__":
    main()
