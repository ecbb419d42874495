"""Buffered groups survive a checkpoint as JSON with everything training reads, token rewards included."""

from asyncrl.buffer.persist import groups_from_data, groups_to_data
from asyncrl.types import Group, Trajectory


def trajectory(index: int, token_rewards: list[float] | None) -> Trajectory:
    return Trajectory(
        prompt_uid="p",
        sample_index=index,
        token_ids=[5, 6, 7],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.25, -1.5],
        versions=[-1, 3, 4],
        start_version=3,
        num_prompt_tokens=1,
        reward=0.75,
        token_rewards=token_rewards,
    )


def test_token_rewards_round_trip_and_none_stays_none():
    group = Group(prompt_uid="p", trajectories=[trajectory(0, [0.0, 0.25, 0.5]), trajectory(1, None)])
    ((start, restored),) = groups_from_data(groups_to_data([(3, group)]))
    assert start == 3
    assert [t.token_rewards for t in restored.trajectories] == [[0.0, 0.25, 0.5], None]
    assert restored.trajectories[0] == group.trajectories[0]


def test_a_checkpoint_written_before_token_rewards_still_loads():
    data = groups_to_data([(0, Group(prompt_uid="p", trajectories=[trajectory(0, None)]))])
    del data[0]["group"]["trajectories"][0]["token_rewards"]
    ((_, restored),) = groups_from_data(data)
    assert restored.trajectories[0].token_rewards is None
