"""A FrozenLake agent harness written only against the ``openai`` client, for an asyncrl run's endpoint.

Start the run (``asyncrl train asyncrl/examples/agents/frozen_lake.yaml``), then this harness
(``python asyncrl/examples/agents/frozen_lake_harness.py runs/frozen_lake``). It plays groups of episodes on the
run's endpoint: every member of a group plays the same map (the GRPO group), each episode is one trajectory
named in the URL, and the episode's return is posted to ``/trajectories/ID/finish``. The run trains on these
trajectories while the harness keeps playing; it stops when the run stops answering.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import openai

from asyncrl.envs.frozen_lake import FrozenLakeEnv


async def play_episode(client: openai.AsyncOpenAI, env: FrozenLakeEnv, seed: int, max_turns: int) -> float:
    observation, _ = await env.reset(seed)
    messages: list[dict] = []
    total = 0.0
    for _ in range(max_turns):
        messages.append({"role": "user", "content": observation})
        answer = await client.chat.completions.create(model="asyncrl-policy", messages=messages, max_tokens=4)
        reply = answer.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        result = await env.step(reply.content or "")
        total += result.reward
        observation = result.observation
        if result.terminated or result.truncated:
            break
    return total


async def play_group(root: str, group: int, size: int, lake: int, max_turns: int) -> list[float]:
    """``size`` episodes of map ``group``, concurrently, each posted with its return."""

    async def member(index: int) -> float:
        name = f"g{group}-{index}"
        client = openai.AsyncOpenAI(base_url=f"{root}/groups/g{group}/trajectories/{name}/v1", api_key="-")
        reward = await play_episode(client, FrozenLakeEnv(lake), group, max_turns)
        control = openai.AsyncOpenAI(base_url=root, api_key="-")
        await control.post(f"/trajectories/{name}/finish", body={"reward": reward}, cast_to=object)
        return reward

    return list(await asyncio.gather(*(member(i) for i in range(size))))


async def main(run_dir: Path, group_size: int, concurrent_groups: int, lake: int, max_turns: int) -> int:
    endpoint = run_dir / "endpoint.json"
    while not endpoint.exists():
        time.sleep(0.1)
    root = json.loads(endpoint.read_text())["url"].removesuffix("/v1")
    next_group, returns = 0, []
    try:
        while True:
            groups = range(next_group, next_group + concurrent_groups)
            next_group += concurrent_groups
            results = await asyncio.gather(
                *(play_group(root, g, group_size, lake, max_turns) for g in groups)
            )
            returns += [r for group in results for r in group]
            recent = returns[-64:]
            print(
                f"episodes {len(returns)}  mean return (last {len(recent)}) {sum(recent) / len(recent):.3f}",
                flush=True,
            )
    except (openai.APIConnectionError, openai.APIStatusError):
        print("the run stopped serving", file=sys.stderr)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path, help="the run's output_dir (it writes endpoint.json there)")
    parser.add_argument("--group-size", type=int, default=8, help="= the run's rollout.num_return_sequences")
    parser.add_argument(
        "--concurrent-groups",
        type=int,
        default=8,
        help="groups in play at once (2 x the run's rollout_batch_size keeps its buffer fed while it trains)",
    )
    parser.add_argument("--lake", type=int, default=4, choices=(4, 8))
    parser.add_argument("--max-turns", type=int, default=8)
    args = parser.parse_args()
    sys.exit(
        asyncio.run(main(args.run_dir, args.group_size, args.concurrent_groups, args.lake, args.max_turns))
    )
