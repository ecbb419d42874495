"""FrozenLake: maps are solvable and seeded, moves and ends are exact, the shortest path wins."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.envs.base import EnvError
from asyncrl.envs.frozen_lake import FrozenLakeEnv, parse_move, random_map, render, solve


@pytest.mark.parametrize("size", [4, 8])
def test_maps_are_seeded_and_always_solvable(size: int) -> None:
    for seed in range(50):
        rows = random_map(size, seed)
        assert rows == random_map(size, seed)
        assert len(rows) == size and all(len(r) == size for r in rows)
        assert rows[0][0] == "S" and rows[-1][-1] == "G"
        assert solve(rows) is not None


def test_solve_is_shortest_and_avoids_holes() -> None:
    assert solve(["SF", "FG"]) in ("RD", "DR")
    assert solve(["SH", "FG"]) == "DR"
    assert solve(["SH", "HG"]) is None


def test_parse_and_render() -> None:
    assert parse_move("  d then r") == "D" and parse_move("xyz") is None
    assert render(["SF", "FG"], (1, 0)) == "SF\nPG\nmove (L D R U):"


@pytest.mark.parametrize("size", [4, 8])
def test_following_the_solution_wins_and_a_hole_loses(size: int) -> None:
    async def play() -> None:
        env = FrozenLakeEnv(size)
        observation, info = await env.reset(7)
        assert observation.startswith("P")
        path = solve(info["map"])
        for i, move in enumerate(path):
            result = await env.step(move.lower() + " because")
            assert result.terminated == (i == len(path) - 1)
        assert result.reward == 1.0 and result.info["cell"] == "G"
        with pytest.raises(EnvError):
            await env.step("R")
        env.rows, env.position, env.done = ["SH", "FG"], (0, 0), False
        lost = await env.step("R")
        assert lost.terminated and lost.reward == 0.0 and lost.info["cell"] == "H"
        env.rows, env.position, env.done = ["SH", "FG"], (0, 0), False
        stay = await env.step("nonsense")
        assert not stay.terminated and env.position == (0, 0) and stay.info["move"] is None

    asyncio.run(play())
