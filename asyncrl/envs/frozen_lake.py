"""``frozen_lake``: a text FrozenLake on random solvable maps (4×4, 8×8), one move per model turn.

The map is drawn from the seed: holes placed at random with ``hole_fraction``, redrawn until a path from the
start (top left) to the goal (bottom right) exists, so every episode can be won. Moves are deterministic (no
slippery ice). An observation is the map with the player as ``P`` and the question ``move (L D R U):``; the
action is read from the response's first letter among L, D, R, U (case-insensitive). Reaching the goal earns
1 and ends the episode; stepping into a hole ends it with 0; an unreadable action leaves the player in place.

Key decision: the observation is the whole map every turn (small: 4×4 is 20 characters), so the policy needs
no memory of earlier turns and a tiny model can learn it; ``solve`` gives the shortest path for warm starts.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from asyncrl.envs.base import EnvError, StepResult

MOVES = {"L": (0, -1), "D": (1, 0), "R": (0, 1), "U": (-1, 0)}
QUESTION = "move (L D R U):"


def random_map(size: int, seed: int, hole_fraction: float = 0.2) -> list[str]:
    """A ``size``×``size`` map (rows of S start, F ice, H hole, G goal) with a path from S to G."""
    if size < 2:
        raise ValueError(f"frozen_lake: size must be >= 2, got {size}")
    if not 0 <= hole_fraction < 1:
        raise ValueError(f"frozen_lake: hole_fraction must be in [0, 1), got {hole_fraction}")
    rng = random.Random(seed)
    while True:
        cells = [["H" if rng.random() < hole_fraction else "F" for _ in range(size)] for _ in range(size)]
        cells[0][0], cells[-1][-1] = "S", "G"
        rows = ["".join(row) for row in cells]
        if solve(rows) is not None:
            return rows


def solve(rows: list[str]) -> str | None:
    """The shortest move string (e.g. ``"RRDD"``) from S to G avoiding holes, or None if there is none."""
    size = len(rows)
    previous: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {(0, 0): None}
    queue = deque([(0, 0)])
    while queue:
        cell = queue.popleft()
        if rows[cell[0]][cell[1]] == "G":
            path = []
            while previous[cell] is not None:
                cell, move = previous[cell]  # type: ignore[misc]
                path.append(move)
            return "".join(reversed(path))
        for move, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if (
                0 <= nxt[0] < size
                and 0 <= nxt[1] < size
                and nxt not in previous
                and rows[nxt[0]][nxt[1]] != "H"
            ):
                previous[nxt] = (cell, move)
                queue.append(nxt)
    return None


def render(rows: list[str], position: tuple[int, int]) -> str:
    """The observation: the map with the player as P, then the question."""
    lines = [
        "".join("P" if (r, c) == position else ch for c, ch in enumerate(row)) for r, row in enumerate(rows)
    ]
    return "\n".join(lines) + "\n" + QUESTION


def parse_move(action: str) -> str | None:
    """The first of L, D, R, U in the response (case-insensitive), or None."""
    return next((ch for ch in action.upper() if ch in MOVES), None)


class FrozenLakeEnv:
    """One FrozenLake episode per ``reset``; ``step`` after the end raises ``EnvError``."""

    def __init__(self, size: int = 4, hole_fraction: float = 0.2) -> None:
        self.size = size
        self.hole_fraction = hole_fraction
        self.rows: list[str] = []
        self.position = (0, 0)
        self.done = True

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.rows = random_map(self.size, seed, self.hole_fraction)
        self.position, self.done = (0, 0), False
        return render(self.rows, self.position), {"map": self.rows, "shortest": len(solve(self.rows) or "")}

    async def step(self, action: str) -> StepResult:
        if self.done:
            raise EnvError("frozen_lake: step() called on a finished episode (reset first)")
        move = parse_move(action)
        if move is not None:
            dr, dc = MOVES[move]
            r, c = self.position[0] + dr, self.position[1] + dc
            if 0 <= r < self.size and 0 <= c < self.size:
                self.position = (r, c)
        cell = self.rows[self.position[0]][self.position[1]]
        self.done = cell in "HG"
        reward = 1.0 if cell == "G" else 0.0
        return StepResult(
            render(self.rows, self.position), reward, self.done, False, {"move": move, "cell": cell}
        )


def make_4x4(config: object = None) -> FrozenLakeEnv:
    """Factory for ``env.type: asyncrl.envs.frozen_lake:make_4x4``."""
    return FrozenLakeEnv(4)


def make_8x8(config: object = None) -> FrozenLakeEnv:
    """Factory for ``env.type: asyncrl.envs.frozen_lake:make_8x8``."""
    return FrozenLakeEnv(8, hole_fraction=0.15)
