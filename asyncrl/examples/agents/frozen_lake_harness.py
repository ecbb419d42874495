"""A FrozenLake agent harness written only against the ``openai`` client, for an asyncrl run's endpoint.

Start the run (``asyncrl train asyncrl/examples/agents/frozen_lake.yaml``), then this harness
(``python asyncrl/examples/agents/frozen_lake_harness.py runs/frozen_lake``). It plays groups of episodes on the
run's endpoint: every member of a group plays the same map (the GRPO group), each episode is one trajectory
named in the URL, and the episode's return is posted to ``/trajectories/ID/finish``. The run trains on these
trajectories while the harness keeps playing.

It outlives a trainer restart: when the run stops answering (the restart rebuilds it, on the same port) or
refuses a trajectory with 409 ``run_restarted`` (the restarted run holds none of its tokens), the harness
reads ``endpoint.json`` again until the endpoint answers, within ``--reconnect-timeout``, and plays the group
over under a new name. It stops when the run ends (the run removes ``endpoint.json``), and fails, naming the
deadline, when the endpoint does not come back in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
from pathlib import Path

import openai

from asyncrl.envs.frozen_lake import FrozenLakeEnv

RESTARTED = "run_restarted"
"""The ``code`` of the endpoint's 409 for a trajectory begun before the run restarted."""
POLL_S = 0.5
"""How often ``endpoint.json`` and the endpoint's ``/health`` are tried while waiting for the run."""


class RunEnded(Exception):
    """The run removed ``endpoint.json``: it will not serve again."""


class EndpointGone(TimeoutError):
    """The endpoint did not answer again within the harness's deadline."""


class Endpoint:
    """The run's endpoint as ``endpoint.json`` names it, read again whenever the run stops answering."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "endpoint.json"
        self.root = ""
        self.served = False
        """Whether the endpoint has answered once (before that, a missing file means not started yet)."""

    async def connect(self, timeout_s: float) -> str:
        """The endpoint's root URL once ``/health`` answers on it; ``RunEnded`` if the file went away after
        the run served, ``EndpointGone`` past ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self.path.exists():
                self.root = json.loads(self.path.read_text())["url"].removesuffix("/v1")
                probe = openai.AsyncOpenAI(base_url=self.root, api_key="-", max_retries=0, timeout=POLL_S * 4)
                async with probe:
                    try:
                        await probe.get("/health", cast_to=object)
                        self.served = True
                        return self.root
                    except openai.APIError:
                        pass  # not serving yet (a restart rebuilds the run), or stopped: look again
            elif self.served:
                raise RunEnded
            await asyncio.sleep(POLL_S)
        raise EndpointGone(f"the run's endpoint ({self.path}) did not answer within {timeout_s:g} s")


def starts_over(error: openai.APIError) -> bool:
    """Whether ``error`` means the group cannot go on and is played again once the endpoint answers: the
    run stopped answering or is overloaded, or it restarted and refuses the trajectory (409 run_restarted)."""
    if isinstance(error, openai.APIConnectionError | openai.InternalServerError | openai.RateLimitError):
        return True
    return isinstance(error, openai.ConflictError) and error.code == RESTARTED


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


async def play_group_once(
    root: str, name: str, group: int, size: int, lake: int, max_turns: int
) -> list[float]:
    """``size`` episodes of map ``group`` as group ``name``, concurrently, each posted with its return. If one
    fails, the others stop and every member is aborted (best effort), so the run releases the group at once
    rather than after ``serve.trajectory_timeout_s``."""
    control = openai.AsyncOpenAI(base_url=root, api_key="-")

    async def member(index: int) -> float:
        trajectory = f"{name}-{index}"
        client = openai.AsyncOpenAI(
            base_url=f"{root}/groups/{name}/trajectories/{trajectory}/v1", api_key="-"
        )
        reward = await play_episode(client, FrozenLakeEnv(lake), group, max_turns)
        await control.post(f"/trajectories/{trajectory}/finish", body={"reward": reward}, cast_to=object)
        return reward

    members = [asyncio.ensure_future(member(i)) for i in range(size)]
    try:
        return list(await asyncio.gather(*members))
    except openai.APIError:
        for task in members:
            task.cancel()
        await asyncio.gather(*members, return_exceptions=True)
        aborts = (
            control.with_options(max_retries=0).post(
                f"/trajectories/{name}-{i}/abort",
                body={"reason": "the harness starts the group over"},
                cast_to=object,
            )
            for i in range(size)
        )
        # a restarted or stopped run refuses them: it holds nothing of the group
        await asyncio.gather(*aborts, return_exceptions=True)
        raise


async def play_group(
    endpoint: Endpoint, session: str, group: int, size: int, lake: int, max_turns: int, reconnect_s: float
) -> list[float]:
    """Group ``group`` played to its end, over again under a new name each time the run restarts."""
    attempt = 0
    while True:
        name = f"{session}-g{group}" + (f"-r{attempt}" if attempt else "")
        try:
            return await play_group_once(endpoint.root, name, group, size, lake, max_turns)
        except openai.APIError as error:
            if not starts_over(error):
                raise
            print(f"group {name}: {type(error).__name__}; waiting for the run to play it again", flush=True)
        await asyncio.sleep(POLL_S)  # a stopping attempt may still answer for a moment
        await endpoint.connect(reconnect_s)
        attempt += 1


async def main(
    run_dir: Path,
    group_size: int,
    concurrent_groups: int,
    lake: int,
    max_turns: int,
    start_timeout_s: float = 1800.0,
    reconnect_timeout_s: float = 600.0,
) -> int:
    """Play until the run ends (0), or the endpoint does not answer within a deadline (1)."""
    endpoint = Endpoint(run_dir)
    session = secrets.token_hex(3)  # names no earlier harness (or earlier attempt of this one) used
    next_group, returns = 0, []
    try:
        await endpoint.connect(start_timeout_s)
        while True:
            groups = range(next_group, next_group + concurrent_groups)
            next_group += concurrent_groups
            results = await asyncio.gather(
                *(
                    play_group(endpoint, session, g, group_size, lake, max_turns, reconnect_timeout_s)
                    for g in groups
                )
            )
            returns += [r for group in results for r in group]
            recent = returns[-64:]
            print(
                f"episodes {len(returns)}  mean return (last {len(recent)}) {sum(recent) / len(recent):.3f}",
                flush=True,
            )
    except RunEnded:
        print("the run ended", file=sys.stderr)
        return 0
    except EndpointGone as error:
        print(error, file=sys.stderr)
        return 1


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
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=1800.0,
        help="seconds to wait for the run's endpoint to first answer",
    )
    parser.add_argument(
        "--reconnect-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the endpoint to answer again (a trainer restart rebuilds the run)",
    )
    args = parser.parse_args()
    sys.exit(
        asyncio.run(
            main(
                args.run_dir,
                args.group_size,
                args.concurrent_groups,
                args.lake,
                args.max_turns,
                args.start_timeout,
                args.reconnect_timeout,
            )
        )
    )
