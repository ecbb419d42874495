"""Sokoban: exact transitions on hand-made rooms, action parsing, and solvability of generated rooms."""

from __future__ import annotations

import asyncio
import random

import pytest

from asyncrl.config.env import EnvConfig
from asyncrl.config.env_kinds import SokobanConfig
from asyncrl.envs import make_env
from asyncrl.envs.sokoban import (
    SokobanEnv,
    generate_room,
    parse_action,
    parse_room,
    pull,
    push,
    render,
    shortest_solution,
)

ROOM = """\
######
#_@__#
#_$__#
#_.__#
#____#
######"""


def rows(room_text: str) -> str:
    return room_text + "\nmove:"


def play(env: SokobanEnv, action: str):
    return asyncio.run(env.step(action))


def env_on(text: str, **overrides) -> SokobanEnv:
    env = SokobanEnv(EnvConfig(type="sokoban", sokoban=SokobanConfig(**overrides)))
    env.room = parse_room(text)
    return env


def test_render_round_trips_and_marks_targets() -> None:
    room = parse_room(ROOM)
    assert render(room) == rows(ROOM)
    assert room.player == (1, 2) and room.boxes == {(2, 2)} and room.targets == {(3, 2)}


def test_push_onto_target_solves_with_exact_reward() -> None:
    env = env_on(ROOM, step_penalty=0.01)
    result = play(env, "down")
    assert result.terminated and not result.truncated
    assert result.reward == pytest.approx(0.99)
    assert result.observation == ""
    assert env.room.boxes == {(3, 2)} and env.room.player == (2, 2)


def test_walk_and_blocked_moves_are_exact() -> None:
    env = env_on(ROOM)
    result = play(env, " Left\n")
    assert result.reward == 0.0 and not result.terminated and result.info["moved"]
    assert result.observation == rows("######\n#@___#\n#_$__#\n#_.__#\n#____#\n######")
    assert not play(env, "left").info["moved"]  # into the wall: nothing changes
    assert not play(env, "U").info["moved"]  # the one-letter form


def test_box_against_box_or_wall_does_not_move() -> None:
    room = parse_room("######\n#@$$_#\n#____#\n#__..#\n#____#\n######")
    assert push(room, "right") == room
    wall = parse_room("#####\n#@$.#\n#####\n#####\n#####")
    assert push(wall, "right").boxes == {(1, 3)}  # onto the target, against the wall next
    assert push(push(wall, "right"), "right") == push(wall, "right")


@pytest.mark.parametrize("bad", ["", "go up", "upp", "north", "up down", "1"])
def test_bad_actions_cost_the_penalty_and_change_nothing(bad: str) -> None:
    env = env_on(ROOM, invalid_action_penalty=0.25)
    before = env.room
    result = play(env, bad)
    assert result.reward == -0.25 and not result.terminated and result.info["invalid"]
    assert env.room == before
    assert result.observation.startswith("invalid action") and result.observation.endswith(rows(ROOM))
    assert parse_action(bad) is None


def test_pull_is_undone_by_the_opposite_push() -> None:
    room = parse_room(ROOM)
    pulled = pull(parse_room("######\n#____#\n#_@__#\n#_*__#\n#____#\n######"), "up")
    assert pulled is not None and pulled.boxes == {(2, 2)} and pulled.player == (1, 2)
    assert push(pulled, "down").solved
    assert pull(room, "left") is None  # no box behind the player


@pytest.mark.parametrize(
    ("config", "max_moves"),
    [
        (SokobanConfig(size=6, num_boxes=1, num_pulls=2), 20),
        (SokobanConfig(size=6, num_boxes=1, num_pulls=6, num_inner_walls=2), 30),
        (SokobanConfig(size=8, num_boxes=2, num_pulls=8, num_inner_walls=4), 40),
    ],
)
def test_generated_rooms_are_unsolved_and_solvable(config: SokobanConfig, max_moves: int) -> None:
    for seed in range(25):
        room, solution = generate_room(config, random.Random(seed))
        assert not room.solved and len(room.boxes) == config.num_boxes and room.size == config.size
        replayed = room
        for move in solution:
            replayed = push(replayed, move)
        assert replayed.solved, f"seed {seed}: the reversed pulls do not solve the room"
        best = shortest_solution(room, max_moves)
        assert best is not None and 1 <= len(best) <= len(solution), f"seed {seed}"


def test_shortest_solution_is_optimal_on_a_hand_room() -> None:
    assert shortest_solution(parse_room(ROOM)) == ["down"]
    detour = parse_room("######\n#____#\n#_$@_#\n#_.__#\n#____#\n######")
    assert shortest_solution(detour) == ["up", "left", "down"]
    stuck = parse_room("#####\n#$@.#\n#####\n#####\n#####")
    assert shortest_solution(stuck, 10) is None


def test_reset_is_a_pure_function_of_the_seed() -> None:
    config = EnvConfig(type="sokoban")
    first, second = make_env(config), make_env(config)
    (obs_a, info_a), (obs_b, _) = asyncio.run(first.reset(7)), asyncio.run(second.reset(7))
    assert obs_a == obs_b and obs_a.endswith("\nmove:")
    for move in info_a["solution"]:
        result = asyncio.run(first.step(move))
    assert result.terminated and result.reward == 1.0


FAR_ONE = """\
######
#_@__#
#_$__#
#____#
#_.__#
######"""


def test_distance_shaping_pays_each_push_toward_a_target_on_its_own_turn() -> None:
    env = env_on(FAR_ONE, distance_shaping=0.5, step_penalty=0.1)
    walk = play(env, "left")  # the player moves, the box does not: no shaping
    assert walk.reward == pytest.approx(-0.1) and walk.info["shaping"] == 0.0
    play(env, "right")
    closer = play(env, "down")  # box (2,2) -> (3,2): one cell nearer its target
    assert closer.reward == pytest.approx(0.5 - 0.1) and not closer.terminated
    solved = play(env, "down")  # onto the target: reward_solved plus the last step of shaping
    assert solved.terminated and solved.reward == pytest.approx(1.0 + 0.5 - 0.1)


def test_distance_shaping_charges_a_push_away_from_the_target() -> None:
    env = env_on("######\n#_.__#\n#____#\n#_$@_#\n#____#\n######", distance_shaping=0.25)
    result = play(env, "left")  # box (3,2) -> (3,1): one cell further from the target (1,2)
    assert result.reward == pytest.approx(-0.25) and result.info["shaping"] == pytest.approx(-0.25)
